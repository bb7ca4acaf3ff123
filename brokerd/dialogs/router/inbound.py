"""Messages from outside: routed to a database here, forwarded or dropped
(R-ROUTE-1, R-ROUTE-2, R-ROUTE-6, R-ROUTE-7).

Owns :class:`Inbound` and the forwarding state: the route of each message arriving from
outside, with msdb's routes (R-ROUTE-1), replies delivered by broker instance first
(R-ROUTE-2), cached per conversation (in the shared state's cache); forwarding
(R-ROUTE-6, R-ROUTE-7): relayed fragments and acknowledgements, the hop count, the
``message_forward_size`` budget, the last fragment relayed (:class:`Relayed`).

It is handed the engine as :class:`InboundServices`, the router's shared state, the
endpoint's configuration, and the parts that decide routes, ask for missing ones and know
mirrored pairs' principals, through the protocols below.

May import: ``protocol``, ``brokerd.routing``, the router's ``state``, and for types only
the models of ``brokerd.dialogs``, ``brokerd.config`` and ``brokerd.traces``.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from typing import TYPE_CHECKING, NamedTuple, Protocol

from brokerd.routing import rules as routing
from brokerd.routing.forwarding import (
    Forward,
    ForwardBudget,
    acks_item,
    fragment_item,
    hop_refusal,
)
from protocol.dialog import DialogHeader

if TYPE_CHECKING:
    from brokerd.config import EndpointConfig
    from brokerd.dialogs.endpoints.database import Database
    from brokerd.dialogs.router.state import RouterState
    from brokerd.dialogs.transmission.links import LinkProvider
    from brokerd.traces.writer import TraceWriter


class Relayed(NamedTuple):
    """The last fragment forwarded the whole way: its header, where it went, by which route."""

    header: DialogHeader
    address: str
    route: str | None


class InboundServices(Protocol):
    """What messages from outside need of the dialog engine."""

    databases: dict[str, Database]
    msdb: Database
    by_instance: dict[uuid.UUID, Database]
    links: LinkProvider
    trace: TraceWriter

    def drop(self, header: DialogHeader, reason: str) -> None: ...

    def note_drop(self, text: str) -> None: ...


class Deciding(Protocol):
    """Where a conversation goes (R-ROUTE-1, R-ROUTE-4, R-ROUTE-5)."""

    def decide(
        self,
        db: Database,
        service: str,
        broker_instance: uuid.UUID | None,
        conversation_id: uuid.UUID,
        from_outside: bool = False,
    ) -> routing.Decision: ...


class RouteAsking(Protocol):
    """Dynamic routing (R-ROUTE-14): ask for a route to a service."""

    def request_route(
        self, db: Database, service: str, broker_instance: uuid.UUID | None
    ) -> None: ...


class PrincipalFinding(Protocol):
    """The principal of a mirrored route (R-ROUTE-10)."""

    def principal(self, decision: routing.Decision, service: str) -> str | None: ...


class Inbound:
    """Messages from outside and forwarding (see the module docstring)."""

    def __init__(
        self,
        engine: InboundServices,
        state: RouterState,
        endpoint: EndpointConfig,
        decisions: Deciding,
        requests: RouteAsking,
        mirrors: PrincipalFinding,
    ) -> None:
        self.engine = engine
        self.state = state
        self.decisions = decisions
        self.requests = requests
        self.mirrors = mirrors
        self.max_hop_count = endpoint.max_hop_count
        self.budget = ForwardBudget(endpoint.message_forward_size)
        """Bytes of forwarded messages held until their link sends them (R-ROUTE-7)."""
        self.last_forwarded: Relayed | None = None
        """The last fragment forwarded the whole way (runs of a turn follow it: see
        :meth:`forward_next`)."""

    # -- messages from outside ---------------------------------------------------------------

    def inbound(
        self, header: DialogHeader, body: bytes, payload: bytes | None = None
    ) -> Database | None:
        """The database a message from outside is for, or None if forwarded (``payload``,
        as it arrived, relayed with its hop count changed) or dropped."""
        engine = self.engine
        if not header.initiator and header.to_broker_instance is not None:
            db = engine.by_instance.get(header.to_broker_instance)
            if db is not None:
                return db  # R-ROUTE-2: a reply for a broker instance held here
        decision = self._inbound_decision(header)
        if decision.kind == "local" and decision.database is not None:
            return engine.databases[decision.database]
        if decision.kind == "network":
            self._forward_fragment(header, body, decision, payload)
            return None
        engine.drop(header, decision.reason)
        return None

    def _inbound_decision(self, header: DialogHeader) -> routing.Decision:
        cache = self.state.inbound_decisions
        if cache.stale(time.time()):
            cache.clear()
        key = (
            header.conversation_id,
            header.initiator,
            header.to_service,
            header.to_broker_instance,
        )
        decision = cache.get(key)
        if decision is None:
            decision = self.decisions.decide(
                self.engine.msdb,
                header.to_service,
                header.to_broker_instance,
                header.conversation_id,
                from_outside=True,
            )
            # Made while the dynamic routing service is asked (R-ROUTE-14): it holds only
            # until that request is over; the sender's retransmissions decide again then.
            if not decision.request_route and not decision.awaits_route_request:
                cache.keep(key, decision)
            cache.expire_with(decision)
        if decision.request_route:
            self.requests.request_route(
                self.engine.msdb, header.to_service, header.to_broker_instance
            )
        return decision

    def _forward_fragment(
        self,
        header: DialogHeader,
        body: bytes,
        decision: routing.Decision,
        payload: bytes | None = None,
    ) -> None:
        refusal = hop_refusal(header, self.max_hop_count)
        if refusal is not None:
            self.state.stats.hop_limit_drops += 1
            self.engine.drop(header, refusal)
            return
        address = self._forward_address(header, decision)
        if address is None:
            return
        if not self.forward_next(header, body, payload, address):
            self.state.stats.forward_buffer_drops += 1
            self.engine.drop(
                header,
                f"forwarding buffer full ({self.budget.held} of {self.budget.limit} bytes, "
                "message_forward_size, a quarter of it at most for a next hop that does "
                "not connect); dropped, the sender retries (R-ROUTE-7)",
            )
            return
        self.last_forwarded = Relayed(header, address, decision.route)
        self.engine.trace.emit_grouped(
            "forwarded",
            header.conversation_id,
            "seq",
            header.sequence_number,
            initiator=header.initiator,
            fragment=header.fragment_index,
            size=len(body),
            hop=header.hop_count + 1,
            address=address,
            route=decision.route,
        )

    def forward_next(
        self, header: DialogHeader, body: bytes, payload: bytes | None, address: str
    ) -> bool:
        """Relay a fragment to ``address``, one hop further, within the forwarding budget
        (False if it is full, R-ROUTE-7): the end of the whole way, and all of the way for
        a fragment that follows :attr:`last_forwarded` in the same turn and routes as it
        does (same conversation, direction, target service and broker instance, hop
        count). Tracing it is the caller's."""
        item = fragment_item(header, body, payload)
        link = self.engine.links.link_for(address)
        if not link.may_hold(item.size, self.budget.limit) or not self.budget.take(item.size):
            return False
        self.state.stats.forwarded_fragments += 1
        link.forward(item)
        return True

    def _forward_address(self, header: DialogHeader, decision: routing.Decision) -> str | None:
        if not decision.mirror_address:
            return decision.address
        principal = self.mirrors.principal(decision, header.to_service)
        if principal is None:
            self.engine.drop(header, "no principal known yet for the mirrored route (R-ROUTE-10)")
        return principal

    def forward_acks(self, headers: list[DialogHeader]) -> None:
        """Dedicated acknowledgements for conversations not held here: relay them (R-ROUTE-7)."""
        per_address: dict[str, list[DialogHeader]] = defaultdict(list)
        for h in headers:
            if not h.initiator and h.to_broker_instance in self.engine.by_instance:
                continue  # for an endpoint of ours that no longer exists
            decision = self._inbound_decision(h)
            if decision.kind != "network":
                self.state.stats.acks_dropped += 1
                self.engine.note_drop(
                    f"dropped an acknowledgement of conversation {h.conversation_id} for "
                    f"{h.to_service!r}: {decision.reason}"
                )
                continue
            refusal = hop_refusal(h, self.max_hop_count)
            if refusal is not None:  # R-ROUTE-7: shown and logged as a message's drop is
                self.state.stats.hop_limit_drops += 1
                self.state.stats.acks_dropped += 1
                self.engine.note_drop(
                    f"dropped an acknowledgement of conversation {h.conversation_id} for "
                    f"{h.to_service!r}: {refusal}"
                )
                continue
            address = self._forward_address(h, decision)
            if address is not None:
                per_address[address].append(h)
        for address, group in per_address.items():
            item = acks_item(group)
            link = self.engine.links.link_for(address)
            if link.may_hold(item.size, self.budget.limit) and self.budget.take(item.size):
                self.state.stats.forwarded_acks += len(group)
                link.forward(item)
            else:
                self.state.stats.forward_buffer_drops += 1
                self.engine.note_drop(
                    f"dropped {len(group)} acknowledgement(s) for {address}: forwarding "
                    f"buffer full ({self.budget.held} of {self.budget.limit} bytes, "
                    "message_forward_size); their senders acknowledge again (R-ROUTE-7)"
                )

    def forward_sent(self, item: Forward) -> None:
        """A relayed item went out on its link: its bytes leave the budget (R-ROUTE-7)."""
        self.budget.release(item.size)

    def forward_lost(self, items: list[Forward]) -> None:
        """Relayed items a link could not send (its connection closed, or never opened):
        their bytes leave the budget, and their senders retransmit (R-ROUTE-7)."""
        for item in items:
            self.budget.release(item.size)
        self.state.stats.forward_lost += len(items)
