"""The route of each conversation that begins here or is answered from here
(R-ROUTE-1 .. R-ROUTE-5).

Owns :class:`RouteDecisions`: :meth:`~RouteDecisions.decide` applies
:mod:`brokerd.routing.rules` and shares a decision that does not depend on the
conversation; :meth:`~RouteDecisions.link_for` caches a conversation's route on its
endpoint until a route changes or expires (R-OBJ-5), and re-decides it once the
conversation is bound to the broker instance of the first acknowledgement (R-ROUTE-3,
:meth:`~RouteDecisions.rebind`). A route to a mirrored pair goes to its principal
(``mirror_roles``); a decision that asks for a route sends a MissingRoute request
(``route_requests``). Also the trace events of a conversation's route, why its
messages wait, and ``explain``: the step-by-step reasoning for a service, as
``brokerctl explain`` prints it.

May import: ``protocol``, ``brokerd.routing``, ``router_core``, ``route_requests`` and
``mirror_roles``; the models of ``brokerd.dialogs`` for types.
"""

from __future__ import annotations

import math
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from brokerd.dialogs.router.mirror_roles import MirrorRoles
from brokerd.dialogs.router.requests import RouteRequests
from brokerd.routing import rules as routing

if TYPE_CHECKING:
    from brokerd.dialogs.endpoints.database import Database
    from brokerd.dialogs.endpoints.endpoint import Endpoint
    from brokerd.dialogs.transmission.links import Link

DECISION_CACHE_LIMIT = 10_000
"""Shared decisions kept (one per database, service and broker instance; cleared past it)."""


class RouteDecisions(RouteRequests, MirrorRoles):
    # -- decisions ---------------------------------------------------------------------

    def decide(
        self,
        db: Database,
        service: str,
        broker_instance: uuid.UUID | None,
        conversation_id: uuid.UUID,
        from_outside: bool = False,
    ) -> routing.Decision:
        """Route one conversation (R-ROUTE-1, R-ROUTE-4, R-ROUTE-5).

        A decision made without a choice among equal routes or broker instances
        (``choices == 1``) is the same for every conversation to ``service`` and
        ``broker_instance`` from ``db``: it is kept and reused until a route or the
        mirroring role changes (:meth:`forget_decisions`) or a route it consulted
        expires. A decision that asks the dynamic routing service for a route, or made
        while such a request for ``service`` is pending (R-ROUTE-14), is not kept. With
        10,000 conversations this spares one full decision per conversation and side.
        """
        msdb = self.engine.msdb
        table = msdb if from_outside else db
        key = (table.name, from_outside, service, broker_instance)
        now = time.time()
        if now >= self._decisions_expire or len(self._decisions) > DECISION_CACHE_LIMIT:
            self.forget_decisions()
        known = self._decisions.get(key)
        if known is not None:
            return known
        pending = self.pending_services(table.name)
        self.stats.route_decisions += 1
        decision = routing.decide(
            table.catalog.routes.values(),
            routing.Conversation(
                service, conversation_id, broker_instance, None if from_outside else db.name
            ),
            self.local_dbs,
            datetime.now(UTC),
            msdb_routes=msdb.catalog.routes.values(),
            forwarding=self.forwarding,
            own_addresses=self.own_addresses,
            pending_route_requests=pending,
        )
        if decision.choices == 1 and not decision.request_route and service not in pending:
            self._decisions[key] = decision
            if decision.valid_until is not None:
                self._decisions_expire = min(
                    self._decisions_expire, decision.valid_until.timestamp()
                )
        return decision

    def link_for(self, ep: Endpoint) -> Link | None:
        """The link ``ep``'s messages go to now, or None (DELAYED, or no principal yet)."""
        db = self.engine.databases[ep.database]
        if db.sends_nothing:
            return None  # R-ROUTE-15/16: a mirror, or a principal in doubt, sends nothing
        if ep.route_link is not None and time.time() < ep.route_expires:
            link: Link = ep.route_link
            return link
        decision = self.decide(db, ep.far_service, ep.far_broker_instance, ep.conversation_id)
        self._trace_decision(ep, decision)
        ep.route = decision
        ep.route_link = None
        ep.route_expires = decision.valid_until.timestamp() if decision.valid_until else math.inf
        if decision.request_route:
            self._request_route(db, ep.far_service, ep.far_broker_instance)
        if decision.kind == "local":
            ep.route_link = self.engine.local_link
        elif decision.kind == "network" and decision.address:
            address = decision.address
            if decision.mirror_address:
                principal = self._principal(decision, ep.far_service)
                if principal is None:
                    return None
                address = principal
                ep.route_expires = 0.0  # asked again at every transmission: failover
            ep.route_link = self.engine.links.link_for(address)
        return ep.route_link  # type: ignore[no-any-return]

    def _trace_decision(self, ep: Endpoint, decision: routing.Decision) -> None:
        before = ep.route
        trace = self.engine.trace
        waiting = decision.kind in ("delayed", "drop")
        if waiting:
            if before is None or before.kind not in ("delayed", "drop"):
                trace.emit(
                    "delayed",
                    ep.conversation_id,
                    database=ep.database,
                    initiator=ep.initiator,
                    service=ep.far_service,
                    reason=decision.reason,
                )
            return
        if before is not None and before.kind in ("delayed", "drop"):
            trace.emit("released", ep.conversation_id, database=ep.database, initiator=ep.initiator)
        if before is None or (before.route, before.address, before.database) != (
            decision.route,
            decision.address,
            decision.database,
        ):
            trace.emit(
                "route_chosen",
                ep.conversation_id,
                database=ep.database,
                initiator=ep.initiator,
                service=ep.far_service,
                decision=decision.kind,
                route=decision.route,
                step=_matched_step(decision),
                address=decision.address,
                target_database=decision.database,
            )

    def waiting_status(self, ep: Endpoint) -> str:
        """Why ``ep``'s messages have no link: the routing reason, or the mirror state."""
        db = self.engine.databases[ep.database]
        if db.mirror_role == "mirror":
            return db.fenced_reason() + ": held until this partner is principal again"
        if db.mirror_in_doubt:
            return db.in_doubt_reason()
        decision = ep.route
        if decision is None:
            return "no route"
        if decision.kind == "network" and decision.mirror_address and decision.address:
            pair = self.mirrors.pair(self._mirror_key(decision, ep.far_service))
            return pair.status()
        return decision.reason

    def rebind(self, ep: Endpoint) -> None:
        """R-ROUTE-3: the conversation is now bound to a broker instance; route it again."""
        ep.route_link = None
        ep.route_expires = 0.0

    # -- explain -----------------------------------------------------------------------------------

    def explain(
        self,
        database: str,
        service: str,
        broker_instance: uuid.UUID | None = None,
        from_outside: bool = False,
    ) -> dict[str, Any]:
        """Which route a new conversation to ``service`` would take now, and why."""
        engine = self.engine
        db = engine.msdb if from_outside else engine.database(database)
        conversation = uuid.uuid4()
        decision = self.decide(db, service, broker_instance, conversation, from_outside)
        steps = list(decision.steps)
        if decision.request_route:
            steps.append("(explain does not send the MissingRoute request)")
        principal = ""
        if decision.kind == "network" and decision.address:
            address = decision.address
            if decision.mirror_address:
                pair = self.mirrors.pairs.get(self._mirror_key(decision, service))
                steps.append(
                    "R-ROUTE-10: "
                    + (pair.status() if pair else "not used yet: both partners will be asked")
                )
                principal = (pair.principal or "") if pair else ""
                address = principal or address
            link = engine.links.link_for(address)
            steps.append(f"connection to {address}: {link.status}")
        note = ""
        if decision.choices > 1:
            note = (
                f"load balanced over {decision.choices} equal routes: the choice depends on the "
                "conversation id, and a conversation keeps it"
            )
        return {
            "database": db.name,
            "service": service,
            "broker_instance": str(broker_instance or ""),
            "from_outside": from_outside,
            "conversation_id": str(conversation),
            "decision": decision.kind,
            "route": decision.route or "",
            "address": decision.address or "",
            "mirror_address": decision.mirror_address or "",
            "principal": principal,
            "target_database": decision.database or "",
            "reason": decision.reason,
            "note": note,
            "steps": steps,
        }


def _matched_step(decision: routing.Decision) -> str | None:
    """``R-ROUTE-4 step N, R-ROUTE-5 step M`` from a decision's reason, for traces."""
    head = decision.reason.split(":", 1)[0]
    return head if head.startswith("R-ROUTE-4") else None
