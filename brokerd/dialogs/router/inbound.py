"""Messages from outside: routed to a database here, forwarded or dropped
(R-ROUTE-1, R-ROUTE-2, R-ROUTE-6, R-ROUTE-7).

Owns :class:`Inbound`: the route of each message arriving from outside, with msdb's
routes (R-ROUTE-1), replies delivered by broker instance first (R-ROUTE-2), cached per
conversation; forwarding (R-ROUTE-6, R-ROUTE-7): relayed fragments and
acknowledgements, the hop count, the ``message_forward_size`` budget.

May import: ``protocol``, ``brokerd.routing`` and ``route_decisions`` (with the parts it
builds on); the models of ``brokerd.dialogs`` for types.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from typing import TYPE_CHECKING, NamedTuple

from brokerd.dialogs.router.decisions import RouteDecisions
from brokerd.routing import rules as routing
from brokerd.routing.forwarding import Forward, acks_item, fragment_item, hop_refusal
from protocol.dialog import DialogHeader

if TYPE_CHECKING:
    from brokerd.dialogs.endpoints.database import Database

log = logging.getLogger("brokerd.dialogs.router.router")  # one log for every part of the router

INBOUND_CACHE_LIMIT = 100_000


class Relayed(NamedTuple):
    """The last fragment forwarded the whole way: its header, where it went, by which route."""

    header: DialogHeader
    address: str
    route: str | None


class Inbound(RouteDecisions):
    last_forwarded: Relayed | None = None
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
        now = time.time()
        cache = self._inbound
        if now >= self._inbound_expires or len(cache) > INBOUND_CACHE_LIMIT:
            cache.clear()
            self._inbound_expires = math.inf
        key = (
            header.conversation_id,
            header.initiator,
            header.to_service,
            header.to_broker_instance,
        )
        decision = cache.get(key)
        if decision is None:
            decision = self.decide(
                self.engine.msdb,
                header.to_service,
                header.to_broker_instance,
                header.conversation_id,
                from_outside=True,
            )
            if not decision.request_route:
                cache[key] = decision
            if decision.valid_until is not None:
                self._inbound_expires = min(self._inbound_expires, decision.valid_until.timestamp())
        if decision.request_route:
            self._request_route(self.engine.msdb, header.to_service, header.to_broker_instance)
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
            self.stats.hop_limit_drops += 1
            self.engine.drop(header, refusal)
            return
        address = self._forward_address(header, decision)
        if address is None:
            return
        if not self.forward_next(header, body, payload, address):
            self.stats.forward_buffer_drops += 1
            self.engine.drop(
                header,
                f"forwarding buffer full ({self.budget.held} of {self.budget.limit} bytes, "
                "message_forward_size); dropped, the sender retries (R-ROUTE-7)",
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
        if not self.budget.take(item.size):
            return False
        self.stats.forwarded_fragments += 1
        self.engine.links.link_for(address).forward(item)
        return True

    def _forward_address(self, header: DialogHeader, decision: routing.Decision) -> str | None:
        if not decision.mirror_address:
            return decision.address
        principal = self._principal(decision, header.to_service)
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
                self.stats.acks_dropped += 1
                self.engine.note_drop(
                    f"dropped an acknowledgement of conversation {h.conversation_id} for "
                    f"{h.to_service!r}: {decision.reason}"
                )
                continue
            if hop_refusal(h, self.max_hop_count) is not None:
                self.stats.hop_limit_drops += 1
                self.stats.acks_dropped += 1
                continue
            address = self._forward_address(h, decision)
            if address is not None:
                per_address[address].append(h)
        for address, group in per_address.items():
            item = acks_item(group)
            if self.budget.take(item.size):
                self.stats.forwarded_acks += len(group)
                self.engine.links.link_for(address).forward(item)
            else:
                self.stats.forward_buffer_drops += 1

    def forward_sent(self, item: Forward) -> None:
        self.budget.release(item.size)

    def forward_lost(self, items: list[Forward]) -> None:
        for item in items:
            self.budget.release(item.size)
        self.stats.forward_lost += len(items)
