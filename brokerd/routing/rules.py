"""Route lookup: where a conversation's messages go, and why (SPEC §2).

The rules are Service Broker's routing documentation and its worked examples.

A pure module: no I/O, no clock, no engine. :func:`decide` takes the route
tables, the conversation, the databases of this instance and the time, and
returns a :class:`Decision` together with the step-by-step reasoning that led
to it (``Decision.steps``, printed by ``brokerctl explain``). What it owns:

* which table (R-ROUTE-1): the originating database's routes, or msdb's for a
  conversation that arrived from outside the instance;
* expiry (R-OBJ-5): expired routes are ignored everywhere;
* matching, R-ROUTE-4 steps 1-7, including step 4 (ask the dynamic routing
  service, R-ROUTE-14) and step 6 (an implicit LOCAL route when the
  conversation names a broker instance);
* selection, R-ROUTE-5 steps 1-4, with route equivalence and a spread over
  equal choices that is a function of the conversation id, so a conversation
  keeps its choice (also across restarts) while new conversations spread; a
  conversation whose messages went somewhere keeps that address and, at step 3,
  that broker instance while a route still leads there (``Conversation.address``,
  ``Conversation.chosen_instance``);
* ``TRANSPORT`` addresses (R-ROUTE-9);
* the forwarding gate (R-ROUTE-6) and the self-address rule (R-ROUTE-8);
* locating the local service (R-ROUTE-11, R-ROUTE-12);
* the R-ROUTE-13 outcomes: DELAYED for conversations that originate here,
  drop (not acknowledged) for messages from outside.

What it does not own: which partner of a mirrored route is principal
(R-ROUTE-10, ``brokerd.routing.mirrors``), the dynamic-routing dialog itself and the
binding to the acknowledging broker instance (R-ROUTE-3): the engine supplies
the bound broker instance as ``Conversation.broker_instance``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from brokerd.config import normal_tcp_address
from brokerd.storage.catalog import Route

LOCAL = "LOCAL"
TRANSPORT = "TRANSPORT"
BROKER_CONFIGURATION_SERVICE = "SQL/ServiceBroker/BrokerConfiguration"
"""The dynamic routing service's name (R-ROUTE-14): a route to it enables step 4."""


@dataclass(frozen=True)
class LocalDatabase:
    """A database of this instance, as routing sees it."""

    name: str
    broker_instance: uuid.UUID
    services: frozenset[str]


@dataclass(frozen=True)
class Conversation:
    """What routing needs to know about the conversation a message belongs to."""

    service: str
    """The service the message goes to."""
    conversation_id: uuid.UUID
    broker_instance: uuid.UUID | None = None
    """The broker instance the conversation names (or is bound to, R-ROUTE-3)."""
    origin_database: str | None = None
    """The database that created the conversation; None = it arrived from outside."""
    address: str | None = None
    """Where its messages went so far (the address of the route it was given): among
    equal routes it keeps that one, whatever routes were added or dropped meanwhile
    (R-ROUTE-5, R-ROUTE-3: a conversation bound to a broker stays with it)."""
    chosen_instance: uuid.UUID | None = None
    """The broker instance of the route its messages went to so far. A conversation that
    names none keeps it at R-ROUTE-4 step 3 while a route still names it, whatever routes
    were added or dropped meanwhile: until its first acknowledgement binds it
    (R-ROUTE-3), a message of it may have reached that broker, and another broker would
    begin the dialog again."""


@dataclass(frozen=True)
class Decision:
    """Where to send: a ``local`` database, the ``network``, ``delayed`` or ``drop``."""

    kind: Literal["local", "network", "delayed", "drop"]
    reason: str
    route: str | None = None
    address: str | None = None
    mirror_address: str | None = None
    """Set when the route has a mirror: the principal of the pair gets the messages."""
    database: str | None = None
    broker_instance: uuid.UUID | None = None
    request_route: bool = False
    """R-ROUTE-4 step 4: ask the dynamic routing service for a route to this service."""
    awaits_route_request: bool = False
    """Made while a request for a route to this service was pending (R-ROUTE-14): it may
    change once that request is answered, abandoned or no longer pending, so no cache
    keeps it (set by the caller, which knows the requests)."""
    arrived_from_outside: bool = False
    """Routed as a conversation from outside (msdb routes), directly or by R-ROUTE-8."""
    choices: int = 1
    """How many equal routes the choice was spread over (load balancing, R-ROUTE-5)."""
    steps: tuple[str, ...] = ()
    """The reasoning, one line per step, in order."""
    valid_until: datetime | None = None
    """The earliest lifetime of a route consulted: the decision may change then."""


_Trace = Callable[[str], None]
"""Records one line of the reasoning (``list.append`` of the decision's steps)."""


@dataclass(frozen=True)
class _Pending:
    """The dynamic routing requests of the route table (R-ROUTE-14): the services asked
    for, and whether no more may be asked for now (``limits.route_requests``)."""

    services: Collection[str]
    full: bool


def spread(choices: Sequence[Route], conversation: Conversation) -> Route:
    """One route of ``choices``, always the same for a conversation (R-ROUTE-5, R-ROUTE-3).

    The one to the address its messages went to so far, while such a route is among
    ``choices``; otherwise a function of the conversation id (uniformly random), so new
    conversations spread evenly over equal routes, and a conversation keeps its choice
    after a restart of the broker while the routes stay as they were.
    """
    ordered = sorted(choices, key=lambda r: r.name)
    if conversation.address is not None:
        for route in ordered:
            if route.address == conversation.address:
                return route
    return ordered[conversation.conversation_id.int % len(ordered)]


def equivalent(routes: Iterable[Route]) -> list[Route]:
    """R-ROUTE-5: routes with the same broker instance, service name and address count as one."""
    seen: dict[tuple[object, ...], Route] = {}
    for route in sorted(routes, key=lambda r: r.name):
        seen.setdefault((route.broker_instance, route.remote_service_name, route.address), route)
    return list(seen.values())


def transport_address(service: str) -> str | None:
    """R-ROUTE-9: ``tcp://host:port/...`` -> ``tcp://host:port``; None for other names."""
    if service[:6].lower() != "tcp://":
        return None
    try:
        return normal_tcp_address("tcp://" + service[6:].split("/", 1)[0])
    except ValueError:
        return None


def locate_local(
    service: str,
    broker_instance: uuid.UUID | None,
    databases: Sequence[LocalDatabase],
    holding_database: str | None,
) -> LocalDatabase | None:
    """R-ROUTE-12: the database of this instance that should receive ``service``'s messages.

    With a broker instance (named by the conversation or the route): the database
    with that identifier, if it holds the service. Otherwise the database holding
    the conversation first, then any other database holding the service.
    """
    if broker_instance is not None:
        for db in databases:
            if db.broker_instance == broker_instance and service in db.services:
                return db
        return None
    for db in databases:
        if db.name == holding_database and service in db.services:
            return db
    for db in databases:
        if service in db.services:
            return db
    return None


def _names(routes: Iterable[Route]) -> str:
    return ", ".join(r.describe() for r in routes)


def decide(
    routes: Iterable[Route],
    conversation: Conversation,
    databases: Sequence[LocalDatabase],
    now: datetime,
    *,
    msdb_routes: Iterable[Route] | None = None,
    forwarding: bool = False,
    own_addresses: Collection[str] = (),
    pending_route_requests: Collection[str] = (),
    route_requests_full: bool = False,
) -> Decision:
    """Route one conversation's messages (R-ROUTE-1, R-ROUTE-4 matching, R-ROUTE-5 selection).

    ``routes`` is the table of the originating database, or msdb's when
    ``conversation.origin_database`` is None (R-ROUTE-1). ``msdb_routes`` is
    needed for R-ROUTE-8 (a route that leads back to this instance);
    ``forwarding`` is the endpoint's ``message_forwarding`` (R-ROUTE-6);
    ``own_addresses`` are the ``tcp://`` addresses that reach this instance;
    ``pending_route_requests`` the services with a dynamic-routing request in
    flight (R-ROUTE-14: at most one per service name); ``route_requests_full``: the
    table has ``limits.route_requests`` of them, so step 4 asks for a route later.
    """
    lines: list[str] = []
    trace = lines.append
    table = list(routes)
    outside = conversation.origin_database is None
    if outside:
        trace("R-ROUTE-1: the conversation arrived from outside the instance: msdb's routes")
    else:
        trace(
            f"R-ROUTE-1: the conversation began in database {conversation.origin_database!r}: "
            "that database's routes"
        )
    pending = _Pending(pending_route_requests, route_requests_full)
    decision = _decide_in(table, conversation, databases, now, trace, forwarding, pending)
    if (
        decision.kind == "network"
        and decision.address in own_addresses
        and not decision.mirror_address
    ):
        trace(
            f"R-ROUTE-8: {decision.address} is this instance's own address: the conversation "
            "is routed as if it had arrived from outside, with msdb's routes"
        )
        if outside:
            return _finish(
                Decision(
                    "drop",
                    f"route {decision.route} leads back to this instance (R-ROUTE-8); dropped",
                    decision.route,
                    arrived_from_outside=True,
                    choices=decision.choices,
                ),
                lines,
                table,
                now,
            )
        inner = list(msdb_routes or ())
        again = _decide_in(
            inner,
            replace(conversation, origin_database=None),
            databases,
            now,
            trace,
            forwarding,
            pending,
        )
        if again.kind == "network" and again.address in own_addresses:
            again = Decision(
                "drop",
                f"msdb route {again.route} leads back to this instance again; routing loop",
                again.route,
                choices=again.choices,
            )
            trace(f"R-ROUTE-8: {again.reason}")
        if again.kind == "drop":
            # The conversation began here: nothing is lost, its messages wait (R-ROUTE-13).
            reason = again.reason
            for suffix in ("; dropped (R-ROUTE-13)", "; dropped (R-ROUTE-6)"):
                reason = reason.removesuffix(suffix)
            trace(
                "R-ROUTE-13: the conversation began in this instance: nothing is dropped, "
                "its messages wait in the transmission queue (DELAYED)"
            )
            again = Decision(
                "delayed",
                f"{reason}; DELAYED, the messages wait in the transmission queue "
                "(R-ROUTE-8, R-ROUTE-13)",
                again.route,
                choices=again.choices,
            )
        # The route back here was one choice among equal routes (R-ROUTE-5): the outcome
        # holds only for the conversations that made it, never for every conversation.
        return _finish(
            replace(again, arrived_from_outside=True, choices=again.choices * decision.choices),
            lines,
            table + inner,
            now,
        )
    return _finish(decision, lines, table, now)


def _finish(decision: Decision, lines: list[str], table: list[Route], now: datetime) -> Decision:
    lines.append(f"decision: {decision.kind.upper()}: {decision.reason}")
    expiries = [r.lifetime for r in table if r.lifetime is not None and r.lifetime > now]
    return replace(decision, steps=tuple(lines), valid_until=min(expiries) if expiries else None)


def _decide_in(
    table: list[Route],
    conversation: Conversation,
    databases: Sequence[LocalDatabase],
    now: datetime,
    trace: _Trace,
    forwarding: bool,
    pending: _Pending,
) -> Decision:
    service = conversation.service
    instance = conversation.broker_instance
    outside = conversation.origin_database is None
    live: list[Route] = []
    for route in table:
        if route.expired(now):
            trace(f"R-OBJ-5: route {route.name} expired at {route.lifetime}; ignored")
        else:
            live.append(route)
    named = [r for r in live if r.remote_service_name == service]

    matched: list[Route] = []
    step = 0
    instance_choices = 1
    # Step 1
    if instance is None:
        trace("R-ROUTE-4 step 1: skipped, the conversation names no broker instance")
    else:
        matched = [r for r in named if r.broker_instance == instance]
        trace(
            f"R-ROUTE-4 step 1: routes for service {service!r} and broker instance {instance}: "
            + (_names(matched) if matched else "none")
        )
        step = 1 if matched else 0
    # Step 2
    if not matched:
        matched = [r for r in named if r.broker_instance is None]
        trace(
            f"R-ROUTE-4 step 2: routes for service {service!r} with any broker instance (NULL): "
            + (_names(matched) if matched else "none")
        )
        step = 2 if matched else 0
    # Step 3
    if not matched:
        if instance is not None:
            trace("R-ROUTE-4 step 3: skipped, the conversation names a broker instance")
        else:
            with_instance = [r for r in named if r.broker_instance is not None]
            instances = sorted({r.broker_instance for r in with_instance}, key=str)
            if instances:
                kept = conversation.chosen_instance
                if kept in instances:
                    chosen, how = kept, "kept by this conversation, whose messages went to it"
                else:
                    # The high bits: independent of the R-ROUTE-5 spread (low bits).
                    chosen = instances[(conversation.conversation_id.int >> 64) % len(instances)]
                    how = "chosen for this conversation"
                matched = [r for r in with_instance if r.broker_instance == chosen]
                instance_choices = len(instances)
                trace(
                    f"R-ROUTE-4 step 3: routes for service {service!r} naming a broker instance: "
                    f"{_names(with_instance)}; broker instance {chosen} {how} "
                    f"(one of {len(instances)}): {_names(matched)}"
                )
                step = 3
            else:
                trace(
                    f"R-ROUTE-4 step 3: routes for service {service!r} naming a broker instance: "
                    "none"
                )
    # Step 4
    if not matched:
        dynamic = [r for r in live if r.remote_service_name == BROKER_CONFIGURATION_SERVICE]
        if dynamic and service == BROKER_CONFIGURATION_SERVICE:
            trace("R-ROUTE-4 step 4: skipped, this is the dynamic routing service itself")
        elif dynamic and service not in pending.services:
            if pending.full:
                trace(
                    f"R-ROUTE-4 step 4: a route to the dynamic routing service exists "
                    f"({_names(dynamic)}), but {len(pending.services)} requests are pending "
                    "(limits.route_requests): DELAYED, and the MissingRoute request is sent "
                    "when the conversation is routed again with fewer pending (R-ROUTE-14)"
                )
                reason = (
                    f"no route to service {service!r}; DELAYED until the dynamic routing "
                    f"service can be asked for one: {len(pending.services)} requests are "
                    "pending (limits.route_requests) (R-ROUTE-4 step 4, R-ROUTE-14)"
                )
            else:
                trace(
                    f"R-ROUTE-4 step 4: a route to the dynamic routing service exists "
                    f"({_names(dynamic)}) and no request for {service!r} is pending: "
                    "DELAYED, and a MissingRoute request is sent (R-ROUTE-14)"
                )
                reason = (
                    f"no route to service {service!r}; DELAYED while the dynamic routing "
                    "service is asked for one (R-ROUTE-4 step 4, R-ROUTE-14)"
                )
            return Decision(
                "delayed",
                reason,
                dynamic[0].name,
                request_route=True,
                arrived_from_outside=outside,
            )
        elif dynamic:
            trace(
                f"R-ROUTE-4 step 4: a request for {service!r} to the dynamic routing service "
                "is already pending; going on"
            )
        else:
            trace("R-ROUTE-4 step 4: no route to a dynamic routing service")
    # Step 5
    if not matched:
        matched = [r for r in live if r.remote_service_name is None and r.broker_instance is None]
        trace(
            "R-ROUTE-4 step 5: routes with NULL service name and NULL broker instance: "
            + (_names(matched) if matched else "none")
        )
        step = 5 if matched else 0
    # Step 6
    if not matched:
        if instance is None:
            trace("R-ROUTE-4 step 6: skipped, the conversation names no broker instance")
        else:
            holders = [db.name for db in databases if service in db.services]
            if holders:
                trace(
                    f"R-ROUTE-4 step 6: database(s) {', '.join(holders)} hold service "
                    f"{service!r}: routed as if a route ({service}, LOCAL) existed"
                )
                matched = [Route("(implicit LOCAL, R-ROUTE-4 step 6)", LOCAL, service)]
                step = 6
            else:
                trace(f"R-ROUTE-4 step 6: no database of this instance holds {service!r}")
    # Step 7
    if not matched:
        trace("R-ROUTE-4 step 7: no route matched")
        return _no_route(service, outside, "no route matches")
    decision = _select(equivalent(matched), step, conversation, databases, trace, forwarding)
    return replace(decision, choices=decision.choices * instance_choices)


def _select(
    matched: list[Route],
    step: int,
    conversation: Conversation,
    databases: Sequence[LocalDatabase],
    trace: _Trace,
    forwarding: bool,
) -> Decision:
    service = conversation.service
    outside = conversation.origin_database is None
    found = f"R-ROUTE-4 step {step}"
    trace(f"R-ROUTE-5: choosing among {len(matched)} route(s), equivalent routes counted once")
    # Step 1
    mirrored = [r for r in matched if r.mirror_address is not None]
    if mirrored:
        route = spread(mirrored, conversation)
        trace(f"R-ROUTE-5 step 1: route(s) with a mirror address; chose {route.describe()}")
        return _gate(
            Decision(
                "network",
                f"{found}, R-ROUTE-5 step 1: route {route.name} to the principal of "
                f"{route.address} / {route.mirror_address} (R-ROUTE-10)",
                route.name,
                route.address,
                route.mirror_address,
                broker_instance=route.broker_instance,
                arrived_from_outside=outside,
                choices=len(mirrored),
            ),
            trace,
            forwarding,
        )
    trace("R-ROUTE-5 step 1: no route with a mirror address")
    # Step 2
    local = [r for r in matched if r.address == LOCAL]
    if local:
        route = spread(local, conversation)
        here = locate_local(
            service,
            route.broker_instance or conversation.broker_instance,
            databases,
            conversation.origin_database,
        )
        if here is not None:
            trace(f"R-ROUTE-5 step 2: LOCAL route {route.describe()}")
            which = (
                f"broker instance {here.broker_instance}"
                if (route.broker_instance or conversation.broker_instance)
                else "service name"
            )
            trace(f"R-ROUTE-12: database {here.name!r} (found by {which})")
            return Decision(
                "local",
                f"{found}, R-ROUTE-5 step 2: route {route.name} (LOCAL) to database "
                f"{here.name!r} (R-ROUTE-12)",
                route.name,
                database=here.name,
                broker_instance=here.broker_instance,
                arrived_from_outside=outside,
                choices=len(local),
            )
        wanted = route.broker_instance or conversation.broker_instance
        trace(
            f"R-ROUTE-5 step 2: LOCAL route {route.name}, but no database of this instance "
            f"holds service {service!r}"
            + (f" with broker instance {wanted}" if wanted else "")
            + "; going on to step 3"
        )
    else:
        trace("R-ROUTE-5 step 2: no LOCAL route")
    # Step 3
    network = [r for r in matched if r.address not in (LOCAL, TRANSPORT)]
    if network:
        route = spread(network, conversation)
        trace(
            f"R-ROUTE-5 step 3: network route(s) {_names(network)}; chose {route.name} for "
            "this conversation"
        )
        return _gate(
            Decision(
                "network",
                f"{found}, R-ROUTE-5 step 3: route {route.name} to {route.address}",
                route.name,
                route.address,
                broker_instance=route.broker_instance,
                arrived_from_outside=outside,
                choices=len(network),
            ),
            trace,
            forwarding,
        )
    trace("R-ROUTE-5 step 3: no route with a network address")
    # Step 4
    transport = [r for r in matched if r.address == TRANSPORT]
    if transport:
        route = spread(transport, conversation)
        address = transport_address(service)
        if address is not None:
            trace(
                f"R-ROUTE-5 step 4: TRANSPORT route {route.name}; R-ROUTE-9: the address is "
                f"taken from the service name: {address}"
            )
            return _gate(
                Decision(
                    "network",
                    f"{found}, R-ROUTE-5 step 4: route {route.name} (TRANSPORT) to {address} "
                    "(R-ROUTE-9)",
                    route.name,
                    address,
                    broker_instance=route.broker_instance,
                    arrived_from_outside=outside,
                    choices=len(transport),
                ),
                trace,
                forwarding,
            )
        trace(
            f"R-ROUTE-5 step 4: TRANSPORT route {route.name}, but {service!r} is not of the "
            "form tcp://host:port/... (R-ROUTE-9)"
        )
    else:
        trace("R-ROUTE-5 step 4: no TRANSPORT route")
    return _no_route(service, outside, f"{found} matched only routes that cannot deliver it")


def _gate(decision: Decision, trace: _Trace, forwarding: bool) -> Decision:
    """R-ROUTE-6: a message from outside may leave by a non-LOCAL route only if forwarding is on."""
    if not decision.arrived_from_outside:
        return decision
    if forwarding:
        trace("R-ROUTE-6: message forwarding is enabled: the message is forwarded (R-ROUTE-7)")
        return decision
    trace("R-ROUTE-6: message forwarding is disabled: the message is dropped, not acknowledged")
    return Decision(
        "drop",
        f"{decision.reason}, but message forwarding is disabled; dropped (R-ROUTE-6)",
        decision.route,
        decision.address,
        arrived_from_outside=True,
    )


def _no_route(service: str, outside: bool, why: str) -> Decision:
    if outside:
        return Decision(
            "drop",
            f"no route to service {service!r} ({why}); dropped (R-ROUTE-13)",
            arrived_from_outside=True,
        )
    return Decision("delayed", f"no route to service {service!r} ({why}); DELAYED (R-ROUTE-13)")
