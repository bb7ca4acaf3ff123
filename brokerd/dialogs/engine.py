"""The dialog engine: exactly-once-in-order dialogs over links (SPEC §4 and §5).

Owns R-DLG-1 to R-DLG-13 for the databases of one instance:

* the application verbs (BEGIN DIALOG, SEND, RECEIVE, END CONVERSATION) and the
  contract check at SEND (R-DLG-3);
* sequence numbers, duplicate detection (R-DLG-4) and in-order release of
  messages to the queue (status 2 while incomplete or out of order, R-DLG-7);
* acknowledgements, piggybacked on every outgoing header and otherwise sent as
  dedicated ACK frames after a short coalescing delay, never before the commit
  that made the message durable (R-DLG-5);
* retransmission with exponential backoff and a readable transmission status
  on every waiting message (R-DLG-6); fragments of large messages resent alone;
* broker-generated (unsequenced) errors for messages the receiver refuses;
* dialog lifetimes (R-DLG-9: a timeout Error on each side, new messages refused)
  and conversation timers (R-DLG-11: a DialogTimer message in the own queue),
  both wall-clock deadlines checked by the engine's tick;
* the dialog's delivery trace events (``brokerd.traces.writer``, docs/traces.md).

Where messages go is the router's business (``brokerd.dialogs.router``, SPEC §2): the
engine asks it for a conversation's link and for the database of each message
from outside, which it may instead forward or drop.

A *link* is where fragments go: a network connection to a peer broker
(``brokerd.server.transport``) or the in-process ``LocalLink`` for services of
this same instance, which skips the network. The engine never touches sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Collection, Iterable
from dataclasses import replace
from typing import Any
from xml.sax.saxutils import escape

from brokerd.config import BrokerConfig
from brokerd.dialogs.database import Database, Lease
from brokerd.dialogs.deadlines import Deadline, Deadlines
from brokerd.dialogs.endpoint import Endpoint, OutMessage, endpoint_deletion, endpoint_snapshot
from brokerd.dialogs.links import Link, LinkProvider
from brokerd.dialogs.local_link import LocalLink
from brokerd.dialogs.router import Router
from brokerd.dialogs.states import State
from brokerd.dialogs.stats import EngineStats
from brokerd.dialogs.transmission import Transmission
from brokerd.dialogs.work import Work
from brokerd.errors import (
    ContractViolation,
    ConversationEnded,
    ConversationNotFound,
    DatabaseNotFound,
    DialogError,
    InvalidRequest,
    LockConflict,
    MessageTooLarge,
    NotPrincipal,
    QueueDisabled,
    QueueNotFound,
    ServiceNotFound,
    StoreError,
    ValidationFailed,
)
from brokerd.storage import queries
from brokerd.storage.catalog import ROUTE_REQUESTER_SERVICE
from brokerd.storage.queries import Statement
from brokerd.traces.writer import TraceWriter
from protocol.dialog import (
    DIALOG_TIMER,
    END_DIALOG,
    ERROR,
    Acknowledgement,
    DialogHeader,
    MessageFlags,
)
from protocol.fragments import fragment_count

_INITIATOR, _SEQUENCED, _END_DIALOG, _ERROR = (
    int(f)
    for f in (
        MessageFlags.INITIATOR,
        MessageFlags.SEQUENCED,
        MessageFlags.END_DIALOG,
        MessageFlags.ERROR,
    )
)
"""The message flags as plain ints: IntFlag arithmetic costs microseconds."""
log = logging.getLogger("brokerd.dialogs.engine")

ERROR_NS = "http://schemas.microsoft.com/SQL/ServiceBroker/Error"
CODE_SERVICE_NOT_FOUND = -8425
CODE_CONTRACT_NOT_SUPPORTED = -8408
CODE_MESSAGE_TYPE_REFUSED = -8457
CODE_LIFETIME_EXPIRED = -8489
CODE_VALIDATION_FAILED = -9615
CODE_MESSAGE_TOO_LARGE = -9617


def error_body(code: int, description: str) -> bytes:
    """The XML body of an Error message (SPEC §6)."""
    return (
        f'<?xml version="1.0"?><Error xmlns="{ERROR_NS}"><Code>{code}</Code>'
        f"<Description>{escape(description)}</Description></Error>"
    ).encode()


class DialogEngine:
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
        self.local_link = LocalLink(self)
        self.stats = EngineStats()
        self.by_instance: dict[uuid.UUID, Database] = {}
        self.router = Router(self)
        self.transmission = Transmission(
            self.router,
            self.retry,
            self.fragment_size,
            self.trace,
            self.stats,
            lambda database: self.databases[database].broker_instance,
        )
        self.deadlines = Deadlines()
        self._ticker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- life cycle -------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        waiting: list[Endpoint] = []
        for db in self.databases.values():
            self.by_instance[db.broker_instance] = db
            waiting += await db.recover(self.fragment_size)
        self.router.start()
        owed = []
        for db in self.databases.values():
            for ep in db.endpoints.values():
                if ep.ack_version > ep.ack_sent_version:
                    owed.append(ep)
                self._watch(ep)
        self.transmission.start(self._loop, owed)
        self._ticker = self._loop.create_task(self._tick(), name="engine-retransmit")
        for ep in waiting:
            self.transmit(ep)

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        self.transmission.stop()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "engine not started"
        return self._loop

    # -- lookups ----------------------------------------------------------------

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

    # -- application verbs --------------------------------------------------------
    #
    # Each verb has a work form (``*_work``): its checks, its in-memory effects and
    # the rows it writes, as a :class:`~brokerd.dialogs.work.Work`, with no I/O. The
    # awaitable form commits that work alone; a client transaction
    # (``brokerd.dialogs.transactions``) commits the works of several verbs together.

    async def commit(self, db: Database, work: Work) -> None:
        """Make ``work`` durable in one SQLite transaction; its callbacks run after it."""
        future = db.store.submit(
            work.statements, on_commit=work.committed, on_failure=work.failed, wait=True
        )
        assert future is not None
        await future

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

        db.store.submit(work.statements, on_commit=committed, on_failure=not_committed)

    def new_dialog(
        self,
        from_service: str,
        to_service: str,
        contract: str,
        database: str | None = None,
        to_broker_instance: uuid.UUID | None = None,
        lifetime: int = 0,
        related_conversation: uuid.UUID | None = None,
    ) -> tuple[Database, Endpoint]:
        """BEGIN DIALOG's checks and the new initiator endpoint, not registered yet."""
        db = self.database(database) if database else self.database_of_service(from_service)
        if db.mirror_role == "mirror":
            raise NotPrincipal(
                f"database {db.name!r} is the mirror partner; begin dialogs on the principal "
                "(R-ROUTE-10)"
            )
        if from_service not in db.catalog.services:
            raise ServiceNotFound(
                f"service {from_service!r} does not exist in database {db.name!r}"
            )
        if contract not in db.catalog.contracts:
            raise ContractViolation(f"contract {contract!r} does not exist in database {db.name!r}")
        if not to_service:
            raise InvalidRequest("the target service name must not be empty")
        group = uuid.uuid4()
        if related_conversation is not None:
            group = self.endpoint(related_conversation)[1].group_id
        ep = Endpoint(
            handle=uuid.uuid4(),
            conversation_id=uuid.uuid4(),
            initiator=True,
            group_id=group,
            database=db.name,
            service=from_service,
            far_service=to_service,
            far_broker_instance=to_broker_instance,
            contract=contract,
            state=State.STARTED_OUTBOUND,
            lifetime=max(0, int(lifetime)),
            created_at=self.clock(),
        )
        return db, ep

    def begin_dialog_work(self, db: Database, ep: Endpoint) -> Work:
        """Register the endpoint from :meth:`new_dialog`; forgotten if the work fails."""
        db.add_endpoint(ep)

        def committed() -> None:
            self._watch(ep)
            self._trace_begun(ep)

        return Work().add([endpoint_snapshot(ep)], committed, lambda _: db.remove_endpoint(ep))

    async def begin_dialog(
        self,
        from_service: str,
        to_service: str,
        contract: str,
        database: str | None = None,
        to_broker_instance: uuid.UUID | None = None,
        lifetime: int = 0,
        related_conversation: uuid.UUID | None = None,
    ) -> Endpoint:
        db, ep = self.new_dialog(
            from_service,
            to_service,
            contract,
            database,
            to_broker_instance,
            lifetime,
            related_conversation,
        )
        await self.commit(db, self.begin_dialog_work(db, ep))
        return ep

    def check_send(self, db: Database, ep: Endpoint, message_type: str, body: bytes) -> None:
        """SEND's checks: the endpoint's state, the size, the contract (R-DLG-3), validation."""
        problem = ep.may_send()
        if problem:
            raise ConversationEnded(f"cannot SEND on conversation {ep.handle}: {problem}")
        if len(body) > self.max_message_size:
            raise MessageTooLarge(
                f"message of {len(body)} bytes exceeds max_message_size {self.max_message_size}"
            )
        refusal = db.catalog.send_refusal(ep.contract, message_type, ep.initiator)
        if refusal:
            raise ContractViolation(f"SEND refused by contract {ep.contract!r}: {refusal}")
        invalid = db.catalog.validation_problem(message_type, body)
        if invalid:
            raise ValidationFailed(f"SEND refused: {invalid}")

    def send_work(
        self, db: Database, ep: Endpoint, message_type: str, body: bytes
    ) -> tuple[int, Work]:
        self.check_send(db, ep, message_type, body)
        return self._enqueue_work(db, ep, message_type, int(_SEQUENCED), body)

    async def send(self, handle: uuid.UUID, message_type: str, body: bytes) -> int:
        db, ep = self.endpoint(handle)
        seq, work = self.send_work(db, ep, message_type, body)
        await self.commit(db, work)
        return seq

    async def send_many(self, messages: list[tuple[uuid.UUID, str, bytes]]) -> list[int]:
        """SEND several messages with one commit per database (a producer's batched path).

        Every message is checked before any is queued: one refusal refuses the batch.
        """
        found = [
            (*self.endpoint(handle), message_type, body) for handle, message_type, body in messages
        ]
        for db, ep, message_type, body in found:
            self.check_send(db, ep, message_type, body)
        works: dict[str, tuple[Database, Work]] = {}
        seqs: list[int] = []
        flags = int(_SEQUENCED)
        for db, ep, message_type, body in found:
            seq, work = self._enqueue_work(db, ep, message_type, flags, body)
            seqs.append(seq)
            works.setdefault(db.name, (db, Work()))[1].extend(work)
        await asyncio.gather(*(self.commit(db, work) for db, work in works.values()))
        return seqs

    def _enqueue_work(
        self,
        db: Database,
        ep: Endpoint,
        message_type: str,
        flags: int,
        body: bytes,
        extra: Iterable[Statement] = (),
    ) -> tuple[int, Work]:
        ep.send_sequence += 1
        seq = ep.send_sequence
        if ep.initiator:
            flags |= _INITIATOR
        msg = OutMessage(
            seq=seq,
            message_type=message_type,
            flags=flags,
            body=body,
            enqueued_at=self.clock(),
            fragment_count=fragment_count(len(body), self.fragment_size),
        )
        ep.uncommitted_sends += 1
        ep.refresh_state()
        trace = self.trace
        trace.emit(
            "message_sent",
            ep.conversation_id,
            database=db.name,
            initiator=ep.initiator,
            seq=seq,
            size=len(body),
            message_type=message_type,
            service=ep.service,
            far_service=ep.far_service,
        )
        statements: list[Statement] = [
            *extra,
            queries.sent_message(ep.handle_text, seq, message_type, flags, body, msg.enqueued_at),
            endpoint_snapshot(ep),
        ]

        def committed() -> None:
            ep.uncommitted_sends -= 1
            ep.outbox[seq] = msg
            self.stats.sent_messages += 1
            trace.emit(
                "enqueued",
                ep.conversation_id,
                database=db.name,
                initiator=ep.initiator,
                seq=seq,
                size=len(body),
                fragments=msg.fragment_count,
            )
            self.transmit(ep)

        def failed(_: BaseException) -> None:
            ep.uncommitted_sends -= 1
            if ep.send_sequence == seq:
                ep.send_sequence -= 1
                ep.refresh_state(undo=True)

        return seq, Work().add(statements, committed, failed)

    def end_conversation_work(
        self,
        db: Database,
        ep: Endpoint,
        error_code: int | None = None,
        description: str = "",
        cleanup: bool = False,
    ) -> Work:
        if cleanup:
            return self._cleanup_work(db, ep)
        if ep.ended_local or ep.state is State.CLOSED:
            return Work()
        ep.ended_local = True
        dropped = dict(ep.outbox)

        def failed(_: BaseException) -> None:
            ep.ended_local = False
            ep.outbox.update(dropped)
            ep.refresh_state(undo=True)

        work = Work().add(on_failure=failed)
        if ep.broker_error:
            self._trace_discarded(ep, list(dropped), "END CONVERSATION after a broker error")
            ep.outbox.clear()
            ep.refresh_state()
            return work.add([endpoint_snapshot(ep)])
        if error_code is not None:
            self._trace_discarded(ep, list(dropped), "END CONVERSATION WITH ERROR")
            ep.outbox.clear()
            _, enqueued = self._enqueue_work(
                db,
                ep,
                ERROR,
                int(_SEQUENCED | _ERROR),
                error_body(error_code, description),
                _unqueue_sent(ep, list(dropped)),
            )
        else:
            _, enqueued = self._enqueue_work(db, ep, END_DIALOG, int(_SEQUENCED | _END_DIALOG), b"")
        return work.extend(enqueued)

    async def end_conversation(
        self,
        handle: uuid.UUID,
        error_code: int | None = None,
        description: str = "",
        cleanup: bool = False,
    ) -> None:
        db, ep = self.endpoint(handle)
        work = self.end_conversation_work(db, ep, error_code, description, cleanup)
        if work.statements:
            await self.commit(db, work)

    def _cleanup_work(self, db: Database, ep: Endpoint) -> Work:
        self._trace_discarded(ep, list(ep.outbox), "END CONVERSATION WITH CLEANUP")
        ep.outbox.clear()
        ep.state = State.CLOSED
        self._trace_closed(ep)
        db.remove_endpoint(ep)
        queue = db.queue_of(ep.service)
        if queue in db.ready:
            db.ready[queue].drop_conversation(ep.handle)
        ep.timer_due = 0.0
        return Work().add([*queries.forget_conversation(ep.handle_text), endpoint_deletion(ep)])

    def check_move(
        self, db: Database, ep: Endpoint, group: uuid.UUID, owned: Collection[uuid.UUID] = ()
    ) -> None:
        """MOVE CONVERSATION's check: neither group is locked by another transaction
        (``owned`` are the groups the caller's own transaction holds)."""
        queue = db.queue_of(ep.service)
        index = db.ready.get(queue) if queue else None
        if index is None:
            return
        for gid in (ep.group_id, group):
            if gid in index.locked and gid not in owned:
                raise LockConflict(
                    f"conversation group {gid} is locked by a RECEIVE of another transaction"
                )

    def move_conversation_work(
        self, db: Database, ep: Endpoint, group: uuid.UUID, owned: Collection[uuid.UUID] = ()
    ) -> Work:
        """MOVE CONVERSATION: the conversation joins conversation group ``group``.

        Its waiting messages move with it. Refused while another transaction holds
        either group (its messages are being received).
        """
        old = ep.group_id
        if old == group:
            return Work()
        self.check_move(db, ep, group, owned)
        queue = db.queue_of(ep.service)
        index = db.ready.get(queue) if queue else None
        ep.group_id = group
        if index is not None:
            index.move_conversation(ep.handle, old, group)

        def failed(_: BaseException) -> None:
            ep.group_id = old
            if index is not None:
                index.move_conversation(ep.handle, group, old)

        return Work().add(
            [queries.regroup(ep.handle_text, ep.group_text), endpoint_snapshot(ep)],
            on_failure=failed,
        )

    async def move_conversation(self, handle: uuid.UUID, group: uuid.UUID) -> None:
        db, ep = self.endpoint(handle)
        await self.commit(db, self.move_conversation_work(db, ep, group))

    async def discard_received(self, ep: Endpoint) -> None:
        """Remove what ``ep`` received from its queue (system dialogs consume their replies)."""
        db = self.databases[ep.database]
        queue = db.queue_of(ep.service)
        if queue in db.ready:
            db.ready[queue].drop_conversation(ep.handle)
        await self.submit_wait(db, [queries.discard_received(ep.handle_text)])

    async def take_ready(
        self,
        queue: str,
        database: str | None = None,
        top: int = 1,
        timeout: float = 0.0,
        handle: uuid.UUID | None = None,
        owned: Collection[uuid.UUID] = (),
    ) -> Lease | None:
        """RECEIVE's choice: up to ``top`` ready messages of one conversation group, whose
        lock the returned lease holds; waits up to ``timeout`` s (negative: forever).

        ``owned`` are groups the caller's transaction already holds: they may be taken
        from again. None when nothing arrived in time.
        """
        db = self._database_of_queue(queue, database)
        info = db.catalog.queues[queue]
        if not info.status:
            raise QueueDisabled(f"queue {queue!r} in database {db.name!r} is disabled (status off)")
        index = db.ready[queue]
        group = None
        if handle is not None:
            group = self.endpoint(handle)[1].group_id
        deadline = None if timeout < 0 else self.loop.time() + timeout
        while True:
            taken = index.take(max(1, top), handle, group, owned)
            if taken is not None:
                gid, items = taken
                return Lease(db, queue, index, gid, items, info.retention, gid not in owned)
            remaining = None if deadline is None else deadline - self.loop.time()
            if remaining is not None and remaining <= 0:
                return None
            index.changed.clear()
            try:
                await asyncio.wait_for(index.changed.wait(), remaining)
            except TimeoutError:
                return None

    async def read_leased(self, lease: Lease) -> list[dict[str, Any]]:
        """The rows of a lease's messages, read without removing them."""
        try:
            return await lease.db.store.run(lambda conn: queries.read_received(conn, lease.items))
        except BaseException:
            self.release(lease, received=False)
            raise

    def receive_work(self, lease: Lease) -> Work:
        """Remove a lease's messages from the queue (or keep them with status 0 under
        RETENTION); once committed the group's lock is released."""
        rows = [queries.received(str(h), s, lease.retention) for h, s in lease.items]
        return Work().add(
            rows,
            on_commit=lambda: self.release(lease, received=True),
            on_failure=lambda _: self.release(lease, received=False),
        )

    def release(self, lease: Lease, received: bool) -> None:
        """Unlock a lease's group; its messages go back in front, in order, unless received."""
        if lease.released:
            return
        lease.released = True
        index = lease.index
        if not received:
            # A conversation cleaned up meanwhile has no rows left to give back.
            kept = [item for item in lease.items if item[0] in lease.db.endpoints]
            if kept:
                index.put_back(lease.group, kept)
        if lease.locks:
            index.locked.discard(lease.group)
        if index.count:
            index.changed.set()
        if received:
            self._trace_received(lease)

    def _trace_received(self, lease: Lease) -> None:
        self.stats.received_by_application += len(lease.items)
        if not self.trace.enabled:
            return
        db = lease.db
        for handle, seq in lease.items:
            owner = db.endpoints.get(handle)
            if owner is not None:
                self.trace.emit(
                    "received",
                    owner.conversation_id,
                    database=db.name,
                    initiator=not owner.initiator,
                    seq=seq,
                    queue=lease.queue,
                )

    async def receive(
        self,
        queue: str,
        database: str | None = None,
        top: int = 1,
        timeout: float = 0.0,
        handle: uuid.UUID | None = None,
    ) -> list[dict[str, Any]]:
        """RECEIVE TOP (top) outside a transaction: the messages leave the queue in the
        same commit that reads them (autocommit; at most once to the application)."""
        lease = await self.take_ready(queue, database, top, timeout, handle)
        if lease is None:
            return []
        future = lease.db.store.submit(
            (),
            fn=lambda conn: queries.read_received(conn, lease.items, True, lease.retention),
            on_commit=lambda: self.release(lease, received=True),
            on_failure=lambda _: self.release(lease, received=False),
            wait=True,
        )
        assert future is not None
        rows: list[dict[str, Any]] = await future
        return rows

    async def alter_queue(self, queue: str, status: bool, database: str | None = None) -> None:
        """ALTER QUEUE ... WITH STATUS = ON | OFF (R-DLG-12).

        While a queue is off, messages for it are still accepted, stored and
        acknowledged, but RECEIVE refuses; turning it on makes them receivable.
        """
        db = self._database_of_queue(queue, database)
        info = db.catalog.queues[queue]
        await self.submit_wait(db, [queries.set_queue_status(queue, status)])
        info.status = status
        if status:
            db.ready[queue].changed.set()

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

    # -- transmission (brokerd.dialogs.transmission) ------------------------------

    def transmit(self, ep: Endpoint) -> None:
        self.transmission.transmit(ep)

    def build_fragment(
        self, ep: Endpoint, msg: OutMessage, index: int
    ) -> tuple[DialogHeader, bytes]:
        return self.transmission.build_fragment(ep, msg, index)

    def link_up(self, link: Link, waiting: Iterable[Endpoint]) -> None:
        self.transmission.link_up(link, waiting)

    def link_down(self, link: Link, endpoints: Iterable[Endpoint]) -> None:
        self.transmission.link_down(link, endpoints)

    async def _tick(self) -> None:
        interval = max(0.01, min(0.1, self.retry.initial / 4))
        while True:
            await asyncio.sleep(interval)
            self.transmission.wake_due()
            self.router.tick()
            self._fire_deadlines(self.clock())

    # -- acknowledgements ---------------------------------------------------------

    def on_acks(self, link: Link, headers: list[DialogHeader]) -> None:
        elsewhere: list[DialogHeader] = []
        for h in headers:
            self.stats.acks_received += 1
            ep = self._endpoint_for(h)
            if ep is not None:
                self._apply_ack(ep, h.ack, h.from_broker_instance)
            elif link is not self.local_link:
                elsewhere.append(h)
        if elsewhere and self.router.forwarding:
            self.router.forward_acks(elsewhere)

    def _endpoint_for(self, h: DialogHeader) -> Endpoint | None:
        key = (h.conversation_id, not h.initiator)
        if h.to_broker_instance is not None:
            db = self.by_instance.get(h.to_broker_instance)
            return db.by_key.get(key) if db else None
        for db in self.databases.values():
            ep = db.by_key.get(key)
            if ep is not None:
                return ep
        return None

    def _apply_ack(self, ep: Endpoint, ack: Acknowledgement, far_instance: uuid.UUID) -> None:
        db = self.databases[ep.database]
        statements: list[Statement] = []
        changed = False
        if ep.far_broker_instance is None:
            ep.far_broker_instance = far_instance  # R-ROUTE-3: bound to this broker from now on
            self.router.rebind(ep)
            changed = True
        outbox = ep.outbox
        removed: list[int] = []
        for seq in list(outbox):
            if seq <= ack.through:
                removed.append(seq)
            else:
                break
        if ack.ranges or ack.fragments:
            for seq, msg in list(outbox.items()):
                if seq <= ack.through:
                    continue
                if ack.covers(seq):
                    removed.append(seq)
                elif msg.fragment_count > 1:
                    for f in ack.fragments:
                        if f.sequence_number == seq:
                            msg.acked_fragments.update(range(f.first, f.last + 1))
        for seq in removed:
            del outbox[seq]
        if removed:
            self.trace.emit(
                "ack_received",
                ep.conversation_id,
                database=ep.database,
                initiator=ep.initiator,
                through=ack.through,
                acked=len(removed),
                seqs=",".join(map(str, removed)),
            )
        statements += _unqueue_sent(ep, removed, ack.through)
        if ep.refresh_state():
            changed = True
            self._trace_closed(ep)
        if changed:
            statements.append(endpoint_snapshot(ep))
        if statements:
            db.store.submit(statements)

    # -- receiving -------------------------------------------------------------------

    def on_fragment(
        self, link: Link, header: DialogHeader, body: bytes, db: Database | None = None
    ) -> None:
        """One fragment arrived (already integrity-checked by the protocol layer).

        ``db`` is the target database when the sender is in this instance (its own
        routing chose it); a message from outside is routed here (R-ROUTE-1, R-ROUTE-2),
        and relayed or dropped if it is not for this instance.
        """
        self.stats.fragments_received += 1
        if self.trace.enabled:
            self.trace.emit(
                "fragment_received",
                header.conversation_id,
                initiator=header.initiator,
                seq=header.sequence_number,
                fragment=header.fragment_index,
                fragments=header.fragment_count,
                size=len(body),
                hop=header.hop_count or None,
                peer=link.name,
            )
        if db is None:
            db = self.router.inbound(header, body)
            if db is None:
                return
        if db.mirror_role == "mirror":
            self.drop(header, f"database {db.name!r} is the mirror partner (R-ROUTE-10)")
            self.router.tell_mirror(link, db, header)
            return
        if db.rx_suspended:
            return self.drop(header, f"database {db.name!r} is recovering from a store error")
        ep = db.by_key.get((header.conversation_id, not header.initiator))
        if ep is None:
            if not header.initiator or not header.sequenced:
                return self.drop(header, "no conversation endpoint for this message")
            ep = self._new_target_endpoint(db, link, header, body)
            if ep is None:
                return
            checked = True
        else:
            checked = False
        ep.last_link = link
        if ep.far_broker_instance is None:
            ep.far_broker_instance = header.from_broker_instance
        if header.ack.through or header.ack.ranges or header.ack.fragments:
            self._apply_ack(ep, header.ack, header.from_broker_instance)
        if not header.sequenced:
            if header.flags & _ERROR:
                self._on_broker_error(db, ep, header, body)
            return
        seq = header.sequence_number
        if ep.accepted.has_fragment(seq, header.fragment_index):
            self.stats.duplicates += 1
            self.trace.emit(
                "duplicate",
                ep.conversation_id,
                database=db.name,
                initiator=header.initiator,
                seq=seq,
                fragment=header.fragment_index,
                peer=link.name,
            )
            self.transmission.ack_needed(ep)  # R-DLG-4: acknowledged again, not enqueued again
            return
        if ep.state is State.CLOSED or ep.broker_error:
            return self.drop(header, f"conversation is {ep.state.value}")
        refusal = None if checked else self._refusal(db, ep.contract, header, body)
        if refusal is not None:
            code, text = refusal
            self._send_broker_error(link, db, header, code, text)
            return
        if header.fragment_count == 1:
            self._accept_message(db, ep, header, body)
        else:
            self._accept_fragment(db, ep, header, body)

    def _refusal(
        self, db: Database, contract: str, header: DialogHeader, body: bytes
    ) -> tuple[int, str] | None:
        """Why the receiver refuses this message (R-OBJ-1, R-DLG-3, size), as (code, text)."""
        if header.message_length > self.max_message_size:
            return CODE_MESSAGE_TOO_LARGE, (
                f"message of {header.message_length} bytes exceeds this broker's "
                f"max_message_size of {self.max_message_size}"
            )
        refusal = db.catalog.send_refusal(contract, header.message_type, header.initiator)
        if refusal:
            return CODE_MESSAGE_TYPE_REFUSED, refusal
        if header.fragment_count == 1:
            invalid = db.catalog.validation_problem(header.message_type, body)
            if invalid:
                return CODE_VALIDATION_FAILED, invalid
        return None

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
        """Keep the reason for the ``drops`` view (the first 100) and log it."""
        if len(self.stats.drop_reasons) < 100:
            self.stats.drop_reasons.append(text)
        log.warning("%s", text)

    def _new_target_endpoint(
        self, db: Database, link: Link, header: DialogHeader, body: bytes
    ) -> Endpoint | None:
        """The target's endpoint, created by the first message if the target accepts it."""
        service = db.catalog.services.get(header.to_service)
        if service is None:
            self._send_broker_error(
                link,
                db,
                header,
                CODE_SERVICE_NOT_FOUND,
                f"service {header.to_service!r} does not exist in database {db.name!r}",
            )
            return None
        if header.contract not in service.contracts:
            self._send_broker_error(
                link,
                db,
                header,
                CODE_CONTRACT_NOT_SUPPORTED,
                f"service {header.to_service!r} does not accept contract {header.contract!r}",
            )
            return None
        refusal = self._refusal(db, header.contract, header, body)
        if refusal is not None:
            self._send_broker_error(link, db, header, *refusal)
            return None
        ep = Endpoint(
            handle=uuid.uuid4(),
            conversation_id=header.conversation_id,
            initiator=False,
            group_id=uuid.uuid4(),
            database=db.name,
            service=header.to_service,
            far_service=header.from_service,
            far_broker_instance=header.from_broker_instance,
            contract=header.contract,
            state=State.STARTED_INBOUND,
            lifetime=header.lifetime,
            created_at=self.clock(),
        )
        db.add_endpoint(ep)
        self._watch(ep)
        self._trace_begun(ep, link.name)
        return ep

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

    def _trace_discarded(self, ep: Endpoint, seqs: list[int], reason: str) -> None:
        """Messages leaving the transmission queue undelivered (the audit then stops waiting)."""
        if seqs:
            self.trace.emit(
                "discarded",
                ep.conversation_id,
                database=ep.database,
                initiator=ep.initiator,
                seqs=",".join(map(str, sorted(seqs))),
                reason=reason,
            )

    def _trace_closed(self, ep: Endpoint) -> None:
        if ep.state is State.CLOSED:
            self.trace.emit(
                "dialog_ended", ep.conversation_id, database=ep.database, initiator=ep.initiator
            )

    def _release(self, ep: Endpoint, released: list[int], seq: int, flags: int) -> None:
        for s in released:
            f = flags if s == seq else ep.held_end_flags.pop(s, 0)
            if f & _ERROR:
                ep.ended_remote = True
                ep.error_received = True
            elif f & _END_DIALOG:
                ep.ended_remote = True
        if not released and flags & (_ERROR | _END_DIALOG):
            ep.held_end_flags[seq] = flags
        if ep.refresh_state():
            self._trace_closed(ep)

    def _accept_message(
        self, db: Database, ep: Endpoint, header: DialogHeader, body: bytes
    ) -> None:
        seq = header.sequence_number
        released = ep.accepted.add_message(seq)
        self._release(ep, released, seq, header.flags)
        queue = db.queue_of(ep.service) or ""
        h = ep.handle_text
        statements: list[Statement] = [
            _queue_row(
                ep,
                queue,
                seq,
                1 if released else 2,
                header.message_type,
                len(body),
                body,
                self.clock(),
            ),
            *queries.promote(h, released[1:]),
            endpoint_snapshot(ep),
        ]
        self._submit_received(db, ep, queue, statements, released, seq, None)

    def _accept_fragment(
        self, db: Database, ep: Endpoint, header: DialogHeader, body: bytes
    ) -> None:
        seq, index = header.sequence_number, header.fragment_index
        first = seq not in ep.accepted.fragments
        complete = ep.accepted.add_fragment(seq, index, header.fragment_count)
        queue = db.queue_of(ep.service) or ""
        h = ep.handle_text
        statements: list[Statement] = []
        if first:
            statements.append(
                _queue_row(
                    ep,
                    queue,
                    seq,
                    2,
                    header.message_type,
                    header.message_length,
                    None,
                    self.clock(),
                )
            )
        statements.append(queries.fragment(h, seq, index, header.fragment_offset, body))
        if not complete:
            statements.append(endpoint_snapshot(ep))
            self._submit_received(db, ep, queue, statements, [], seq, index)
            return
        released = ep.accepted.add_message(seq)
        self._release(ep, released, seq, header.flags)
        statements += queries.promote(h, released[1:])
        statements.append(endpoint_snapshot(ep))
        status = 1 if released else 2
        catalog = db.catalog
        message_type = header.message_type

        def assemble(conn: sqlite3.Connection) -> None:
            whole = queries.assemble(conn, h, seq, status)
            problem = catalog.validation_problem(message_type, whole)
            if problem:
                log.warning("reassembled message %s of %s fails validation: %s", seq, h, problem)

        self._submit_received(db, ep, queue, statements, released, seq, None, assemble)

    def _submit_received(
        self,
        db: Database,
        ep: Endpoint,
        queue: str,
        statements: list[Statement],
        released: list[int],
        seq: int,
        fragment: int | None,
        fn: Callable[[sqlite3.Connection], Any] | None = None,
    ) -> None:
        index = db.ready.get(queue)

        def committed() -> None:
            if fragment is None:
                ep.durable.add_message(seq)
            else:
                ep.durable.add_fragment(seq, fragment, 1 << 30)
            if index is not None:
                for s in released:
                    index.add(ep.group_id, ep.handle, s)
            for s in released:
                self.trace.emit(
                    "delivered",
                    ep.conversation_id,
                    database=db.name,
                    initiator=not ep.initiator,
                    seq=s,
                    queue=queue,
                )
            if released:
                self.stats.delivered_messages += len(released)
                if ep.ended_remote and ep.service == ROUTE_REQUESTER_SERVICE:
                    self.router.request_ended(ep)
            self.transmission.ack_needed(ep)

        def failed(exc: BaseException) -> None:
            log.error("store error while receiving into %s: %s", db.name, exc)
            self._suspend_receiving(db)

        db.store.submit(statements, fn=fn, on_commit=committed, on_failure=failed)

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

    # -- broker errors ------------------------------------------------------------------

    def _send_broker_error(
        self, link: Link, db: Database | None, header: DialogHeader, code: int, text: str
    ) -> None:
        """An unsequenced Error in answer to a refused message (R-DLG-2); nothing is stored."""
        self.stats.broker_errors_sent += 1
        self.drop(header, f"refused with broker error {code}: {text}")
        body = error_body(code, text)
        instance = (db or self.msdb).broker_instance
        reply = DialogHeader(
            header.conversation_id,
            header.to_service,
            header.from_service,
            instance,
            header.from_broker_instance,
            header.contract,
            ERROR,
            int(_ERROR) | (0 if header.initiator else int(_INITIATOR)),
            0,
            0,
            1,
            0,
            len(body),
        )
        link.queue_header(reply, body)

    def _on_broker_error(
        self, db: Database, ep: Endpoint, header: DialogHeader, body: bytes
    ) -> None:
        self._fail_locally(db, ep, body, "the broker reported an error for the conversation")

    def _fail_locally(self, db: Database, ep: Endpoint, body: bytes, why: str) -> None:
        """The broker ends the dialog with an error: the Error goes to this side's queue,
        unacknowledged messages are dropped, new messages are refused (state ER)."""
        if ep.broker_error or ep.state is State.CLOSED:
            return
        ep.broker_error = True
        dropped = list(ep.outbox)
        self._trace_discarded(ep, dropped, why)
        ep.outbox.clear()
        ep.refresh_state()

        def committed() -> None:
            if ep.service == ROUTE_REQUESTER_SERVICE:
                self.router.request_ended(ep)

        self._queue_local(
            db, ep, ERROR, body, [*_unqueue_sent(ep, dropped), endpoint_snapshot(ep)], committed
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
        seq = db.next_local_seq
        db.next_local_seq -= 1
        queue = db.queue_of(ep.service) or ""
        index = db.ready.get(queue)

        def committed() -> None:
            if index is not None:
                index.add(ep.group_id, ep.handle, seq)
            if then is not None:
                then()

        db.store.submit(
            [_queue_row(ep, queue, seq, 1, message_type, len(body), body, self.clock()), *extra],
            on_commit=committed,
        )

    # -- conversation timers (R-DLG-11) and dialog lifetimes (R-DLG-9) ------------------

    def check_timer(self, ep: Endpoint, timeout: float) -> None:
        """BEGIN CONVERSATION TIMER's checks: an open conversation, a timeout >= 0."""
        if ep.state is State.CLOSED:
            raise ConversationEnded(f"cannot set a timer on conversation {ep.handle}: it is closed")
        if not timeout >= 0:
            raise InvalidRequest(f"timer timeout must be >= 0 seconds, not {timeout}")

    def timer_work(self, db: Database, ep: Endpoint, timeout: float) -> Work:
        """BEGIN CONVERSATION TIMER (R-DLG-11): a DialogTimer message in this side's queue
        after ``timeout`` seconds. A new timer replaces the conversation's current one; it
        is not shared with the other side and does not change the lifetime."""
        self.check_timer(ep, timeout)
        due = self.clock() + timeout

        def committed() -> None:
            ep.timer_due = due
            self._watch(ep)

        return Work().add(
            [queries.set_timer(ep.handle_text, due)],
            committed,
        )

    async def begin_conversation_timer(self, handle: uuid.UUID, timeout: float) -> None:
        db, ep = self.endpoint(handle)
        await self.commit(db, self.timer_work(db, ep, timeout))

    def _watch(self, ep: Endpoint) -> None:
        self.deadlines.watch(ep)

    def _fire_deadlines(self, now: float) -> None:
        for kind, due, ep in self.deadlines.due(now):
            db = self.databases[ep.database]
            if db.endpoints.get(ep.handle) is not ep or ep.state is State.CLOSED:
                continue
            if kind is Deadline.TIMER and ep.timer_due == due:
                self._fire_timer(db, ep)
            elif kind is Deadline.LIFETIME and ep.lifetime_ends == due:
                self._expire(db, ep)

    def _fire_timer(self, db: Database, ep: Endpoint) -> None:
        ep.timer_due = 0.0
        self.trace.emit(
            "timer_fired",
            ep.conversation_id,
            database=db.name,
            initiator=ep.initiator,
            queue=db.queue_of(ep.service),
        )
        self._queue_local(db, ep, DIALOG_TIMER, b"", [queries.forget_timer(ep.handle_text)])

    def _expire(self, db: Database, ep: Endpoint) -> None:
        if ep.broker_error:
            return
        reason = f"the dialog's lifetime of {ep.lifetime} s passed"
        self.trace.emit(
            "lifetime_expired",
            ep.conversation_id,
            database=db.name,
            initiator=ep.initiator,
            reason=reason,
        )
        body = error_body(
            CODE_LIFETIME_EXPIRED, f"The dialog has exceeded its lifetime of {ep.lifetime} seconds."
        )
        self._fail_locally(db, ep, body, reason)

    def on_integrity_failure(self, link: Link, reason: str) -> None:
        self.stats.integrity_failures += 1
        self.trace.emit("integrity_failure", peer=link.name, reason=reason)
        log.warning("integrity failure on %s: %s (not acknowledged)", link.name, reason)

    # -- views ----------------------------------------------------------------------------


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


def _unqueue_sent(ep: Endpoint, seqs: Iterable[int], through: int = 0) -> list[Statement]:
    """Delete sent messages from the transmission queue (acknowledged, or dropped by an error)."""
    return queries.unqueue_sent(ep.handle_text, seqs, through)
