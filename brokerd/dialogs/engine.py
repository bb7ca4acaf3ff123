"""The dialog engine: exactly-once-in-order dialogs over links (SPEC §4 and §5).

:class:`DialogEngine` joins the parts, each in its own module: ``core`` (state,
lookups, commits), ``verbs`` (the application's verbs), ``receiving`` (what
arrives from links), ``local_arrivals`` (what the local link hands over),
``transmission`` (sending, retransmission, acknowledgements),
``deadlines`` (timers and lifetimes), ``states`` (the endpoint state machine).
This module adds the life cycle and the tick that drives retransmissions,
timers and lifetimes.

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

Where messages go is the router's business (``brokerd.dialogs.router.router``, SPEC §2): the
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
from collections.abc import Callable

from brokerd.config import BrokerConfig
from brokerd.dialogs.arrivals.local_arrivals import LocalArrivals
from brokerd.dialogs.arrivals.remote_arrivals import RemoteArrivals
from brokerd.dialogs.core import (
    CODE_LIFETIME_EXPIRED,
    error_body,
)
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.deadlines import Deadline
from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.endpoints.states import State
from brokerd.dialogs.router.router import Router
from brokerd.dialogs.transmission.links import LinkProvider
from brokerd.dialogs.transmission.local_link import LocalLink
from brokerd.dialogs.transmission.transmission import Transmission
from brokerd.dialogs.verbs.conversation import ApplicationVerbs
from brokerd.storage import queries
from brokerd.storage.catalog import route_from_row
from brokerd.traces.writer import TraceWriter
from protocol.dialog import (
    DIALOG_TIMER,
)

__all__ = ["CODE_LIFETIME_EXPIRED", "DialogEngine"]

log = logging.getLogger("brokerd.dialogs.engine")


class DialogEngine(ApplicationVerbs, LocalArrivals, RemoteArrivals):
    def __init__(
        self,
        config: BrokerConfig,
        databases: dict[str, Database],
        links: LinkProvider,
        clock: Callable[[], float] = time.time,
        trace: TraceWriter | None = None,
    ) -> None:
        super().__init__(config, databases, links, clock, trace)
        self.local_link = LocalLink(self)
        self.router = Router(self)
        self.transmission = Transmission(
            self.router,
            self.retry,
            self.fragment_size,
            self.trace,
            self.stats,
            lambda database: self.databases[database].broker_instance,
            clock,
            config.limits,
            self._read_bodies,
            self._read_page,
            lambda database: self.databases[database].service_keys,
        )

    async def _read_bodies(
        self, database: str, wanted: dict[str, list[int]]
    ) -> dict[tuple[str, int], bytes]:
        """Bodies of unacknowledged messages, read back in a job of the database's committer
        (ordered after every write already submitted)."""
        store = self.databases[database].store
        return await store.run(lambda conn: queries.read_sent_bodies(conn, wanted))

    async def _read_page(
        self, database: str, handle: str, first: int, last: int, body_room: int
    ) -> tuple[list[queries.SentRow], dict[int, bytes]]:
        """A page of an endpoint's backlog, read in a job of the database's committer, and
        its bodies by sequence number if they take no more than ``body_room`` bytes: read
        ahead, a window's refill then waits for no read (else none; each is read back when
        it is sent)."""

        def read(conn: sqlite3.Connection) -> tuple[list[queries.SentRow], dict[int, bytes]]:
            rows = queries.read_sent_page(conn, handle, first, last)
            if not rows or sum(row[3] for row in rows) > body_room:
                return rows, {}
            found = queries.read_sent_bodies(conn, {handle: [row[0] for row in rows]})
            return rows, {seq: body for (_, seq), body in found.items()}

        return await self.databases[database].store.run(read)

    def outbound_view(self) -> dict[str, int]:
        """Where the unacknowledged messages are: objects in memory, or only numbers (a
        backlog paged in as links have room, R-DLG-13)."""
        in_memory = in_file = 0
        for db in self.databases.values():
            for ep in db.endpoints.values():
                in_memory += len(ep.outbox)
                in_file += ep.backlog.count
        return {
            "outbound_in_memory": in_memory,
            "outbound_in_file_only": in_file,
            **self.transmission.view(),
        }

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        waiting: list[Endpoint] = []
        for db in self.databases.values():
            self.by_instance[db.broker_instance] = db
            if db.mirror_role != "mirror":  # a mirror holds no image: its promotion builds it
                waiting += await db.recover()
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

    def forget_image(self, db: Database) -> None:
        """A partner that is no longer principal drops its in-memory image of the database
        (R-ROUTE-15/16): its file now changes only by what the principal ships, so the
        image would only go stale (views listing messages long delivered, deadlines firing).
        Its endpoints lose their outbox (a connection still holding one of their fragments
        skips it), and their deadlines no longer match (``_fire_deadlines`` checks the
        endpoint is the database's)."""
        db.image += 1
        for ep in list(db.endpoints.values()):
            self.transmission.forget(ep)
            db.remove_endpoint(ep)
        for index in db.ready.values():
            index.clear()
            index.locked.clear()
        db.next_local_seq = -1

    def resume(self, db: Database) -> None:
        """The database's traffic may flow again (a promotion, or a principal out of doubt,
        R-ROUTE-16): every routing decision is made again, every waiting message is
        transmitted and every acknowledgement owed is sent."""
        self.router.forget_decisions()
        for ep in db.endpoints.values():
            if ep.ack_version > ep.ack_sent_version:
                self.transmission.ack_needed(ep)
            if ep.has_unacknowledged:
                ep.route_link = None
                self.transmit(ep)

    async def rebuild(self, db: Database) -> list[Endpoint]:
        """R-ROUTE-16: a promoted mirror's in-memory image, rebuilt from its file as recovery
        does at start: its endpoints, unacknowledged messages, ready index, timers and
        lifetimes, routes created by the administrator and queue states are the ones the
        principal's shipped units wrote. Returns the endpoints with messages to transmit.
        Any image held before is dropped first (:meth:`forget_image`)."""
        self.forget_image(db)
        for name, status, configured in await db.store.read(
            lambda conn: conn.execute(queries.READ_QUEUE_STATES).fetchall()
        ):
            info = db.catalog.queues.get(str(name))
            if info is not None:
                info.keep_altered(bool(status), None if configured is None else bool(configured))
        for row in await db.store.read(
            lambda conn: conn.execute(queries.READ_ADMIN_ROUTES).fetchall()
        ):
            route = route_from_row(row)
            db.catalog.routes[route.name] = route
        waiting = await db.recover()
        for ep in db.endpoints.values():
            if ep.ack_version > ep.ack_sent_version:
                self.transmission.ack_needed(ep)
            self._watch(ep)
        for index in db.ready.values():
            index.changed.set()
        self.router.routes_changed(db)
        return waiting

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        self.local_link.close()
        self.transmission.stop()

    async def _tick(self) -> None:
        interval = max(0.01, min(0.1, self.retry.initial / 4))
        while True:
            await asyncio.sleep(interval)
            self.transmission.wake_due()
            self.router.tick()
            self._fire_deadlines(self.clock())

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
        reason = "the dialog's lifetime passed"
        self.trace.emit(
            "lifetime_expired",
            ep.conversation_id,
            database=db.name,
            initiator=ep.initiator,
            reason=reason,
        )
        body = error_body(CODE_LIFETIME_EXPIRED, "The dialog has exceeded its lifetime.")
        self._fail_locally(db, ep, body, reason)
