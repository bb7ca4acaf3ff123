"""Acknowledgements from links: what a sender takes out of its transmission queue
(R-DLG-5, R-DLG-7, R-ROUTE-3).

Owns applying an acknowledgement, dedicated or piggybacked on a fragment, to the
endpoint it is for: the messages it confirms leave the outbox and the backlog (and the
file, in one job per database and frame), the held fragments it names are not sent
again, the endpoint is bound to the broker instance that first answered it, and an
acknowledgement for a conversation not held here is relayed when this broker forwards.
What does not come from the endpoint's far side, or does not open under its dialog
key, is dropped (R-DLG-14, :class:`~brokerd.dialogs.arrivals.admission.Admission`).
Its ``ack_received`` event, and the ``dialog_ended`` of an endpoint it closes, are
traced when those deletions commit (R-TRACE-1): after a SIGKILL the trace claims no
acknowledgement the file does not hold.

May import: ``brokerd.dialogs.router``, ``brokerd.dialogs.transmission``,
``brokerd.dialogs.endpoints`` and what they may import.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from brokerd.dialogs.arrivals.admission import Admission
from brokerd.dialogs.endpoints import binding
from brokerd.dialogs.endpoints.backlog import numbers_in
from brokerd.dialogs.endpoints.directory import Directory
from brokerd.dialogs.endpoints.endpoint import Endpoint, endpoint_snapshot, unqueue_sent
from brokerd.dialogs.endpoints.events import DialogEvents
from brokerd.dialogs.endpoints.stats import EngineStats
from brokerd.dialogs.router.router import Router
from brokerd.dialogs.transmission.fragment_acks import held_fragments
from brokerd.dialogs.transmission.links import Link
from brokerd.dialogs.transmission.transmission import Transmission
from brokerd.storage.schema import Statement
from brokerd.traces.writer import TraceWriter
from protocol.dialog import Acknowledgement, DialogHeader


@dataclass
class AckWrites:
    """What the acknowledgements of one frame write to one database, in one job."""

    statements: list[Statement] = field(default_factory=list)
    committed: list[Callable[[], None]] = field(default_factory=list)
    """Their trace events, run in order once the job commits."""

    def on_commit(self) -> None:
        for step in self.committed:
            step()


class Acknowledgements:
    """Acknowledgements applied to the endpoints they are for."""

    def __init__(
        self,
        directory: Directory,
        admission: Admission,
        events: DialogEvents,
        transmission: Transmission,
        router: Router,
        local_link: Link,
        trace: TraceWriter,
        stats: EngineStats,
    ) -> None:
        self.directory = directory
        self.admission = admission
        self.events = events
        self.transmission = transmission
        self.router = router
        self.local_link = local_link
        self.trace = trace
        self.stats = stats

    def on_acks(self, link: Link, headers: list[DialogHeader]) -> None:
        """Dedicated acknowledgements that arrived on ``link``, one frame's worth."""
        elsewhere: list[DialogHeader] = []
        writes: dict[str, AckWrites] = {}
        """The frame's transmission-queue deletions, one store job per database."""
        for h in headers:
            self.stats.acks_received += 1
            ep = self.directory.endpoint_for(h)
            if ep is not None:
                if self.admission.refused(link, ep, h, "acknowledgement"):
                    continue
                if (ep.keys is not None or h.security is not None) and (
                    self.admission.opened(ep, h, b"", "acknowledgement") is None
                ):
                    continue
                self.apply(ep, h.ack, h.from_broker_instance, link.identity, h, writes)
            elif link is not self.local_link:
                elsewhere.append(h)
        for name, written in writes.items():
            self.directory.databases[name].store.submit(
                written.statements, on_commit=written.on_commit if written.committed else None
            )
        if elsewhere and self.router.forwarding:
            self.router.forward_acks(elsewhere)

    def apply(
        self,
        ep: Endpoint,
        ack: Acknowledgement,
        far_instance: uuid.UUID,
        identity: str,
        header: DialogHeader,
        writes: dict[str, AckWrites] | None = None,
    ) -> None:
        """Release what ``ack`` acknowledges; its rows leave the transmission queue in a
        job of their own, or, given ``writes``, in the caller's job for the database.
        What it released is traced once that job commits."""
        db = self.directory.databases[ep.database]
        statements: list[Statement] = []
        changed = binding.bind(ep, header, identity, db.catalog.routes.values())
        if self.router.bind_far_instance(ep, far_instance):
            changed = True
        outbox = ep.outbox
        removed: list[int] = []
        through = ack.through
        for seq in outbox:  # in sending order: only the acknowledged head is visited
            if seq > through:
                break
            removed.append(seq)
        if ack.ranges or ack.fragments:
            for seq, msg in list(outbox.items()):
                if seq <= ack.through:
                    continue
                if ack.covers(seq):
                    removed.append(seq)
                elif msg.fragment_count > 1:
                    held_fragments(msg, ack)
        # Messages only in the file (the backlog, after a restart) leave it by number.
        backlog = ep.backlog
        runs: list[tuple[int, int]] = []
        if backlog:
            if through >= backlog.first:
                runs += backlog.remove(backlog.first, through)
            for r in ack.ranges:
                if backlog and r.last >= backlog.first:
                    runs += backlog.remove(r.first, r.last)
        if removed:
            self.transmission.acknowledged(outbox[removed[-1]])
        release = self.transmission.release
        for seq in removed:
            release(outbox.pop(seq))
        if removed or runs or ack.fragments:
            self.transmission.answered(ep)
        if backlog and len(outbox) < self.transmission.page:
            self.transmission.page_in(ep)
        statements += unqueue_sent(ep, removed, ack.through, runs)
        closed = ep.refresh_state()
        if closed:
            changed = True
        if changed:
            statements.append(endpoint_snapshot(ep))
        if not statements:
            return
        committed = (
            self._traced(ep, through, removed, runs, closed) if removed or runs or closed else None
        )
        if writes is None:
            db.store.submit(statements, on_commit=committed)
            return
        written = writes.get(db.name)
        if written is None:
            written = writes[db.name] = AckWrites()
        written.statements += statements
        if committed is not None:
            written.committed.append(committed)

    def _traced(
        self,
        ep: Endpoint,
        through: int,
        removed: list[int],
        runs: list[tuple[int, int]],
        closed: bool,
    ) -> Callable[[], None]:
        """What traces, at the commit of its deletions, the messages an acknowledgement
        released (``ack_received``) and the endpoint it closed (``dialog_ended``)."""

        def committed() -> None:
            if removed or runs:
                self.trace.emit(
                    "ack_received",
                    ep.conversation_id,
                    database=ep.database,
                    initiator=ep.initiator,
                    through=through,
                    acked=len(removed) + numbers_in(runs),
                    seqs=",".join(
                        map(str, [*removed, *(s for a, b in runs for s in range(a, b + 1))])
                    ),
                )
            if closed:
                self.events.closed(ep)

        return committed
