"""The application's verbs (SPEC §6, R-DLG-3, R-DLG-11, R-DLG-12).

BEGIN DIALOG, SEND (checked against the contract and the message type's
validation), END CONVERSATION (all forms), MOVE CONVERSATION, RECEIVE (a
:class:`~brokerd.dialogs.endpoints.database.Lease` on one conversation group), BEGIN
CONVERSATION TIMER and ALTER QUEUE. Each verb has a ``*_work`` form that checks,
changes memory and returns a :class:`~brokerd.dialogs.endpoints.work.Work`, and an
awaitable form that commits it alone; a client transaction commits several.
SEND and RECEIVE, the verbs of every message, are parts of their own
(:mod:`brokerd.dialogs.verbs.send`, :mod:`brokerd.dialogs.verbs.receive`); an ending is
queued on the dialog by :class:`~brokerd.dialogs.verbs.send.SendVerbs`.

May import: :mod:`brokerd.dialogs.verbs.send`, ``brokerd.dialogs.transmission``,
``brokerd.dialogs.endpoints`` and what they may import.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from typing import Any

from brokerd.config import INT_MAX
from brokerd.dialogs.endpoints.broker_errors import error_body
from brokerd.dialogs.endpoints.commits import commit, commit_statements
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.deadlines import Deadlines
from brokerd.dialogs.endpoints.directory import Directory
from brokerd.dialogs.endpoints.endpoint import (
    Endpoint,
    endpoint_deletion,
    endpoint_snapshot,
    unqueue_sent,
)
from brokerd.dialogs.endpoints.events import DialogEvents
from brokerd.dialogs.endpoints.service_keys import new_dialog_key
from brokerd.dialogs.endpoints.states import State
from brokerd.dialogs.endpoints.work import Work
from brokerd.dialogs.transmission.transmission import Transmission
from brokerd.dialogs.verbs import transmission_rows, views
from brokerd.dialogs.verbs.paging import PageRequest
from brokerd.dialogs.verbs.send import SendVerbs
from brokerd.errors import (
    ContractViolation,
    ConversationEnded,
    DialogSecurityUnavailable,
    InvalidErrorCode,
    InvalidRequest,
    LockConflict,
    NotPrincipal,
    ServiceNotFound,
)
from brokerd.storage import queries
from brokerd.storage.keys import new_handle, random_id
from protocol.dialog import END_DIALOG, ERROR, FLAG_END_DIALOG, FLAG_ERROR, FLAG_SEQUENCED
from protocol.dialog_security import DialogKeys


class ConversationVerbs:
    """BEGIN DIALOG, END CONVERSATION, MOVE CONVERSATION, the timer, ALTER QUEUE, and the
    transmission queue's view."""

    def __init__(
        self,
        directory: Directory,
        sending: SendVerbs,
        transmission: Transmission,
        events: DialogEvents,
        deadlines: Deadlines,
        clock: Callable[[], float],
    ) -> None:
        self.directory = directory
        self.sending = sending
        self.transmission = transmission
        self.events = events
        self.deadlines = deadlines
        self.clock = clock

    def new_dialog(
        self,
        from_service: str,
        to_service: str,
        contract: str,
        database: str | None = None,
        to_broker_instance: uuid.UUID | None = None,
        lifetime: int = 0,
        related_conversation: uuid.UUID | None = None,
        related_group: uuid.UUID | None = None,
    ) -> tuple[Database, Endpoint]:
        """BEGIN DIALOG's checks and the new initiator endpoint, not registered yet.

        The endpoint joins ``related_conversation``'s conversation group, or the group
        ``related_group`` (RELATED_CONVERSATION_GROUP: a group is made by naming it,
        SPEC §6), or a new group; not both."""
        if related_conversation is not None and related_group is not None:
            raise InvalidRequest(
                "BEGIN DIALOG takes a related conversation or a related conversation group, "
                "not both"
            )
        db = self.initiating_database(from_service, database)
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
        keys = None
        service_keys = db.service_keys
        if service_keys.secured(from_service, to_service):
            problem = service_keys.plan(from_service, to_service)
            if problem is not None:
                raise DialogSecurityUnavailable(
                    f"a dialog from {from_service!r} to {to_service!r} must be secured "
                    f"(R-DLG-14), but {problem}"
                )
            keys = DialogKeys(new_dialog_key())
        group = related_group or random_id()
        if related_conversation is not None:
            group = self.directory.endpoint(related_conversation)[1].group_id
        ep = Endpoint(
            handle=new_handle(),
            conversation_id=random_id(),
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
            keys=keys,
        )
        return db, ep

    def initiating_database(self, from_service: str, database: str | None) -> Database:
        """The database a BEGIN DIALOG works in: the one named, or the initiating
        service's."""
        if database:
            return self.directory.database(database)
        return self.directory.database_of_service(from_service)

    def begin_dialog_work(self, db: Database, ep: Endpoint) -> Work:
        """Register the endpoint from :meth:`new_dialog`; forgotten if the work fails."""
        db.add_endpoint(ep)

        def committed() -> None:
            self.deadlines.watch(ep)
            self.events.begun(ep)

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
        related_group: uuid.UUID | None = None,
    ) -> Endpoint:
        db, ep = self.new_dialog(
            from_service,
            to_service,
            contract,
            database,
            to_broker_instance,
            lifetime,
            related_conversation,
            related_group,
        )
        await commit(db, self.begin_dialog_work(db, ep))
        return ep

    def _arrivals_settled(
        self, db: Database, ep: Endpoint, seqs: list[int], queue: str | None = None
    ) -> None:
        """The other side's messages ``seqs`` committed into ``ep``'s queue while its END
        was committing (``ReadyIndex.arrived_ending``): gone with the END (``queue`` None),
        or, the END failed, ready in ``queue`` (R-DLG-1, R-TRACE-1)."""
        if not seqs:
            return
        if queue is None:
            self.events.discarded(ep, seqs, "this side has ended the conversation", received=True)
            return
        self.events.trace.emit_each(
            "delivered",
            ep.conversation_id,
            "seq",
            seqs,
            database=db.name,
            initiator=not ep.initiator,
            queue=queue,
        )
        self.events.stats.delivered_messages += len(seqs)

    @staticmethod
    def check_end(error_code: int | None, cleanup: bool = False) -> None:
        """END CONVERSATION's check: WITH ERROR takes a code greater than 0; the codes
        below zero are the broker's own (SPEC §6). A code is SQL Server's INT: at most
        :data:`INT_MAX`."""
        if error_code is not None and not cleanup and error_code <= 0:
            raise InvalidErrorCode(
                f"END CONVERSATION WITH ERROR needs a code greater than 0, not {error_code}: "
                "codes of 0 and below are the broker's own"
            )
        if error_code is not None and not cleanup and error_code > INT_MAX:
            raise InvalidErrorCode(
                f"END CONVERSATION WITH ERROR takes a code of at most {INT_MAX} (an "
                f"INT), not {error_code}"
            )

    def end_conversation_work(
        self,
        db: Database,
        ep: Endpoint,
        error_code: int | None = None,
        description: str = "",
        cleanup: bool = False,
    ) -> Work:
        self.check_end(error_code, cleanup)
        if cleanup:
            return self._cleanup_work(db, ep)
        if ep.ended_local or ep.state is State.CLOSED:
            return Work()
        ep.ended_local = True
        dropped = dict(ep.outbox)
        dropped_runs = ep.backlog.spans()
        dropped_seqs = [*dropped, *ep.backlog]
        # SENDs numbered and not committed yet (earlier in its transaction, or in flight),
        # but those that went straight into the far side's queue (its endpoint took their
        # numbers already: they are delivered as they commit, R-DLG-13)
        far = db.by_key.get((ep.conversation_id, not ep.initiator))
        taken = far.accepted.through if far is not None else 0
        unsent = range(
            max(ep.send_sequence - ep.uncommitted_sends, taken) + 1, ep.send_sequence + 1
        )
        queue = db.queue_of(ep.service)
        index = db.ready.get(queue) if queue else None
        unreceived = index.drop_conversation(ep.handle) if index is not None else []
        settles = index is not None and index.end_begins(ep.handle)

        def committed() -> None:
            if settles and index is not None:
                self._arrivals_settled(db, ep, index.end_settled(ep.handle, committed=True))

        def failed(_: BaseException) -> None:
            ep.ended_local = False
            ep.dropped_before = 0
            ep.outbox.update(dropped)
            ep.backlog.restore(dropped_runs)
            ep.refresh_state(undo=True)
            if index is not None:
                for group, items in unreceived:
                    index.put_back(group, items)
                if settles:  # taken before, given back meanwhile: in front of those
                    late = index.end_settled(ep.handle, committed=False)
                    self._arrivals_settled(db, ep, late, queue)

        # SPEC §6, R-DLG-10: what waits in this side's queue goes, and nothing more comes.
        work = Work().add(queries.discard_queued(ep.handle_text), committed, failed)
        # R-TRACE-1: the messages are discarded once this commits (a client transaction
        # rolled back at its COMMIT leaves them in the transmission queue)
        if ep.broker_error:
            why = "END CONVERSATION after a broker error"
            work.add(on_commit=lambda: self.events.discarded(ep, dropped_seqs, why))
            self.transmission.discard(ep)
            if ep.refresh_state():
                work.add(on_commit=lambda: self.events.closed(ep))  # dialog_ended, too
            return work.add([endpoint_snapshot(ep)])
        if ep.initiator and not ep.send_sequence:
            # SPEC §6: nothing crosses the network before the first SEND, so the far
            # service never heard of the dialog (R-DLG-9): no EndDialog or Error goes to
            # it, and the endpoint closes at once, owing nothing (SPEC §5).
            if ep.refresh_state():
                work.add(on_commit=lambda: self.events.closed(ep))  # dialog_ended, too
            return work.add([endpoint_snapshot(ep)])
        if error_code is not None:
            why = "END CONVERSATION WITH ERROR"
            gone = [*dropped_seqs, *unsent]
            work.add(on_commit=lambda: self.events.discarded(ep, gone, why))
            self.transmission.discard(ep)
            # R-DLG-10: the SENDs not committed yet are dropped too (their commit keeps
            # them out of the transmission queue, ``SendVerbs``; their rows go here)
            ep.dropped_before = ep.send_sequence + 1
            runs = [*dropped_runs, (unsent.start, unsent.stop - 1)] if unsent else dropped_runs
            _, enqueued = self.sending.enqueue_work(
                db,
                ep,
                ERROR,
                FLAG_SEQUENCED | FLAG_ERROR,
                error_body(error_code, description),
                unqueue_sent(ep, list(dropped), runs=runs),
            )
        else:
            _, enqueued = self.sending.enqueue_work(
                db, ep, END_DIALOG, FLAG_SEQUENCED | FLAG_END_DIALOG, b""
            )
        return work.extend(enqueued)

    async def end_conversation(
        self,
        handle: uuid.UUID,
        error_code: int | None = None,
        description: str = "",
        cleanup: bool = False,
    ) -> None:
        db, ep = self.directory.endpoint(handle)
        work = self.end_conversation_work(db, ep, error_code, description, cleanup)
        if work.statements:
            await commit(db, work)

    def _cleanup_work(self, db: Database, ep: Endpoint) -> Work:
        """END CONVERSATION WITH CLEANUP: the endpoint shows closed at once (the later verbs
        of its transaction find it ended, and nothing more is received of it); it leaves
        memory, with what it had not sent, once its rows' removal commits, and what it
        discarded, and its end, are traced then (R-TRACE-1). A work that fails (a client
        transaction rolled back) leaves it as it was (SPEC §6)."""
        before, timer = ep.state, ep.timer_due
        ep.state = State.CLOSED
        ep.timer_due = 0.0
        queue = db.queue_of(ep.service)
        index = db.ready.get(queue) if queue else None
        aside = list(index.aside[ep.handle]) if index and ep.handle in index.aside else None
        ranks = {
            item: rank
            for item, rank in (index.ahead.items() if index is not None else ())
            if item[0] == ep.handle
        }
        unreceived = index.drop_conversation(ep.handle) if index is not None else []
        settles = index is not None and index.end_begins(ep.handle)

        def committed() -> None:
            if settles and index is not None:
                self._arrivals_settled(db, ep, index.end_settled(ep.handle, committed=True))
            self.events.discarded(ep, [*ep.outbox, *ep.backlog], "END CONVERSATION WITH CLEANUP")
            self.transmission.discard(ep)
            self.events.closed(ep, removed=True)
            db.remove_endpoint(ep)

        def failed(_: BaseException) -> None:
            ep.state, ep.timer_due = before, timer
            self.deadlines.watch(ep)  # what came due meanwhile found it closed
            if index is not None:
                index.ahead.update(ranks)  # a DialogTimer or Error still goes ahead
                if aside is not None:
                    index.aside[ep.handle] = aside
                for group, items in unreceived:
                    index.put_back(group, items)
                if settles:  # taken before, given back meanwhile: in front of those
                    late = index.end_settled(ep.handle, committed=False)
                    self._arrivals_settled(db, ep, late, queue)

        return Work().add(
            [*queries.forget_conversation(ep.handle_text), endpoint_deletion(ep)],
            committed,
            failed,
        )

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

        Its waiting messages move with it; no reader takes from ``group`` until the
        commit is done (a failed MOVE takes them back whole). Refused while another
        transaction holds either group (its messages are being received).
        """
        old = ep.group_id
        if old == group:
            return Work()
        self.check_move(db, ep, group, owned)
        queue = db.queue_of(ep.service)
        index = db.ready.get(queue) if queue else None
        ep.group_id = group
        if index is not None:
            index.move_conversation(ep.handle, old, group)  # not taken from until settled

        def committed() -> None:
            if index is not None:
                index.move_settled(group)

        def failed(_: BaseException) -> None:
            ep.group_id = old
            if index is not None:
                index.move_back(ep.handle, group, old)

        return Work().add(
            [queries.regroup(ep.handle_text, ep.group_text), endpoint_snapshot(ep)],
            committed,
            failed,
        )

    async def move_conversation(self, handle: uuid.UUID, group: uuid.UUID) -> None:
        db, ep = self.directory.endpoint(handle)
        await commit(db, self.move_conversation_work(db, ep, group))

    async def discard_received(self, ep: Endpoint) -> None:
        """Remove what ``ep`` received from its queue (system dialogs consume their replies)."""
        db = self.directory.databases[ep.database]
        queue = db.queue_of(ep.service)
        if queue in db.ready:
            db.ready[queue].drop_conversation(ep.handle)
        await commit_statements(db, queries.discard_received(ep.handle_text))

    async def alter_queue(self, queue: str, status: bool, database: str | None = None) -> None:
        """ALTER QUEUE ... WITH STATUS = ON | OFF (R-DLG-12).

        While a queue is off, messages for it are still accepted, stored and
        acknowledged, but RECEIVE refuses; turning it on makes them receivable.
        """
        db = self.directory.database_of_queue(queue, database)
        info = db.catalog.queues[queue]
        await commit_statements(db, [queries.set_queue_status(queue, status)])
        info.status = status
        db.ready[queue].changed.set()  # on: waiters take; off: waiters leave (R-DLG-12)

    async def transmission_queue(self, request: PageRequest | None = None) -> list[dict[str, Any]]:
        """The ``transmission_queue`` view (:func:`transmission_rows.transmission_queue`)."""
        return await transmission_rows.transmission_queue(
            list(self.directory.databases.values()), request
        )

    async def transmission_backlog(self, listed: int) -> views.TransmissionBacklog:
        """The transmission queue as the admin port shows it
        (:func:`transmission_rows.transmission_backlog`)."""
        return await transmission_rows.transmission_backlog(
            list(self.directory.databases.values()), listed
        )

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
            self.deadlines.watch_timer(ep)

        return Work().add(
            [queries.set_timer(ep.handle_text, due)],
            committed,
        )

    async def begin_conversation_timer(self, handle: uuid.UUID, timeout: float) -> None:
        db, ep = self.directory.endpoint(handle)
        await commit(db, self.timer_work(db, ep, timeout))
