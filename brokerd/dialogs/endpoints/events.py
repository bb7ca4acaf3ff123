"""The trace events of a dialog's life, and messages dropped (``docs/traces.md``).

Owns how a dropped message is counted, traced, kept for the ``drops`` view and
logged (at most one line a second), how a corrupted one is counted, traced and logged
(as rarely, SPEC R-DLG-8), the ``dialog_begun``, ``discarded`` and
``dialog_ended`` events every part of the engine writes, a promotion's ``inherited``
events, and poison-message handling's (SPEC §6): ``rolled_back``, ``quarantined``,
``quarantine_released``, ``quarantine_ended`` and ``queue_disabled``, each with its
counter. The parts call these from the callbacks of the commits that make the changes
(R-TRACE-1): a target endpoint made by an arrival is remembered until that arrival's
commit (:meth:`DialogEvents.arrival_committed`) writes its ``dialog_begun``, or until the
reload after that commit failed drops it (:meth:`DialogEvents.reloaded`). An endpoint
that closes is handed to the :class:`~brokerd.dialogs.endpoints.closing.ClosedEndpoints`
that will say when it may be removed (SPEC §5); its ``dialog_ended`` is written once.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Iterable, Mapping

from brokerd.dialogs.endpoints.closing import ClosedEndpoints
from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.endpoints.states import State
from brokerd.dialogs.endpoints.stats import EngineStats
from brokerd.traces.writer import TraceWriter
from protocol.dialog import DialogHeader

log = logging.getLogger("brokerd.dialogs.engine")


class OncePerSecond:
    """Lines of one kind logged at most once a second (a peer can cause thousands)."""

    def __init__(self) -> None:
        self._at = -math.inf
        self._skipped = 0

    def due(self) -> int | None:
        """How many lines were not logged since the last one, if one may be logged now;
        None (and this one counted as not logged) otherwise."""
        now = time.monotonic()
        if now - self._at < 1.0:
            self._skipped += 1
            return None
        more, self._at, self._skipped = self._skipped, now, 0
        return more


class DialogEvents:
    """Dropped messages and the trace events of a dialog's life."""

    def __init__(
        self, trace: TraceWriter, stats: EngineStats, closing: ClosedEndpoints | None = None
    ) -> None:
        self.trace = trace
        self.stats = stats
        self.closing = closing if closing is not None else ClosedEndpoints(math.inf, time.time)
        """Closed endpoints waiting to be removed (fed by :meth:`closed`)."""
        self._drop_lines = OncePerSecond()
        self._unbegun: dict[uuid.UUID, tuple[str, str]] = {}
        """Target endpoints made by an arrival not committed yet -> their database and the
        link the arrival came on."""
        self._corrupted_lines = OncePerSecond()

    def drop(self, header: DialogHeader, reason: str) -> None:
        """A message from a link is dropped: counted, traced, noted."""
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
        """Keep the reason for the ``drops`` view (the latest 100: a daemon that runs for
        months shows what it drops now) and log it: at most one line a second (a sender
        retransmitting into a fenced partner drops thousands), with the count of those
        not logged since."""
        self.stats.drop_reasons.append(text)
        more = self._drop_lines.due()
        if more is None:
            return
        log.warning("%s%s", text, f" (and {more} more drops not logged)" if more else "")

    def corrupted(self, peer: str, reason: str) -> None:
        """A message or acknowledgement from ``peer`` failed its check or did not decode
        (R-DLG-8): discarded, not acknowledged; counted and traced each time, logged at
        most once a second (a peer can send thousands to a frame), with the count of
        those not logged since."""
        self.stats.corrupted_messages += 1
        self.trace.emit("corrupted_message", peer=peer, reason=reason)
        more = self._corrupted_lines.due()
        if more is None:
            return
        log.warning(
            "integrity failure on %s: %s (not acknowledged)%s",
            peer,
            reason,
            f" (and {more} more not logged)" if more else "",
        )

    def begun(self, ep: Endpoint, peer: str | None = None) -> None:
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

    @property
    def unbegun(self) -> int:
        """Target endpoints whose ``dialog_begun`` waits for their first arrival's commit."""
        return len(self._unbegun)

    def first_arrived(self, ep: Endpoint, peer: str) -> None:
        """A target endpoint made by the first message of its dialog to arrive (from
        ``peer``): its ``dialog_begun`` waits for that message's commit."""
        self._unbegun[ep.handle] = (ep.database, peer)

    def arrival_committed(self, ep: Endpoint) -> None:
        """What arrived for ``ep`` is committed (R-TRACE-1): its ``dialog_begun`` if it was
        the endpoint's first arrival, its ``dialog_ended`` if it closed the endpoint."""
        if self._unbegun and ep.handle in self._unbegun:
            self.begun(ep, self._unbegun.pop(ep.handle)[1])
        if ep.state is State.CLOSED:
            self.closed(ep)

    def reloaded(self, database: str, endpoints: Mapping[uuid.UUID, Endpoint]) -> None:
        """``database``'s memory was loaded again from its file after a failed write: a
        target whose first arrival failed to commit is not in it (its sender sends that
        again, and it is made again then), so it waits for no commit any more."""
        for handle, (name, _) in list(self._unbegun.items()):
            if name == database and handle not in endpoints:
                del self._unbegun[handle]

    def discarded(self, ep: Endpoint, seqs: list[int], reason: str, received: bool = False) -> None:
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

    def inherited(self, endpoints: Iterable[Endpoint]) -> None:
        """R-ROUTE-16, R-TRACE-5: a promoted partner's ``inherited`` event per endpoint of
        the database, as its file holds it: what its sends went through (``sent_through``)
        and what it received in order (``received_through``). What the old principal
        committed and shipped is then evidenced here, also when its own events of it were
        lost with it (a SIGKILL before its trace flush) and it never starts again."""
        for ep in endpoints:
            self.trace.emit(
                "inherited",
                ep.conversation_id,
                database=ep.database,
                initiator=ep.initiator,
                sent_through=ep.send_sequence,
                received_through=ep.durable.through,
            )

    def closed(self, ep: Endpoint, *, removed: bool = False) -> None:
        """``dialog_ended``, if ``ep`` is now closed and was not before; it then waits to
        be removed, unless it is ``removed`` at once (END CONVERSATION WITH CLEANUP).
        Called from the callback of the commit that closed it (R-TRACE-1)."""
        if ep.state is State.CLOSED:
            if not self.closing.watched(ep):
                self.trace.emit(
                    "dialog_ended",
                    ep.conversation_id,
                    database=ep.database,
                    initiator=ep.initiator,
                )
            if removed:
                self.closing.forget(ep)  # if it had closed before, it waits no more
            else:
                self.closing.watch(ep)

    # -- poison-message handling (SPEC §6) ---------------------------------------------

    def _rollback_event(
        self,
        event: str,
        ep: Endpoint,
        queue: str,
        seq: int,
        rollbacks: int,
        reason: str,
        **extra: object,
    ) -> None:
        """A trace event about message ``seq`` that ``ep`` received (so sent by the other
        side) and that was rolled back ``rollbacks`` times, the last for ``reason``."""
        self.trace.emit(
            event,
            ep.conversation_id,
            database=ep.database,
            initiator=not ep.initiator,
            queue=queue,
            seq=seq,
            rollbacks=rollbacks,
            reason=reason or None,
            **extra,
        )

    def rolled_back(self, ep: Endpoint, queue: str, seq: int, rollbacks: int, reason: str) -> None:
        """A received message put back by a rollback, and counted."""
        self.stats.rollbacks_counted += 1
        self._rollback_event("rolled_back", ep, queue, seq, rollbacks, reason)

    def quarantined(
        self, ep: Endpoint, queue: str, seq: int, message_type: str, rollbacks: int, reason: str
    ) -> None:
        self.stats.poison_quarantined += 1
        self._rollback_event(
            "quarantined", ep, queue, seq, rollbacks, reason, message_type=message_type
        )
        log.warning(
            "database %s: conversation %s quarantined: message %d (%s) of queue %s was "
            "rolled back %d times (last: %s)",
            ep.database,
            ep.conversation_id,
            seq,
            message_type,
            queue,
            rollbacks,
            reason or "no reason given",
        )

    def quarantine_over(self, ep: Endpoint, queue: str, ended: bool) -> None:
        """A quarantine released (its messages receivable again) or ended with an error."""
        if ended:
            self.stats.poison_ended += 1
        else:
            self.stats.poison_released += 1
        self.trace.emit(
            "quarantine_ended" if ended else "quarantine_released",
            ep.conversation_id,
            database=ep.database,
            initiator=ep.initiator,
            queue=queue,
        )

    def queue_disabled(
        self, ep: Endpoint, queue: str, seq: int, rollbacks: int, reason: str
    ) -> None:
        """``poison_message_handling = "disable"``: the queue is off (R-DLG-12)."""
        self.stats.poison_queues_disabled += 1
        self._rollback_event("queue_disabled", ep, queue, seq, rollbacks, reason)
        log.warning(
            "database %s: queue %s disabled: message %d of conversation %s was rolled back "
            "%d times (last: %s)",
            ep.database,
            queue,
            seq,
            ep.conversation_id,
            rollbacks,
            reason or "no reason given",
        )
