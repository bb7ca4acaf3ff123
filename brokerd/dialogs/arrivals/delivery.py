"""What becomes ready to RECEIVE: messages released in order, and the messages this
broker makes for an endpoint's own side (SPEC §5, §6; R-DLG-1, R-DLG-9, R-DLG-10,
R-DLG-11).

Owns:

* making released messages ready in their queue's index (the other side's Error
  ahead of the conversation's waiting messages, R-DLG-10), traced ``delivered``;
* the broker's own messages to an endpoint's side, numbered from
  ``Database.next_local_seq``: a DialogTimer when a conversation timer fires
  (R-DLG-11), and an Error when the broker ends a dialog (its lifetime passed,
  R-DLG-9, or the far broker reported an error): unacknowledged messages are then
  dropped and new ones refused (state ER);
* firing the deadlines :class:`~brokerd.dialogs.endpoints.deadlines.Deadlines` says
  are due;
* refusing inbound traffic for a database after a failed write, until its memory
  matches its file again.

May import: ``brokerd.dialogs.transmission``, ``brokerd.dialogs.endpoints`` and what
they may import; the router only through :class:`RequestEnds`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from brokerd.dialogs.endpoints.broker_errors import CODE_LIFETIME_EXPIRED, error_body
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.deadlines import Deadline, Deadlines
from brokerd.dialogs.endpoints.directory import Directory
from brokerd.dialogs.endpoints.endpoint import (
    Endpoint,
    endpoint_snapshot,
    queue_row,
    unqueue_sent,
)
from brokerd.dialogs.endpoints.events import DialogEvents
from brokerd.dialogs.endpoints.ready import Rank, ReadyIndex, rank_of
from brokerd.dialogs.endpoints.states import DELIVERING, State
from brokerd.dialogs.endpoints.stats import EngineStats
from brokerd.dialogs.transmission.transmission import Transmission
from brokerd.errors import StoreError
from brokerd.storage import queries
from brokerd.storage.catalog import ROUTE_REQUESTER_SERVICE
from brokerd.storage.queries import ENDPOINT_SNAPSHOT
from brokerd.storage.schema import Statement
from brokerd.traces.writer import TraceWriter
from protocol.dialog import DIALOG_TIMER, ERROR

log = logging.getLogger("brokerd.dialogs.engine")

RETRY_FIRST = 1.0
"""Seconds before a message the broker queues itself, whose commit failed, is tried again."""
RETRY_MOST = 30.0
"""The longest wait between two tries of it."""


class RequestEnds(Protocol):
    """The router, told when a dialog of the dynamic routing service ends (R-ROUTE-14)."""

    def request_ended(self, ep: Endpoint) -> None: ...


class Delivery:
    """Messages made ready to RECEIVE, and the broker's own (see the module docstring)."""

    def __init__(
        self,
        directory: Directory,
        events: DialogEvents,
        transmission: Transmission,
        deadlines: Deadlines,
        requests: RequestEnds,
        trace: TraceWriter,
        stats: EngineStats,
        clock: Callable[[], float],
    ) -> None:
        self.directory = directory
        self.events = events
        self.transmission = transmission
        self.deadlines = deadlines
        self.requests = requests
        self.trace = trace
        self.stats = stats
        self.clock = clock

    def delivered(
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

    def fail_locally(
        self,
        db: Database,
        ep: Endpoint,
        body: bytes,
        why: str,
        traced: Callable[[], None] | None = None,
    ) -> None:
        """The broker ends the dialog with an error: the Error goes to this side's queue,
        unacknowledged messages are dropped, new messages are refused (state ER). Once
        that commits, ``traced`` runs, then what it discarded and closed is traced."""
        if ep.broker_error or ep.state is State.CLOSED:
            return
        ep.broker_error = True
        dropped = list(ep.outbox)
        runs = ep.backlog.spans()
        discarded = [*dropped, *ep.backlog]
        self.transmission.discard(ep)
        ep.refresh_state()

        def committed() -> None:
            # R-TRACE-1: traced once the commit removed them (and closed the endpoint)
            if traced is not None:
                traced()
            self.events.discarded(ep, discarded, why)
            self.events.closed(ep)
            if ep.service == ROUTE_REQUESTER_SERVICE:
                self.requests.request_ended(ep)

        self.queue_local(
            db,
            ep,
            ERROR,
            body,
            [*unqueue_sent(ep, dropped, runs=runs), endpoint_snapshot(ep)],
            committed,
        )

    def queue_local(
        self,
        db: Database,
        ep: Endpoint,
        message_type: str,
        body: bytes,
        extra: list[Statement],
        then: Callable[[], None] | None = None,
        wait: float = RETRY_FIRST,
    ) -> None:
        """Queue a message this broker makes for the endpoint's own side (a broker Error, a
        DialogTimer), numbered from ``Database.next_local_seq``, with ``extra`` statements
        in the same transaction; ``then`` runs once it is committed.

        Nobody waits for it, so a commit that fails is tried again after ``wait`` seconds
        (doubled each time, up to :data:`RETRY_MOST`) while the endpoint is its
        database's: the DialogTimer of a timer that fired, or the Error of a dialog the
        broker ended, is not lost for the rest of the process (R-DLG-9, R-DLG-11)."""
        if ep.state not in DELIVERING:  # this side has ended: nothing more reaches it
            db.store.submit(extra, on_commit=then)
            return
        seq = db.next_local_seq
        db.next_local_seq -= 1
        queue = db.queue_of(ep.service) or ""
        index = db.ready.get(queue)
        # An Error's endpoint shows ER already: its group waits for it (R-DLG-10).
        coming = ep.group_id if message_type == ERROR and index is not None else None
        if coming is not None:
            assert index is not None
            index.error_coming(coming)

        def committed() -> None:
            # an END committed with it or before removed its row again (SPEC §6, R-DLG-10)
            if index is not None and ep.state in DELIVERING:
                index.add(ep.group_id, ep.handle, seq, rank_of(message_type))
            if coming is not None:
                assert index is not None
                index.error_settled(coming)
            if then is not None:
                then()

        def failed(exc: BaseException) -> None:
            log.error(
                "store error while queueing a message for %s: %s; trying again in %.0f s",
                db.name,
                exc,
                wait,
            )
            if coming is not None:
                assert index is not None
                index.error_settled(coming)

            def again() -> None:
                if db.endpoints.get(ep.handle) is not ep:
                    return  # removed, or its image dropped
                # the endpoint's row as it is now, not as it was (an END may have followed)
                fresh = [
                    endpoint_snapshot(ep) if statement[0] == ENDPOINT_SNAPSHOT else statement
                    for statement in extra
                ]
                later = min(RETRY_MOST, 2 * wait)
                try:
                    self.queue_local(db, ep, message_type, body, fresh, then, later)
                except StoreError:  # stopping: the file keeps what makes it again at start
                    log.info("not queueing a message for %s again: its store is closed", db.name)

            asyncio.get_running_loop().call_later(wait, again)

        db.store.submit(
            [queue_row(ep, queue, seq, 1, message_type, len(body), body, self.clock()), *extra],
            on_commit=committed,
            on_failure=failed,
        )

    def suspend_receiving(self, db: Database) -> None:
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
                self.suspend_receiving(db)
                return
            self.events.reloaded(db.name, db.endpoints)
            db.rx_suspended = False

        asyncio.get_running_loop().create_task(reload())

    def fire_due(self, now: float) -> None:
        """Fire every timer and lifetime due at ``now`` that still applies (a timer may
        have been replaced, an endpoint closed or its image dropped)."""
        databases = self.directory.databases
        for kind, due, ep in self.deadlines.due(now):
            db = databases[ep.database]
            if db.endpoints.get(ep.handle) is not ep or ep.state is State.CLOSED:
                continue
            if kind is Deadline.TIMER and ep.timer_due == due:
                self._fire_timer(db, ep)
            elif kind is Deadline.LIFETIME and ep.lifetime_ends == due:
                self._expire(db, ep)

    def _fire_timer(self, db: Database, ep: Endpoint) -> None:
        due, ep.timer_due = ep.timer_due, 0.0

        def committed() -> None:  # the DialogTimer is in the queue (R-TRACE-1)
            self.trace.emit(
                "timer_fired",
                ep.conversation_id,
                database=db.name,
                initiator=ep.initiator,
                queue=db.queue_of(ep.service),
            )

        self.queue_local(
            db, ep, DIALOG_TIMER, b"", [queries.forget_timer(ep.handle_text, due)], committed
        )

    def _expire(self, db: Database, ep: Endpoint) -> None:
        if ep.broker_error:
            return
        reason = "the dialog's lifetime passed"

        def committed() -> None:  # the timeout Error is in the queue (R-TRACE-1)
            self.trace.emit(
                "lifetime_expired",
                ep.conversation_id,
                database=db.name,
                initiator=ep.initiator,
                reason=reason,
            )

        body = error_body(CODE_LIFETIME_EXPIRED, "The dialog has exceeded its lifetime.")
        self.fail_locally(db, ep, body, reason, committed)
