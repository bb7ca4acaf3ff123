"""The dialog engine's shared core: its state, lookups, commits and helpers (SPEC §4, §5).

Owns what every part of the engine uses: the databases of the instance and their
lookups, committing units of work (:meth:`EngineCore.commit`, :meth:`EngineCore.apply`),
the router, the :class:`~brokerd.dialogs.transmission.transmission.Transmission` and the
:class:`~brokerd.dialogs.endpoints.deadlines.Deadlines`, messages this broker queues for an
endpoint's own side (broker errors, DialogTimer), dropped messages, and the trace
events of a dialog's life. The parts built on it: ``verbs`` (the application's
verbs) and ``receiving`` (what arrives from links); ``engine`` joins them.

May import: ``protocol``, ``brokerd.storage``, ``brokerd.routing``, ``brokerd.traces``,
``brokerd.config``, ``brokerd.errors`` and the models of ``brokerd.dialogs``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any
from xml.sax.saxutils import escape

from brokerd.config import BrokerConfig
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.deadlines import Deadlines
from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage, endpoint_snapshot
from brokerd.dialogs.endpoints.ready import Rank, ReadyIndex, rank_of
from brokerd.dialogs.endpoints.states import DELIVERING, State
from brokerd.dialogs.endpoints.stats import EngineStats
from brokerd.dialogs.endpoints.work import Work
from brokerd.dialogs.router.router import Router
from brokerd.dialogs.transmission.links import Link, LinkProvider
from brokerd.dialogs.transmission.local_link import LocalLink
from brokerd.dialogs.transmission.transmission import Transmission
from brokerd.errors import (
    ConversationNotFound,
    DatabaseNotFound,
    DialogError,
    NotPrincipal,
    QueueNotFound,
    ServiceNotFound,
    StoreError,
)
from brokerd.storage import queries
from brokerd.storage.catalog import ROUTE_REQUESTER_SERVICE
from brokerd.storage.queries import Statement
from brokerd.traces.writer import TraceWriter
from protocol.dialog import (
    ERROR,
    DialogHeader,
)

log = logging.getLogger("brokerd.dialogs.engine")

ERROR_NS = "http://schemas.microsoft.com/SQL/ServiceBroker/Error"
CODE_SERVICE_NOT_FOUND = -8425
CODE_CONTRACT_NOT_SUPPORTED = -8408
CODE_MESSAGE_TYPE_REFUSED = -8457
CODE_LIFETIME_EXPIRED = -8489
CODE_VALIDATION_FAILED = -9615
CODE_MESSAGE_TOO_LARGE = -9617
CODE_DIALOG_SECURITY = -28000
"""The target cannot take a dialog under dialog security (R-DLG-14): brokerd's own code."""


def error_body(code: int, description: str) -> bytes:
    """The XML body of an Error message (SPEC §6)."""
    return (
        f'<?xml version="1.0"?><Error xmlns="{ERROR_NS}"><Code>{code}</Code>'
        f"<Description>{escape(description)}</Description></Error>"
    ).encode()


class EngineCore:
    def __init__(
        self,
        config: BrokerConfig,
        databases: dict[str, Database],
        links: LinkProvider,
        clock: Callable[[], float] = time.time,
        trace: TraceWriter | None = None,
    ) -> None:
        self.config = config
        self.trace = trace or TraceWriter(replace(config.trace, enabled=False), "")
        self.retry = config.retry
        self.fragment_size = config.limits.fragment_size
        self.max_message_size = config.limits.max_message_size
        self.databases = databases
        self.msdb = databases["msdb"]
        self.links = links
        self.clock = clock
        self.stats = EngineStats()
        self.by_instance: dict[uuid.UUID, Database] = {}
        self.deadlines = Deadlines()
        # Made by the finished engine, which has every method they call back:
        self.local_link: LocalLink
        self.router: Router
        self.transmission: Transmission
        self._ticker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drop_logged_at = -math.inf
        self._drops_not_logged = 0

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "engine not started"
        return self._loop

    def database(self, name: str) -> Database:
        db = self.databases.get(name)
        if db is None:
            raise DatabaseNotFound(f"database {name!r} does not exist on this broker")
        return db

    def endpoint(self, handle: uuid.UUID) -> tuple[Database, Endpoint]:
        for db in self.databases.values():
            ep = db.endpoints.get(handle)
            if ep is not None:
                return db, ep
        mirrors = [db.name for db in self.databases.values() if db.mirror_role == "mirror"]
        if mirrors:  # R-ROUTE-15: a mirror keeps no image of its conversations
            raise NotPrincipal(
                f"conversation handle {handle} is not known here, and this broker is the "
                f"mirror partner of {', '.join(repr(n) for n in mirrors)}: use the principal"
            )
        raise ConversationNotFound(f"conversation handle {handle} does not exist on this broker")

    def database_of_service(self, service: str) -> Database:
        found = [db for db in self.databases.values() if service in db.catalog.services]
        if not found:
            raise ServiceNotFound(f"service {service!r} does not exist on this broker")
        if len(found) > 1:
            raise DialogError(
                f"service {service!r} exists in several databases "
                f"({', '.join(db.name for db in found)}); name the database"
            )
        return found[0]

    def submit(self, db: Database, work: Work) -> asyncio.Future[Any]:
        """Queue ``work`` for the next group commit now, before anything else runs on the
        loop: its endpoint snapshots were taken now, and a snapshot queued after a newer
        one of the same endpoint would write back an older ``receive_sequence``."""
        future = db.store.submit(
            work.statements,
            on_commit=work.committed,
            on_failure=work.failed,
            wait=True,
            chains=work.chains,
        )
        assert future is not None
        return future

    async def commit(self, db: Database, work: Work) -> None:
        """Make ``work`` durable in one SQLite transaction; its callbacks run after it."""
        await self.submit(db, work)

    def apply(
        self,
        db: Database,
        work: Work,
        then: Callable[[], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        """:meth:`commit` without a future: ``then`` or ``failed`` runs after the commit."""

        def committed() -> None:
            work.committed()
            then()

        def not_committed(exc: BaseException) -> None:
            work.failed(exc)
            failed(exc)

        db.store.submit(
            work.statements, on_commit=committed, on_failure=not_committed, chains=work.chains
        )

    def _database_of_queue(self, queue: str, database: str | None) -> Database:
        if database is not None:
            db = self.database(database)
            if queue not in db.catalog.queues:
                raise QueueNotFound(f"queue {queue!r} does not exist in database {db.name!r}")
            return db
        found = [db for db in self.databases.values() if queue in db.catalog.queues]
        if len(found) != 1:
            raise DialogError(
                f"queue {queue!r} does not exist on this broker"
                if not found
                else f"queue {queue!r} exists in several databases; name the database"
            )
        return found[0]

    async def submit_wait(
        self,
        db: Database,
        statements: list[Statement],
        on_commit: Callable[[], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        future = db.store.submit(statements, on_commit=on_commit, on_failure=on_failure, wait=True)
        assert future is not None
        await future

    def transmit(self, ep: Endpoint) -> None:
        self.transmission.transmit(ep)

    def build_fragment(
        self, ep: Endpoint, msg: OutMessage, index: int
    ) -> tuple[DialogHeader, bytes]:
        """A fragment as the local link hands it over: its bytes are its own, since the
        receiving side keeps them (a link's frames take a view of the body instead)."""
        header, body = self.transmission.build_fragment(ep, msg, index)
        return header, bytes(body)  # a whole message's body is bytes: not copied

    def link_up(self, link: Link, waiting: Iterable[Endpoint]) -> None:
        self.transmission.link_up(link, waiting)

    def link_down(self, link: Link, endpoints: Iterable[Endpoint]) -> None:
        self.transmission.link_down(link, endpoints)

    def drop(self, header: DialogHeader, reason: str) -> None:
        self.stats.dropped += 1
        self.trace.emit(
            "dropped",
            header.conversation_id,
            initiator=header.initiator,
            seq=header.sequence_number,
            fragment=header.fragment_index,
            service=header.to_service,
            reason=reason,
        )
        self.note_drop(
            f"dropped message {header.sequence_number} of conversation {header.conversation_id} "
            f"for {header.to_service!r}: {reason}"
        )

    def note_drop(self, text: str) -> None:
        """Keep the reason for the ``drops`` view (the first 100) and log it: at most one
        line a second (a sender retransmitting into a fenced partner drops thousands),
        with the count of those not logged since."""
        if len(self.stats.drop_reasons) < 100:
            self.stats.drop_reasons.append(text)
        now = time.monotonic()
        if now - self._drop_logged_at < 1.0:
            self._drops_not_logged += 1
            return
        more = self._drops_not_logged
        self._drop_logged_at, self._drops_not_logged = now, 0
        log.warning("%s%s", text, f" (and {more} more drops not logged)" if more else "")

    def _trace_begun(self, ep: Endpoint, peer: str | None = None) -> None:
        self.trace.emit(
            "dialog_begun",
            ep.conversation_id,
            database=ep.database,
            initiator=ep.initiator,
            service=ep.service,
            far_service=ep.far_service,
            contract=ep.contract,
            peer=peer,
        )

    def _trace_discarded(
        self, ep: Endpoint, seqs: list[int], reason: str, received: bool = False
    ) -> None:
        """Messages leaving the transmission queue undelivered, or (``received``) arriving
        after this side ended, not delivered either: the audit then stops waiting."""
        if seqs:
            self.trace.emit(
                "discarded",
                ep.conversation_id,
                database=ep.database,
                initiator=ep.initiator != received,
                seqs=",".join(map(str, sorted(seqs))),
                reason=reason,
            )

    def _trace_closed(self, ep: Endpoint) -> None:
        if ep.state is State.CLOSED:
            self.trace.emit(
                "dialog_ended", ep.conversation_id, database=ep.database, initiator=ep.initiator
            )

    def _fail_locally(self, db: Database, ep: Endpoint, body: bytes, why: str) -> None:
        """The broker ends the dialog with an error: the Error goes to this side's queue,
        unacknowledged messages are dropped, new messages are refused (state ER)."""
        if ep.broker_error or ep.state is State.CLOSED:
            return
        ep.broker_error = True
        dropped = list(ep.outbox)
        runs = ep.backlog.spans()
        self._trace_discarded(ep, [*dropped, *ep.backlog], why)
        self.transmission.discard(ep)
        ep.refresh_state()

        def committed() -> None:
            if ep.service == ROUTE_REQUESTER_SERVICE:
                self.router.request_ended(ep)

        self._queue_local(
            db,
            ep,
            ERROR,
            body,
            [*_unqueue_sent(ep, dropped, runs=runs), endpoint_snapshot(ep)],
            committed,
        )

    def _queue_local(
        self,
        db: Database,
        ep: Endpoint,
        message_type: str,
        body: bytes,
        extra: list[Statement],
        then: Callable[[], None] | None = None,
    ) -> None:
        """Queue a message this broker makes for the endpoint's own side (a broker Error, a
        DialogTimer), numbered from ``Database.next_local_seq``, with ``extra`` statements
        in the same transaction; ``then`` runs once it is committed."""
        if ep.state not in DELIVERING:  # this side has ended: nothing more reaches it
            db.store.submit(extra, on_commit=then)
            return
        seq = db.next_local_seq
        db.next_local_seq -= 1
        queue = db.queue_of(ep.service) or ""
        index = db.ready.get(queue)

        def committed() -> None:
            if index is not None:
                index.add(ep.group_id, ep.handle, seq, rank_of(message_type))
            if then is not None:
                then()

        db.store.submit(
            [_queue_row(ep, queue, seq, 1, message_type, len(body), body, self.clock()), *extra],
            on_commit=committed,
        )

    def _delivered(
        self,
        db: Database,
        ep: Endpoint,
        queue: str,
        index: ReadyIndex | None,
        released: list[int],
        error: bool,
    ) -> None:
        """Messages released in order are ready to RECEIVE (R-DLG-1); the other side's
        Error goes ahead of the conversation's waiting messages (R-DLG-10)."""
        if index is not None:
            last = released[-1] if error else None
            for s in released:
                index.add(ep.group_id, ep.handle, s, Rank.ERROR if s == last else Rank.IN_SEQUENCE)
        self.trace.emit_each(
            "delivered",
            ep.conversation_id,
            "seq",
            released,
            database=db.name,
            initiator=not ep.initiator,
            queue=queue,
        )
        self.stats.delivered_messages += len(released)

    def _suspend_receiving(self, db: Database) -> None:
        """After a failed write, refuse inbound traffic until memory matches the file again."""
        if db.rx_suspended:
            return
        db.rx_suspended = True

        async def reload() -> None:
            await asyncio.sleep(1.0)
            try:
                # A job of its own: it runs after every write already queued.
                await db.reload_received()
            except StoreError:
                log.exception("database %s still failing; retrying", db.name)
                db.rx_suspended = False
                self._suspend_receiving(db)
                return
            db.rx_suspended = False

        self.loop.create_task(reload())

    def _watch(self, ep: Endpoint) -> None:
        self.deadlines.watch(ep)


def _queue_row(
    ep: Endpoint,
    queue: str,
    seq: int,
    status: int,
    message_type: str,
    length: int,
    body: bytes | None,
    now: float,
) -> Statement:
    """A received message's row in its service queue (``body`` None while fragments arrive)."""
    return queries.queued_message(
        queue,
        ep.group_text,
        ep.handle_text,
        seq,
        status,
        ep.service,
        ep.contract,
        message_type,
        length,
        body,
        now,
    )


def _unqueue_sent(
    ep: Endpoint,
    seqs: Iterable[int],
    through: int = 0,
    runs: Iterable[tuple[int, int]] = (),
) -> list[Statement]:
    """Delete sent messages from the transmission queue (acknowledged, or dropped by an
    error): ``seqs`` and the runs of numbers ``first..last`` (of a backlog)."""
    return queries.unqueue_sent(ep.handle_text, seqs, through, runs)
