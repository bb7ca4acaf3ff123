"""The dialog engine: exactly-once-in-order dialogs over links (SPEC §4 and §5).

:class:`DialogEngine` composes the parts; it holds no logic of its own beyond wiring
and life cycle (start-up recovery, the tick, shutdown). Each part owns its state and
is handed its collaborators:

* ``endpoints``: :class:`~brokerd.dialogs.endpoints.directory.Directory` (the
  databases and lookups), :class:`~brokerd.dialogs.endpoints.events.DialogEvents`
  (drops and a dialog's life in the trace),
  :class:`~brokerd.dialogs.endpoints.deadlines.Deadlines`;
* ``transmission``: :class:`~brokerd.dialogs.transmission.transmission.Transmission`
  (sending, retransmission, acknowledgements) and the
  :class:`~brokerd.dialogs.transmission.local_link.LocalLink`;
* ``router``: :class:`~brokerd.dialogs.router.router.Router` (where messages go);
* ``arrivals``: :class:`~brokerd.dialogs.arrivals.admission.Admission`,
  :class:`~brokerd.dialogs.arrivals.acknowledgements.Acknowledgements`,
  :class:`~brokerd.dialogs.arrivals.receiving.Arrivals`, the local and remote runs,
  and :class:`~brokerd.dialogs.arrivals.delivery.Delivery` (what becomes ready to
  RECEIVE, the broker's own messages, deadlines firing);
* ``verbs``: :class:`~brokerd.dialogs.verbs.send.SendVerbs`,
  :class:`~brokerd.dialogs.verbs.receive.ReceiveVerbs`,
  :class:`~brokerd.dialogs.verbs.conversation.ConversationVerbs`,
  :class:`~brokerd.dialogs.verbs.begin_keys.BeginKeyVerbs` (BEGIN DIALOG under an
  idempotency key, SPEC §6), :class:`~brokerd.dialogs.verbs.poison.PoisonVerbs`
  (rollback counts and quarantine, SPEC §6) and client transactions;
* :class:`~brokerd.dialogs.images.DatabaseImages` (a mirrored database's image as its
  role changes);
* ``lifetime``: :class:`~brokerd.dialogs.lifetime.cleanup.Cleanup` (closed endpoints
  removed, as :class:`~brokerd.dialogs.endpoints.closing.ClosedEndpoints` says, SPEC §5).

The engine's own methods are its ports, each one line handing on to the part that
owns the work: what a connection delivers (``on_fragments``, ``on_acks``,
``on_corrupted_message``, ``link_up``, ``link_down``, ``inbound_backlog``), what the
local link delivers (:class:`~brokerd.dialogs.transmission.local_link.LocalDelivery`)
and what the router needs of the engine
(:class:`~brokerd.dialogs.router.router.DialogServices`). The application's verbs are
reached through their parts (``send_verbs``, ``receive_verbs``, ``conversation_verbs``,
``begin_keys``, ``poison``, :meth:`transaction`).

Owns R-DLG-1 to R-DLG-13 for the databases of one instance. A *link* is where
fragments go: a network connection to a peer broker (``brokerd.server.transport``) or
the in-process ``LocalLink`` for services of this same instance. The engine never
touches sockets.

May import: every sub-package of ``brokerd.dialogs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace

from brokerd.config import BrokerConfig, RetryConfig
from brokerd.dialogs.arrivals.acknowledgements import Acknowledgements
from brokerd.dialogs.arrivals.admission import Admission
from brokerd.dialogs.arrivals.delivery import Delivery
from brokerd.dialogs.arrivals.fragment_checks import FragmentChecks
from brokerd.dialogs.arrivals.local_arrivals import LocalArrivals
from brokerd.dialogs.arrivals.receiving import Arrivals
from brokerd.dialogs.arrivals.remote_arrivals import Arrived, RemoteArrivals
from brokerd.dialogs.endpoints.closing import ClosedEndpoints
from brokerd.dialogs.endpoints.commits import commit_statements
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.deadlines import Deadlines
from brokerd.dialogs.endpoints.directory import Directory
from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage
from brokerd.dialogs.endpoints.events import DialogEvents
from brokerd.dialogs.endpoints.stats import EngineStats
from brokerd.dialogs.images import DatabaseImages
from brokerd.dialogs.lifetime.cleanup import Cleanup
from brokerd.dialogs.router.router import Router
from brokerd.dialogs.transmission.links import Link, LinkProvider
from brokerd.dialogs.transmission.local_link import LocalLink
from brokerd.dialogs.transmission.transmission import Transmission
from brokerd.dialogs.verbs.begin_keys import BeginKeyVerbs
from brokerd.dialogs.verbs.conversation import ConversationVerbs
from brokerd.dialogs.verbs.poison import PoisonVerbs
from brokerd.dialogs.verbs.receive import ReceiveVerbs
from brokerd.dialogs.verbs.send import SendVerbs
from brokerd.dialogs.verbs.transactions import Transaction
from brokerd.storage.schema import Statement
from brokerd.traces.writer import TraceWriter
from protocol.dialog import DialogHeader

KEYS_FORGOTTEN_EVERY = 60.0
"""Seconds between two passes that forget idempotency keys older than their window."""


class DialogEngine:
    """The parts of the dialog engine, composed (see the module docstring)."""

    def __init__(
        self,
        config: BrokerConfig,
        databases: dict[str, Database],
        links: LinkProvider,
        clock: Callable[[], float] = time.time,
        trace: TraceWriter | None = None,
    ) -> None:
        self.config = config
        self.retry: RetryConfig = config.retry
        self.links = links
        self.trace = trace or TraceWriter(replace(config.trace, enabled=False), "")
        self.stats = EngineStats()
        self._clock = clock
        limits = config.limits
        self.directory = Directory(databases)
        self.databases = self.directory.databases
        self.by_instance = self.directory.by_instance
        self.msdb = self.directory.msdb
        """The directory's maps, by the names the local link and the router know them."""
        # the keep is held in memory only and counted from the close: a monotonic clock,
        # so a wall clock set forward does not end it early (a replay window cut short)
        self.closing = ClosedEndpoints(limits.closed_endpoint_keep, time.monotonic)
        self.events = DialogEvents(self.trace, self.stats, self.closing)
        self.deadlines = Deadlines()
        self.local_link = LocalLink(self)
        self.router = Router(self)
        self.transmission = Transmission(
            self.router,
            self.retry,
            limits.fragment_size,
            self.trace,
            self.stats,
            lambda database: databases[database].broker_instance,
            clock,
            limits,
            lambda database, wanted: databases[database].read_sent_bodies(wanted),
            lambda database, handle, first, last, room: databases[database].read_sent_page(
                handle, first, last, room
            ),
            lambda database: databases[database].service_keys,
        )
        self.delivery = Delivery(
            self.directory,
            self.events,
            self.transmission,
            self.deadlines,
            self.router,
            self.trace,
            self.stats,
            clock,
        )
        self.admission = Admission(
            self.directory,
            self.events,
            self.transmission,
            self.stats,
            limits.max_message_size,
            limits.closed_endpoint_keep,
            clock,
        )
        self.acks = Acknowledgements(
            self.directory,
            self.admission,
            self.events,
            self.transmission,
            self.router,
            self.local_link,
            self.trace,
            self.stats,
        )
        self.arrivals = Arrivals(
            self.directory,
            self.admission,
            self.acks,
            self.delivery,
            FragmentChecks(self.events, self.stats),
            self.events,
            self.transmission,
            self.router,
            self.deadlines,
            self.trace,
            self.stats,
            clock,
        )
        self.local_arrivals = LocalArrivals(self.arrivals, self.transmission)
        self.remote_arrivals = RemoteArrivals(
            self.arrivals, self.directory, self.router, self.trace, self.stats
        )
        self.send_verbs = SendVerbs(
            self.directory,
            self.transmission,
            self.delivery,
            self.events,
            self.trace,
            self.stats,
            clock,
            limits.fragment_size,
            limits.max_message_size,
            limits.send_key_window,
        )
        self.receive_verbs = ReceiveVerbs(self.directory, self.trace, self.stats)
        self.conversation_verbs = ConversationVerbs(
            self.directory,
            self.send_verbs,
            self.transmission,
            self.events,
            self.deadlines,
            clock,
        )
        self.begin_keys = BeginKeyVerbs(
            self.directory, self.conversation_verbs, clock, limits.send_key_window
        )
        self.poison = PoisonVerbs(self.directory, self.conversation_verbs, self.events, clock)
        self.images = DatabaseImages(self.transmission, self.router, self.deadlines)
        self.cleanup = Cleanup(self.directory, self.closing, self.transmission, self.stats, clock)
        self._ticker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- life cycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Recover every database's image (a mirror holds none: its promotion builds it),
        start routing, transmission and the tick, and send what waited."""
        self._loop = asyncio.get_running_loop()
        self.directory.start()
        waiting: list[Endpoint] = []
        for db in self.databases.values():
            if db.mirror_role != "mirror":
                waiting += await db.recover()
        self.router.start()
        owed = []
        for db in self.databases.values():
            for ep in db.endpoints.values():
                if ep.ack_version > ep.ack_sent_version:
                    owed.append(ep)
                self.deadlines.watch(ep)
        self.transmission.start(self._loop, owed)
        self.cleanup.watch_all()
        self._ticker = self._loop.create_task(self._tick(), name="engine-retransmit")
        for ep in waiting:
            self.transmission.transmit(ep)

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        self.local_link.close()
        self.transmission.stop()

    async def _tick(self) -> None:
        """Retransmissions, the router's periodic work, timers and lifetimes due, and
        closed endpoints removed."""
        interval = max(0.01, min(0.1, self.retry.initial / 4))
        keys_forgotten = self._clock()
        while True:
            await asyncio.sleep(interval)
            self.transmission.wake_due()
            self.router.tick()
            now = self._clock()
            self.delivery.fire_due(now)
            self.cleanup.tick(now)
            if now - keys_forgotten >= KEYS_FORGOTTEN_EVERY:
                keys_forgotten = now
                self.send_verbs.forget_old_keys(now)
                self.begin_keys.forget_old_keys(now)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "engine not started"
        return self._loop

    def transaction(self, tx_id: int) -> Transaction:
        """A new client transaction over this engine's verbs."""
        return Transaction(
            self.directory,
            self.conversation_verbs,
            self.send_verbs,
            self.receive_verbs,
            self.poison,
            tx_id,
        )

    def outbound_view(self) -> dict[str, int]:
        """Where the unacknowledged messages are (R-DLG-13), and transmission's counts."""
        return {**self.directory.outbound_counts(), **self.transmission.view()}

    # -- ports: what a connection delivers ------------------------------------------------

    def on_fragments(self, link: Link, fragments: list[Arrived]) -> None:
        self.remote_arrivals.on_fragments(link, fragments)

    def on_acks(self, link: Link, headers: list[DialogHeader]) -> None:
        self.acks.on_acks(link, headers)

    def on_corrupted_message(self, link: Link, reason: str) -> None:
        self.arrivals.on_corrupted_message(link, reason)

    def link_up(self, link: Link, waiting: Iterable[Endpoint]) -> None:
        self.transmission.link_up(link, waiting)

    def link_down(self, link: Link, endpoints: Iterable[Endpoint]) -> None:
        self.transmission.link_down(link, endpoints)

    def inbound_backlog(self) -> int:
        return self.directory.inbound_backlog()

    # -- ports: what the local link delivers (LocalDelivery) ------------------------------

    def on_local_fragments(
        self,
        link: Link,
        sender: Endpoint,
        pieces: list[tuple[OutMessage, int]],
        db: Database | None,
    ) -> None:
        self.local_arrivals.on_local_fragments(link, sender, pieces, db)

    def on_fragment(
        self, link: Link, header: DialogHeader, body: bytes, db: Database | None = None
    ) -> None:
        self.arrivals.on_fragment(link, header, body, db)

    def transmit(self, ep: Endpoint) -> None:
        self.transmission.transmit(ep)

    # -- ports: what the router needs (DialogServices) ------------------------------------

    def database(self, name: str) -> Database:
        return self.directory.database(name)

    def endpoint(self, handle: uuid.UUID) -> tuple[Database, Endpoint]:
        return self.directory.endpoint(handle)

    def drop(self, header: DialogHeader, reason: str) -> None:
        self.events.drop(header, reason)

    def note_drop(self, text: str) -> None:
        self.events.note_drop(text)

    async def submit_wait(self, db: Database, statements: list[Statement]) -> None:
        await commit_statements(db, statements)

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
        return await self.conversation_verbs.begin_dialog(
            from_service,
            to_service,
            contract,
            database,
            to_broker_instance,
            lifetime,
            related_conversation,
        )

    async def send(self, handle: uuid.UUID, message_type: str, body: bytes) -> int:
        return await self.send_verbs.send(handle, message_type, body)

    async def end_conversation(
        self,
        handle: uuid.UUID,
        error_code: int | None = None,
        description: str = "",
        cleanup: bool = False,
    ) -> None:
        await self.conversation_verbs.end_conversation(handle, error_code, description, cleanup)

    async def discard_received(self, ep: Endpoint) -> None:
        await self.conversation_verbs.discard_received(ep)

    async def rebuild(self, db: Database) -> list[Statement]:
        return await self.images.rebuild(db)

    async def inherited(self, db: Database) -> None:
        """A promoted partner's evidence of what its file holds (``inherited`` events),
        on disk before it serves (R-ROUTE-16, R-TRACE-5; docs/traces.md)."""
        self.events.inherited(db.endpoints.values())
        barrier = self.trace.barrier()
        if barrier is not None:
            await asyncio.shield(barrier)  # shared with commits' outcomes

    def watch_deadlines(self, db: Database) -> None:
        self.images.watch_deadlines(db)

    def forget_image(self, db: Database) -> None:
        self.images.forget(db)

    def resume(self, db: Database) -> None:
        self.images.resume(db)
