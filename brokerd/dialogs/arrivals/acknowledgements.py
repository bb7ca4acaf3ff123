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
acknowledgement the file does not hold. Memory forgets the messages at once, so a
deletion whose commit fails (a full disk, a file locked past the busy timeout) is tried
again after a second, then two, up to 30 s, while its endpoint lasts, as the broker's own
messages are (:meth:`~brokerd.dialogs.arrivals.delivery.Delivery.queue_local`): the file
does not keep them until the next restart, which would send them again.

May import: ``brokerd.dialogs.router``, ``brokerd.dialogs.transmission``,
``brokerd.dialogs.endpoints`` and what they may import.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from brokerd.dialogs.arrivals.admission import Admission
from brokerd.dialogs.arrivals.delivery import RETRY_FIRST, RETRY_MOST
from brokerd.dialogs.endpoints import binding
from brokerd.dialogs.endpoints.backlog import numbers_in
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.directory import Directory
from brokerd.dialogs.endpoints.endpoint import Endpoint, endpoint_snapshot, unqueue_sent
from brokerd.dialogs.endpoints.events import DialogEvents
from brokerd.dialogs.endpoints.stats import EngineStats
from brokerd.dialogs.router.router import Router
from brokerd.dialogs.transmission.fragment_acks import held_fragments
from brokerd.dialogs.transmission.links import Link
from brokerd.dialogs.transmission.transmission import Transmission
from brokerd.errors import StoreError
from brokerd.storage.schema import Statement
from brokerd.traces.writer import TraceWriter
from protocol.dialog import Acknowledgement, DialogHeader

log = logging.getLogger("brokerd.dialogs.engine")


@dataclass
class AckWrite:
    """What one acknowledgement writes for its endpoint."""

    ep: Endpoint
    deletions: list[Statement]
    """The messages it released, out of the transmission queue."""
    snapshot: bool
    """The endpoint's row changed (a binding, a close)."""
    committed: Callable[[], None] | None
    """Its trace events, once it is committed."""

    def statements(self) -> list[Statement]:
        """Its statements, with the endpoint's row as it is now (a retry writes that)."""
        if self.snapshot:
            return [*self.deletions, endpoint_snapshot(self.ep)]
        return self.deletions


@dataclass
class AckWrites:
    """What the acknowledgements of one frame write to one database, in one job."""

    writes: list[AckWrite] = field(default_factory=list)
    traced: bool = False
    """Some of them trace events once the job commits."""

    def add(self, write: AckWrite) -> None:
        self.writes.append(write)
        if write.committed is not None:
            self.traced = True

    def statements(self) -> list[Statement]:
        return [statement for write in self.writes for statement in write.statements()]

    def on_commit(self) -> None:
        """Their trace events, in order."""
        for write in self.writes:
            if write.committed is not None:
                write.committed()


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
            self.submit(self.directory.databases[name], written)
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
        deletions = unqueue_sent(ep, removed, ack.through, runs)
        closed = ep.refresh_state()
        if closed:
            changed = True
        if not (deletions or changed):
            return
        if writes is None:
            written = AckWrites()
        else:
            found = writes.get(db.name)
            written = writes[db.name] = AckWrites() if found is None else found
        traced = (
            self._traced(ep, through, removed, runs, closed) if removed or runs or closed else None
        )
        written.add(AckWrite(ep, deletions, changed, traced))
        if writes is None:
            self.submit(db, written)

    def submit(self, db: Database, written: AckWrites, wait: float = RETRY_FIRST) -> None:
        """Commit ``written``; once it is committed, trace it. Memory has forgotten the
        messages already, so a commit that fails is tried again after ``wait`` seconds
        (doubled each time, up to ``RETRY_MOST``), with what of it is still for an
        endpoint of the database (one removed or whose image was dropped writes no more):
        the file does not keep acknowledged messages for the rest of the process."""

        def failed(exc: BaseException) -> None:
            log.error(
                "store error while deleting acknowledged messages from %s: %s; trying "
                "again in %.0f s",
                db.name,
                exc,
                wait,
            )

            def again() -> None:
                kept = [w for w in written.writes if db.endpoints.get(w.ep.handle) is w.ep]
                if not kept:
                    return
                written.writes = kept
                try:
                    self.submit(db, written, min(RETRY_MOST, 2 * wait))
                except StoreError:  # stopping: the next start sends them, and they are acked
                    log.info(
                        "not deleting acknowledged messages from %s: its store is closed", db.name
                    )

            asyncio.get_running_loop().call_later(wait, again)

        db.store.submit(
            written.statements(),
            on_commit=written.on_commit if written.traced else None,
            on_failure=failed,
        )

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
