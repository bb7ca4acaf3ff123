"""The route of each conversation that begins here or is answered from here
(R-ROUTE-1 .. R-ROUTE-5).

Owns :class:`RouteDecisions` and what decisions are made with: whether this instance
forwards (R-ROUTE-6) and the addresses that reach it (:func:`own_addresses`, R-ROUTE-8).
:meth:`~RouteDecisions.decide` applies :mod:`brokerd.routing.rules` and shares a decision
that does not depend on the conversation (in the shared state's cache);
:meth:`~RouteDecisions.link_for` caches a conversation's route on its endpoint until a
route changes or expires (R-OBJ-5), and re-decides it once the conversation is bound to
the broker instance of the first acknowledgement (R-ROUTE-3,
:meth:`~RouteDecisions.rebind`). A route to a mirrored pair goes to its principal
(:class:`MirroredPairs`); a decision that asks for a route sends a MissingRoute request
(:class:`RouteRequesting`). Also the trace events of a conversation's route, why its
messages wait, and ``explain``: the step-by-step reasoning for a service, as
``brokerctl explain`` prints it.

It is handed the engine as :class:`DecisionServices`, the router's shared state, the
endpoint's configuration, and the parts for dynamic routing and mirrored routes through
the protocols above.

May import: ``protocol``, ``brokerd.routing``, ``brokerd.config``, the router's ``state``,
and for types only the models of ``brokerd.dialogs``.
"""

from __future__ import annotations

import ipaddress
import math
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.config import normal_tcp_address
from brokerd.routing import rules as routing

if TYPE_CHECKING:
    from brokerd.config import EndpointConfig
    from brokerd.dialogs.endpoints.database import Database
    from brokerd.dialogs.endpoints.endpoint import Endpoint
    from brokerd.dialogs.router.state import RouterState
    from brokerd.dialogs.transmission.links import Link, LinkProvider
    from brokerd.routing.mirrors import MirrorPair
    from brokerd.traces.writer import TraceWriter


def own_addresses(host: str, port: int) -> frozenset[str]:
    """The ``tcp://`` addresses that reach this instance's endpoint (R-ROUTE-8)."""
    hosts = {host}
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None and ip.is_unspecified:
        hosts |= {"127.0.0.1", "localhost", "::1"}
    elif ip is not None and str(ip) == "127.0.0.1":
        hosts.add("localhost")
    out = set()
    for h in hosts:
        try:
            out.add(normal_tcp_address(f"tcp://[{h}]:{port}" if ":" in h else f"tcp://{h}:{port}"))
        except ValueError:
            continue
    return frozenset(out)


class DecisionServices(Protocol):
    """What routing conversations needs of the dialog engine."""

    databases: dict[str, Database]
    msdb: Database
    links: LinkProvider
    trace: TraceWriter

    @property
    def local_link(self) -> Link: ...

    def database(self, name: str) -> Database: ...


class RouteRequesting(Protocol):
    """Dynamic routing (R-ROUTE-14), as decisions see it."""

    limit: int
    """Requests pending at once for one database's route table, at most."""

    def pending_services(self, database: str) -> set[str]:
        """Services of ``database`` with a MissingRoute request in flight or just answered."""
        ...

    def request_route(self, db: Database, service: str, broker_instance: uuid.UUID | None) -> None:
        """Ask for a route to ``service`` unless a request is pending."""
        ...


class MirroredPairs(Protocol):
    """Mirrored routes (R-ROUTE-10), as decisions see them."""

    def principal(self, decision: routing.Decision, service: str) -> str | None:
        """The principal of the pair ``decision`` sends to, or None if none is known yet."""
        ...

    def pair(self, decision: routing.Decision, service: str) -> MirrorPair:
        """The pair ``decision`` sends to, tracked from now on."""
        ...

    def known_pair(self, decision: routing.Decision, service: str) -> MirrorPair | None:
        """The pair ``decision`` sends to, if it is tracked already."""
        ...


class RouteDecisions:
    """The route of each conversation (see the module docstring)."""

    def __init__(
        self,
        engine: DecisionServices,
        state: RouterState,
        endpoint: EndpointConfig,
        requests: RouteRequesting,
        mirrors: MirroredPairs,
    ) -> None:
        self.engine = engine
        self.state = state
        self.requests = requests
        self.mirrors = mirrors
        self.forwarding = endpoint.message_forwarding
        """Whether this instance forwards messages it does not hold (R-ROUTE-6)."""
        self.own_addresses = own_addresses(endpoint.host, endpoint.port)

    # -- decisions ---------------------------------------------------------------------

    def decide(
        self,
        db: Database,
        service: str,
        broker_instance: uuid.UUID | None,
        conversation_id: uuid.UUID,
        from_outside: bool = False,
        address: str | None = None,
        chosen_instance: uuid.UUID | None = None,
    ) -> routing.Decision:
        """Route one conversation (R-ROUTE-1, R-ROUTE-4, R-ROUTE-5); ``address``: where its
        messages went so far, kept among equal routes (:attr:`routing.Conversation.address`),
        and ``chosen_instance`` the broker instance of that route, kept at R-ROUTE-4 step 3
        (:attr:`routing.Conversation.chosen_instance`).

        A decision made without a choice among equal routes or broker instances
        (``choices == 1``) is the same for every conversation to ``service`` and
        ``broker_instance`` from ``db``: it is kept and reused until a route or the
        mirroring role changes (``RouterState.forget_decisions``) or a route it consulted
        expires. A decision that asks the dynamic routing service for a route, or made
        while such a request for ``service`` is pending (R-ROUTE-14), is not kept. With
        10,000 conversations this spares one full decision per conversation and side.
        A decision made while a request is pending says so (``awaits_route_request``), so
        that the per-conversation cache of messages from outside does not keep it either.
        """
        msdb = self.engine.msdb
        table = msdb if from_outside else db
        key = (table.name, from_outside, service, broker_instance)
        shared = self.state.shared_decisions
        if shared.stale(time.time()):
            self.state.forget_decisions()
        known = shared.get(key)
        if known is not None:
            return known
        pending = self.requests.pending_services(table.name)
        self.state.stats.route_decisions += 1
        decision = routing.decide(
            table.catalog.routes.values(),
            routing.Conversation(
                service,
                conversation_id,
                broker_instance,
                None if from_outside else db.name,
                address,
                chosen_instance,
            ),
            self.state.local_dbs,
            datetime.now(UTC),
            msdb_routes=msdb.catalog.routes.values(),
            forwarding=self.forwarding,
            own_addresses=self.own_addresses,
            pending_route_requests=pending,
            route_requests_full=len(pending) >= self.requests.limit,
        )
        if service in pending:
            decision = replace(decision, awaits_route_request=True)
        elif decision.choices == 1 and not decision.request_route:
            shared.keep(key, decision)
            shared.expire_with(decision)
        return decision

    def link_for(self, ep: Endpoint) -> Link | None:
        """The link ``ep``'s messages go to now, or None (DELAYED, or no principal yet)."""
        db = self.engine.databases[ep.database]
        if db.sends_nothing:
            return None  # R-ROUTE-15/16: a mirror, or a principal in doubt, sends nothing
        if ep.route_link is not None and time.time() < ep.route_expires:
            link: Link = ep.route_link
            return link
        before = ep.route
        went = before if before is not None and before.kind == "network" else None
        decision = self.decide(
            db,
            ep.far_service,
            ep.far_broker_instance,
            ep.conversation_id,
            address=went.address if went else None,
            chosen_instance=went.broker_instance if went else None,
        )
        self._trace_decision(ep, decision)
        ep.route = decision
        ep.route_link = None
        ep.route_expires = decision.valid_until.timestamp() if decision.valid_until else math.inf
        if decision.request_route:
            self.requests.request_route(db, ep.far_service, ep.far_broker_instance)
        if decision.kind == "local":
            ep.route_link = self.engine.local_link
        elif decision.kind == "network" and decision.address:
            address = decision.address
            if decision.mirror_address:
                principal = self.mirrors.principal(decision, ep.far_service)
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
            return self.mirrors.pair(decision, ep.far_service).status()
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
                pair = self.mirrors.known_pair(decision, service)
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
