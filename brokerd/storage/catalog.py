"""The in-memory catalog of one database: message types, contracts, queues, services, routes.

Built from the configuration at start-up and persisted in the database's
tables (R-OBJ-1..6); the dialog engine asks it the contract question of
R-DLG-3 ("may this role send this message type?") and the body validation of
R-OBJ-1.
"""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from brokerd.config import DatabaseConfig, PoisonPolicy
from brokerd.storage import queries
from brokerd.storage.schema import AUTO_CREATED_LOCAL, Statement
from protocol.dialog import (
    BROKER_CONFIGURATION_NOTICE,
    DEFAULT_CONTRACT,
    DEFAULT_MESSAGE_TYPE,
    DIALOG_TIMER,
    END_DIALOG,
    ERROR,
    MISSING_ROUTE,
)

SYSTEM_MESSAGE_TYPES = frozenset({END_DIALOG, ERROR, DIALOG_TIMER})
ROUTE_REQUESTER_SERVICE = "brokerd/RouteRequester"
"""The system service that asks the dynamic routing service for routes (R-ROUTE-14)."""
ROUTE_REQUESTER_QUEUE = "brokerd_route_requests"


@dataclass(frozen=True)
class Route:
    """One row of a database's ``routes`` catalog (R-OBJ-5): the fields of a route as the
    configuration declares one (:class:`~brokerd.config.RouteConfig`), and where it came
    from. ``address`` is ``LOCAL``, ``TRANSPORT`` or a normalised ``tcp://host:port``."""

    name: str
    address: str
    remote_service_name: str | None = None
    broker_instance: uuid.UUID | None = None
    mirror_address: str | None = None
    lifetime: datetime | None = None
    """Absolute expiry, timezone-aware UTC; None = never expires."""
    source: str = "config"
    """``system`` (AutoCreatedLocal, made with the database file), ``config`` (the TOML
    file) or ``admin`` (SDK / brokerctl). Only ``config`` routes are written again from
    the configuration at every start; the others live in the file."""

    def expired(self, now: datetime) -> bool:
        return self.lifetime is not None and self.lifetime <= now

    def describe(self) -> str:
        """``Name (service, broker instance, address[, mirror])`` with NULL spelled out."""
        parts = [
            self.remote_service_name if self.remote_service_name is not None else "NULL",
            str(self.broker_instance) if self.broker_instance is not None else "NULL",
            self.address,
        ]
        if self.mirror_address:
            parts.append(f"mirror {self.mirror_address}")
        return f"{self.name} ({', '.join(parts)})"


@dataclass
class QueueInfo:
    name: str
    status: bool
    retention: bool
    system: bool = False
    """The broker's own queue (not listed in the queues view)."""
    configured_status: bool | None = None
    """The status the configuration declares (``status`` may differ after ALTER QUEUE)."""
    poison: PoisonPolicy = field(default_factory=PoisonPolicy)
    """Poison-message handling (SPEC §6): what ``poison.rollbacks`` rollbacks of one
    message do."""

    def __post_init__(self) -> None:
        if self.configured_status is None:
            self.configured_status = self.status

    def keep_altered(self, stored_status: bool, stored_configured: bool | None) -> None:
        """At start-up: a status set by ALTER QUEUE stays, unless the configuration's
        own status changed since the file recorded it (R-DLG-12)."""
        if stored_configured is None or stored_configured == self.configured_status:
            self.status = stored_status


@dataclass(frozen=True)
class ServiceInfo:
    name: str
    queue: str
    contracts: frozenset[str]


@dataclass
class Catalog:
    message_types: dict[str, str] = field(default_factory=dict)
    contracts: dict[str, dict[str, str]] = field(default_factory=dict)
    queues: dict[str, QueueInfo] = field(default_factory=dict)
    services: dict[str, ServiceInfo] = field(default_factory=dict)
    routes: dict[str, Route] = field(default_factory=dict)

    @classmethod
    def from_config(cls, db: DatabaseConfig) -> Catalog:
        catalog = cls()
        catalog.message_types[DEFAULT_MESSAGE_TYPE] = "none"
        catalog.contracts[DEFAULT_CONTRACT] = {DEFAULT_MESSAGE_TYPE: "any"}
        # Dynamic routing (R-ROUTE-14): the request contract and the system requester.
        catalog.message_types[MISSING_ROUTE] = "well_formed_xml"
        catalog.contracts[BROKER_CONFIGURATION_NOTICE] = {MISSING_ROUTE: "initiator"}
        catalog.queues[ROUTE_REQUESTER_QUEUE] = QueueInfo(
            ROUTE_REQUESTER_QUEUE, True, False, system=True
        )
        catalog.services[ROUTE_REQUESTER_SERVICE] = ServiceInfo(
            ROUTE_REQUESTER_SERVICE, ROUTE_REQUESTER_QUEUE, frozenset()
        )
        for mt in db.message_types:
            catalog.message_types[mt.name] = mt.validation
        for contract in db.contracts:
            catalog.contracts[contract.name] = {
                m.message_type: m.sent_by for m in contract.messages
            }
        for queue in db.queues:
            catalog.queues[queue.name] = QueueInfo(
                queue.name, queue.status, queue.retention, poison=queue.poison
            )
        for service in db.services:
            catalog.services[service.name] = ServiceInfo(
                service.name, service.queue, frozenset(service.contracts)
            )
        for route in db.routes:
            if route.name == AUTO_CREATED_LOCAL:
                continue  # restated as it is made: it lives in the file (R-OBJ-6)
            catalog.routes[route.name] = Route(
                route.name,
                route.address,
                route.remote_service_name,
                route.broker_instance,
                route.mirror_address,
                route.lifetime,
            )
        return catalog

    def persist(self) -> list[Statement]:
        """Statements that make the tables equal to this configuration's catalog: its
        message types, contracts, queues, services and routes. The routes that live in
        the file (AutoCreatedLocal, routes created at run time) are not touched."""
        out: list[Statement] = list(queries.CLEAR_CATALOG)
        out += [queries.message_type(n, v) for n, v in self.message_types.items()]
        out += [
            queries.contract_message(contract, mt, sent_by)
            for contract, messages in self.contracts.items()
            for mt, sent_by in messages.items()
        ]
        out += [
            queries.queue(q.name, q.status, q.retention, bool(q.configured_status))
            for q in self.queues.values()
        ]
        out += [queries.service(s.name, s.queue) for s in self.services.values()]
        out += [
            queries.service_contract(s.name, c)
            for s in self.services.values()
            for c in sorted(s.contracts)
        ]
        out += [route_row(r) for r in self.routes.values()]
        return out

    def add_kept_route(self, route: Route) -> Route | None:
        """A route created at run time, read back from the database file: added, unless a
        route of the configuration has its name (compared without regard to case: one name,
        one route), which then takes its place. Returns that configuration route, or None."""
        known = self.find_route(route.name)
        if known is not None and known.name != route.name:
            return known
        self.routes[route.name] = route
        return None

    def find_route(self, name: str) -> Route | None:
        """The route called ``name``, compared without regard to case (a local identifier)."""
        folded = name.casefold()
        for route in self.routes.values():
            if route.name.casefold() == folded:
                return route
        return None

    def send_refusal(self, contract: str, message_type: str, initiator: bool) -> str | None:
        """R-DLG-3: why this role may not send this message type on this contract, or None."""
        if message_type in SYSTEM_MESSAGE_TYPES:
            return None
        messages = self.contracts.get(contract)
        if messages is None:
            return f"contract {contract!r} does not exist in this database"
        sent_by = messages.get(message_type)
        role = "initiator" if initiator else "target"
        if sent_by is None:
            return f"message type {message_type!r} is not part of contract {contract!r}"
        if sent_by not in ("any", role):
            return (
                f"contract {contract!r} lets only the {sent_by} send message type "
                f"{message_type!r}; this side is the {role}"
            )
        return None

    def needs_whole_body(self, message_type: str) -> bool:
        """Whether the validation of ``message_type`` can only judge a whole body (XML);
        the others judge a fragment of a message of several as well as the whole."""
        return self.message_types.get(message_type) == "well_formed_xml"

    def validation_problem(self, message_type: str, body: bytes | bytearray) -> str | None:
        """R-OBJ-1: why ``body`` fails its message type's validation, or None."""
        if message_type in SYSTEM_MESSAGE_TYPES:
            return None
        validation = self.message_types.get(message_type)
        if validation is None:
            return f"message type {message_type!r} does not exist in this database"
        if validation == "empty" and body:
            return f"message type {message_type!r} requires an empty body"
        if validation == "well_formed_xml":
            try:
                ET.fromstring(body)
            except ET.ParseError as exc:
                return f"message type {message_type!r} requires well-formed XML: {exc}"
        return None

    def live_routes(self, now: datetime) -> list[Route]:
        return [r for r in self.routes.values() if not r.expired(now)]


def route_row(route: Route) -> Statement:
    """The ``routes`` row of one route (inserted or replaced)."""
    return queries.route(
        route.name,
        route.remote_service_name,
        str(route.broker_instance) if route.broker_instance else None,
        route.address,
        route.mirror_address,
        route.lifetime.isoformat() if route.lifetime else None,
        route.source,
    )


def route_from_row(row: Any) -> Route:
    """A route read back from the ``routes`` table."""
    return Route(
        name=row["name"],
        address=row["address"],
        remote_service_name=row["remote_service_name"],
        broker_instance=uuid.UUID(row["broker_instance"]) if row["broker_instance"] else None,
        mirror_address=row["mirror_address"],
        lifetime=datetime.fromisoformat(row["lifetime"]) if row["lifetime"] else None,
        source=row["source"],
    )
