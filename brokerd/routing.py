"""Route lookup: which address a conversation's messages go to (SPEC §2).

A pure function of (route table, conversation, local services, time) with no
I/O, kept behind one entry point, :func:`decide`, so the routing issue can
replace its inside without touching the dialog engine.

Implemented here: expiry (R-OBJ-5); matching steps 1, 2, 3, 5, 6 and 7 of
R-ROUTE-4 (step 4, dynamic routing, comes with R-ROUTE-14); selection steps 1-4
of R-ROUTE-5 with route equivalence and a per-conversation spread over equal
choices; ``TRANSPORT`` addresses (R-ROUTE-9); local service location (R-ROUTE-12);
the R-ROUTE-13 outcomes (DELAYED for conversations that originate here, drop
for messages from outside). A mirror address is treated as a second network
address for now (R-ROUTE-10 arrives with the routing issue).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

LOCAL = "LOCAL"
TRANSPORT = "TRANSPORT"


@dataclass(frozen=True)
class Route:
    """One row of a database's ``routes`` catalog (R-OBJ-5)."""

    name: str
    address: str
    remote_service_name: str | None = None
    broker_instance: uuid.UUID | None = None
    mirror_address: str | None = None
    lifetime: datetime | None = None
    source: str = "config"

    def expired(self, now: datetime) -> bool:
        return self.lifetime is not None and self.lifetime <= now


@dataclass(frozen=True)
class LocalService:
    """A service present in one database of this instance."""

    database: str
    broker_instance: uuid.UUID


@dataclass(frozen=True)
class Decision:
    """Where to send: ``local`` (a database here), ``network``, ``delayed`` or ``drop``."""

    kind: Literal["local", "network", "delayed", "drop"]
    reason: str
    route: str | None = None
    address: str | None = None
    database: str | None = None
    broker_instance: uuid.UUID | None = None


def _spread(choices: Sequence[Route], conversation_id: uuid.UUID) -> Route:
    """The same conversation always picks the same route of a set (R-ROUTE-5, R-ROUTE-3)."""
    ordered = sorted(choices, key=lambda r: r.name)
    return ordered[conversation_id.int % len(ordered)]


def _equivalent(routes: Iterable[Route]) -> list[Route]:
    """Routes with the same broker instance, service name and address count as one."""
    seen: dict[tuple[object, ...], Route] = {}
    for route in sorted(routes, key=lambda r: r.name):
        seen.setdefault((route.broker_instance, route.remote_service_name, route.address), route)
    return list(seen.values())


def locate_local(
    service: str,
    broker_instance: uuid.UUID | None,
    local_services: Mapping[str, Sequence[LocalService]],
    origin_database: str | None,
) -> LocalService | None:
    """R-ROUTE-12: the database that should receive a conversation for ``service``."""
    candidates = local_services.get(service, ())
    if broker_instance is not None:
        for candidate in candidates:
            if candidate.broker_instance == broker_instance:
                return candidate
        return None
    for candidate in candidates:
        if candidate.database == origin_database:
            return candidate
    return candidates[0] if candidates else None


def decide(
    routes: Iterable[Route],
    service: str,
    broker_instance: uuid.UUID | None,
    conversation_id: uuid.UUID,
    local_services: Mapping[str, Sequence[LocalService]],
    now: datetime,
    origin_database: str | None,
) -> Decision:
    """Route a conversation's messages (R-ROUTE-4 matching, then R-ROUTE-5 selection).

    ``origin_database`` is the database that created the conversation, or None for
    a message that arrived from outside (routed with msdb's routes, R-ROUTE-1).
    """
    live = [r for r in routes if not r.expired(now)]
    named = [r for r in live if r.remote_service_name == service]
    matched: list[Route] = []
    step = ""
    if broker_instance is not None:
        matched = [r for r in named if r.broker_instance == broker_instance]
        step = "R-ROUTE-4 step 1 (service name and broker instance)"
    if not matched:
        matched = [r for r in named if r.broker_instance is None]
        step = "R-ROUTE-4 step 2 (service name, any broker instance)"
    if not matched and broker_instance is None:
        with_instance = [r for r in named if r.broker_instance is not None]
        if with_instance:
            chosen = _spread(_equivalent(with_instance), conversation_id).broker_instance
            matched = [r for r in with_instance if r.broker_instance == chosen]
            step = "R-ROUTE-4 step 3 (service name, one broker instance)"
    if not matched:
        matched = [r for r in live if r.remote_service_name is None and r.broker_instance is None]
        step = "R-ROUTE-4 step 5 (catch-all route)"
    if not matched and broker_instance is not None:
        here = locate_local(service, broker_instance, local_services, origin_database)
        if here is not None:
            return Decision(
                "local",
                "R-ROUTE-4 step 6: the named broker instance is a database of this instance",
                database=here.database,
                broker_instance=here.broker_instance,
            )
    if not matched:
        return _no_route(service, origin_database, "no route matches")
    return _select(
        _equivalent(matched),
        step,
        service,
        broker_instance,
        conversation_id,
        local_services,
        origin_database,
    )


def _select(
    matched: list[Route],
    step: str,
    service: str,
    broker_instance: uuid.UUID | None,
    conversation_id: uuid.UUID,
    local_services: Mapping[str, Sequence[LocalService]],
    origin_database: str | None,
) -> Decision:
    mirrored = [r for r in matched if r.mirror_address is not None]
    if mirrored:
        route = _spread(mirrored, conversation_id)
        return Decision(
            "network",
            f"{step}; R-ROUTE-5 step 1 (mirror address)",
            route.name,
            route.address,
            broker_instance=route.broker_instance,
        )
    local = [r for r in matched if r.address == LOCAL]
    if local:
        route = _spread(local, conversation_id)
        here = locate_local(
            service, route.broker_instance or broker_instance, local_services, origin_database
        )
        if here is not None:
            return Decision(
                "local",
                f"{step}; R-ROUTE-5 step 2 (LOCAL)",
                route.name,
                database=here.database,
                broker_instance=here.broker_instance,
            )
    network = [r for r in matched if r.address not in (LOCAL, TRANSPORT)]
    if network:
        route = _spread(network, conversation_id)
        return Decision(
            "network",
            f"{step}; R-ROUTE-5 step 3 (network address)",
            route.name,
            route.address,
            broker_instance=route.broker_instance,
        )
    transport = [r for r in matched if r.address == TRANSPORT]
    if transport and service.lower().startswith("tcp://"):
        route = _spread(transport, conversation_id)
        address = "/".join(service.split("/", 3)[:3])
        return Decision(
            "network",
            f"{step}; R-ROUTE-5 step 4 (TRANSPORT, R-ROUTE-9)",
            route.name,
            address,
            broker_instance=route.broker_instance,
        )
    return _no_route(
        service,
        origin_database,
        f"{step} matched only LOCAL routes and no database here has the service",
    )


def _no_route(service: str, origin_database: str | None, why: str) -> Decision:
    if origin_database is None:
        return Decision("drop", f"no route to service {service!r} ({why}); dropped (R-ROUTE-13)")
    return Decision("delayed", f"no route to service {service!r} ({why}); DELAYED (R-ROUTE-13)")
