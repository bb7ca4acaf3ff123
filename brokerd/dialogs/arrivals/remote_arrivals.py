"""What a connection hands over: the fragments of a turn's frames, in the order they came.

Each fragment goes through :meth:`Arrivals.on_fragment`: routed, checked against
the target's mirror role, the endpoint's binding and dialog security, carrying the
sender's acknowledgement (R-ROUTE-1, R-DLG-14). Once one whole message has been
accepted in order that way, a message after it in the same turn whose header repeats
everything those checks looked at (conversation, services, broker instances,
contract, flags, hop count and acknowledgement) and that is next in order has
nothing new to check there: it goes straight to the checks of its own (contract,
size, validation: R-DLG-3, R-OBJ-1) and to the queue, as the local link's runs do
(:mod:`brokerd.dialogs.arrivals.local_arrivals`; the checks they share and the way to
the queue are :class:`~brokerd.dialogs.arrivals.receiving.Arrivals`'). Anything else (a
message of several fragments, an ending, a gap, a duplicate, a refusal, another acknowledgement, a
secured dialog) takes the whole way, and a run may start again after it.

A forwarder's runs are the same (R-ROUTE-6, R-ROUTE-7): once a fragment was forwarded
the whole way, the fragments after it in the turn that are routed as it was (same
conversation, direction, target service and broker instance, hop count) are relayed
to the same address without a new decision, each still within the forwarding budget.

May import: ``protocol``, ``brokerd.dialogs.router``, ``brokerd.dialogs.transmission``,
``brokerd.dialogs.endpoints`` and :mod:`brokerd.dialogs.arrivals.receiving`.
"""

from __future__ import annotations

from brokerd.dialogs.arrivals.receiving import Arrivals
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.directory import Directory
from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.endpoints.runs import alike_runs
from brokerd.dialogs.endpoints.stats import EngineStats
from brokerd.dialogs.router.inbound import Relayed
from brokerd.dialogs.router.router import Router
from brokerd.dialogs.transmission.links import Link
from brokerd.traces.writer import TraceWriter
from protocol.dialog import FLAG_END_DIALOG, FLAG_ERROR, FLAG_SECURED, FLAG_SEQUENCED, DialogHeader

_PLAIN_MASK = FLAG_END_DIALOG | FLAG_ERROR | FLAG_SECURED | FLAG_SEQUENCED
"""Flags looked at to tell a plain message (sequenced, no ending, not secured)."""

Arrived = tuple[DialogHeader, bytes, bytes]
"""A decoded fragment: its header, its bytes, and the FRAGMENT payload it came in."""


class RemoteArrivals:
    """The runs a connection's frames bring, given to :class:`Arrivals` or relayed."""

    def __init__(
        self,
        arrivals: Arrivals,
        directory: Directory,
        router: Router,
        trace: TraceWriter,
        stats: EngineStats,
    ) -> None:
        self.arrivals = arrivals
        self.directory = directory
        self.router = router
        self.trace = trace
        self.stats = stats

    def on_fragments(self, link: Link, fragments: list[Arrived]) -> None:
        """Fragments that arrived on ``link`` in one turn, in order."""
        first: DialogHeader | None = None
        """The header of the message that started the run (accepted the whole way)."""
        db: Database | None = None
        receiver: Endpoint | None = None
        arrived: list[tuple[int, int]] = []
        """(sequence number, size) of the messages that went straight to ``receiver``."""
        relayed: Relayed | None = None
        """The fragment that started a run of relayed ones (forwarded the whole way)."""
        forwarded: list[tuple[DialogHeader, int]] = []
        """The headers and sizes of the fragments relayed after it, not yet traced."""
        try:
            for header, body, payload in fragments:
                if (
                    relayed is not None
                    and _routes_as(relayed.header, header)
                    and self.router.forward_next(header, body, payload, relayed.address)
                ):
                    self.stats.fragments_received += 1
                    self.stats.fragments_in_runs += 1
                    forwarded.append((header, len(body)))
                    continue
                if (
                    first is not None
                    and db is not None
                    and receiver is not None
                    and _repeats(first, header)
                    and self.arrivals.takes_next(db, receiver, header.sequence_number)
                    and self.arrivals.run_arrival(
                        db,
                        receiver,
                        header.sequence_number,
                        header.message_type,
                        header.initiator,
                        body,
                    )
                ):
                    arrived.append((header.sequence_number, len(body)))
                    continue
                if arrived:
                    assert first is not None and receiver is not None
                    self.arrivals.trace_run(
                        link, receiver, first.initiator, first.hop_count, arrived
                    )
                    arrived = []
                if forwarded:
                    assert relayed is not None
                    self._trace_relayed(link, relayed, forwarded)
                    forwarded = []
                before = self.directory.endpoint_for(header)
                through = before.accepted.through if before is not None else 0
                self.arrivals.on_fragment(
                    link, header, body, payload=payload
                )  # refusals answered there
                first, db, receiver, relayed = None, None, None, None
                run = self._run_start(header, through)
                if run is not None:
                    first = header
                    db, receiver = run
                else:
                    last = self.router.last_forwarded
                    if last is not None and last.header is header:  # forwarded just now
                        relayed = last
        finally:
            if arrived:
                assert first is not None and receiver is not None
                self.arrivals.trace_run(link, receiver, first.initiator, first.hop_count, arrived)
            if forwarded:
                assert relayed is not None
                self._trace_relayed(link, relayed, forwarded)

    def _run_start(self, header: DialogHeader, before: int) -> tuple[Database, Endpoint] | None:
        """The database and endpoint the messages after ``header``'s may go straight to, if
        it was whole and plain and started a run (:meth:`Arrivals.starts_run`)."""
        if header.fragment_count != 1 or header.flags & _PLAIN_MASK != FLAG_SEQUENCED:
            return None
        receiver = self.directory.endpoint_for(header)
        if receiver is None:
            return None
        db = self.directory.databases[receiver.database]
        if not self.arrivals.starts_run(db, receiver, header.sequence_number, before):
            return None
        return db, receiver

    def _trace_relayed(
        self, link: Link, relayed: Relayed, forwarded: list[tuple[DialogHeader, int]]
    ) -> None:
        """``fragment_received`` and ``forwarded`` of the fragments relayed after
        ``relayed`` without deciding again, as :meth:`on_fragment` and the forwarding
        trace each: one entry per run of alike fragments."""
        if not self.trace.enabled:
            return
        first = relayed.header
        hop = first.hop_count
        keys = [(h.fragment_index, h.fragment_count, size) for h, size in forwarded]
        for start, end in alike_runs(keys):
            index, count, size = keys[start]
            seqs = [h.sequence_number for h, _ in forwarded[start:end]]
            self.trace.emit_each(
                "fragment_received",
                first.conversation_id,
                "seq",
                seqs,
                initiator=first.initiator,
                fragment=index,
                fragments=count,
                size=size,
                hop=hop or None,
                peer=link.name,
            )
            self.trace.emit_each(
                "forwarded",
                first.conversation_id,
                "seq",
                seqs,
                initiator=first.initiator,
                fragment=index,
                size=size,
                hop=hop + 1,
                address=relayed.address,
                route=relayed.route,
            )


def _repeats(first: DialogHeader, header: DialogHeader) -> bool:
    """``header`` is of a whole message and repeats what the whole way checked of
    ``first``: conversation, direction, services, broker instances, contract, flags, hop
    count and acknowledgement (the rest is :meth:`Arrivals.takes_next`)."""
    return (
        header.fragment_count == 1
        and header.flags == first.flags
        and header.conversation_id == first.conversation_id
        and header.from_service == first.from_service
        and header.to_service == first.to_service
        and header.from_broker_instance == first.from_broker_instance
        and header.to_broker_instance == first.to_broker_instance
        and header.contract == first.contract
        and header.hop_count == first.hop_count
        and header.ack == first.ack
    )


def _routes_as(first: DialogHeader, header: DialogHeader) -> bool:
    """``header`` is routed as ``first`` was: the inbound decision and the hop limit look
    at nothing else."""
    return (
        header.conversation_id == first.conversation_id
        and header.flags == first.flags
        and header.to_service == first.to_service
        and header.to_broker_instance == first.to_broker_instance
        and header.hop_count == first.hop_count
    )
