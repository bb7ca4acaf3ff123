"""The local cluster's topology, described once as data: which brokers, their databases,
services, queues and routes. ``brokerd cluster up`` (``brokerd.tools.cluster``) writes
each broker's configuration from it; a compose file can be generated from the same
description, resolving broker names to container host names instead of loopback
addresses (:meth:`Topology.databases_toml` takes the resolver).

The local cluster (:data:`LOCAL`) shows the routing model in one place:

* ``shop``: the initiator's database, service ``//shop/Client``; its routes send the
  warehouse's traffic to the hub (two routes, one per warehouse's broker instance: load
  balancing, R-ROUTE-5) and the parts traffic to the mirrored pair (a route with a
  mirror address, R-ROUTE-10);
* ``hub``: a forwarder (message forwarding on, R-ROUTE-6/7): msdb routes by broker
  instance to each warehouse and back to the shop;
* ``warehouse-1``, ``warehouse-2``: the target service ``//warehouse/Orders`` on two
  brokers, each with its own broker instance, replying through the hub;
* ``parts-principal``, ``parts-mirror``: the database ``parts`` mirrored (one broker
  instance, ``mirror_partner`` each other, R-ROUTE-16), replying to the shop directly.

May import the standard library only.
"""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

SHOP_SERVICE = "//shop/Client"
WAREHOUSE_SERVICE = "//warehouse/Orders"
PARTS_SERVICE = "//parts/OrderParts"
ORDER = "//shop/Order"
CONTRACT = "//shop/OrderContract"

WAREHOUSE_1 = uuid.UUID("7a1c55e0-3b7e-4f0c-9d1e-5c0a9e3b1a01")
WAREHOUSE_2 = uuid.UUID("7a1c55e0-3b7e-4f0c-9d1e-5c0a9e3b1a02")
PARTS = uuid.UUID("7a1c55e0-3b7e-4f0c-9d1e-5c0a9e3b1a03")

Resolve = Callable[[str], str]
"""A broker's name -> the host its peers dial (a loopback address, a container's name)."""


@dataclass(frozen=True)
class Route:
    """A route row (R-OBJ-5) naming brokers, not addresses: ``to`` (and ``mirror``) are
    broker names the resolver turns into ``tcp://host:4022``."""

    name: str
    service: str
    to: str
    broker_instance: uuid.UUID | None = None
    mirror: str | None = None


@dataclass(frozen=True)
class Database:
    name: str
    services: tuple[tuple[str, str], ...] = ()
    """(service, queue)"""
    routes: tuple[Route, ...] = ()
    broker_instance: uuid.UUID | None = None
    mirror_role: str | None = None
    mirror_partner: str | None = None
    """The partner broker's name (a mirrored database)."""


@dataclass(frozen=True)
class Broker:
    name: str
    role: str
    """What it stands for, in words (the tables print it)."""
    databases: tuple[Database, ...]
    forwarding: bool = False


@dataclass(frozen=True)
class Topology:
    brokers: tuple[Broker, ...]
    message_types: tuple[str, ...] = (ORDER,)
    contract: str = CONTRACT
    hosts: dict[str, str] = field(default_factory=dict)
    """Loopback address of each broker, in order (:func:`loopback_hosts`)."""
    poison_rollbacks: int | None = None
    """Every queue quarantines a conversation after this many rollbacks in a row
    (R-OBJ-3, §6); None: the default poison-message handling."""

    def broker(self, name: str) -> Broker:
        return next(b for b in self.brokers if b.name == name)

    def databases_toml(self, broker: Broker, resolve: Resolve) -> str:
        """The ``[[database]]`` tables of ``broker``'s configuration."""
        return "".join(self._database(db, resolve) for db in broker.databases)

    def _database(self, db: Database, resolve: Resolve) -> str:
        lines = ["", "[[database]]", f'name = "{db.name}"']
        if db.broker_instance is not None:
            lines.append(f'broker_instance = "{db.broker_instance}"')
        if db.mirror_role is not None:
            lines.append(f'mirror_role = "{db.mirror_role}"')
        if db.mirror_partner is not None:
            lines.append(f'mirror_partner = "{_address(resolve(db.mirror_partner))}"')
        if db.services:
            for message_type in self.message_types:
                lines += ["[[database.message_type]]", f'name = "{message_type}"']
            lines += [
                "[[database.contract]]",
                f'name = "{self.contract}"',
                "messages = [",
                *(f'  {{ message_type = "{m}", sent_by = "any" }},' for m in self.message_types),
                "]",
            ]
        for service, queue in db.services:
            lines += ["[[database.queue]]", f'name = "{queue}"']
            if self.poison_rollbacks is not None:
                lines += [
                    'poison_message_handling = "quarantine"',
                    f"poison_rollbacks = {self.poison_rollbacks}",
                ]
            lines += [
                "[[database.service]]",
                f'name = "{service}"',
                f'queue = "{queue}"',
                f'contracts = ["{self.contract}", "DEFAULT"]',
            ]
        for route in db.routes:
            lines += [
                "[[database.route]]",
                f'name = "{route.name}"',
                f'remote_service_name = "{route.service}"',
                f'address = "{_address(resolve(route.to))}"',
            ]
            if route.broker_instance is not None:
                lines.append(f'broker_instance = "{route.broker_instance}"')
            if route.mirror is not None:
                lines.append(f'mirror_address = "{_address(resolve(route.mirror))}"')
        return "\n".join(lines) + "\n"


def _address(host: str) -> str:
    return f"tcp://{host}:4022"


def loopback_hosts(names: list[str], first: str = "127.0.0.1") -> dict[str, str]:
    """One loopback address each, in order: ``first``, the next, ...; ValueError if
    ``first`` is not an IPv4 loopback address or the last would not be one."""
    try:
        start = ipaddress.IPv4Address(first)
    except ValueError:
        raise ValueError(f"{first!r} is not an IPv4 address") from None
    last = start + max(len(names) - 1, 0)
    if not (start.is_loopback and last.is_loopback):
        raise ValueError(f"{first} to {last}: the cluster's addresses must be loopback (127.x)")
    return {name: str(start + i) for i, name in enumerate(names)}


def _parts(role: str, partner: str) -> Database:
    return Database(
        "parts",
        ((PARTS_SERVICE, "PartsQueue"),),
        (Route("ToShop", SHOP_SERVICE, "shop"),),
        PARTS,
        role,
        partner,
    )


def _warehouse(instance: uuid.UUID) -> Database:
    return Database(
        "warehouse",
        ((WAREHOUSE_SERVICE, "OrderQueue"),),
        (Route("ToShop", SHOP_SERVICE, "hub"),),
        instance,
    )


def local(
    first: str = "127.0.0.1",
    *,
    message_types: tuple[str, ...] = (ORDER,),
    contract: str = CONTRACT,
    poison_rollbacks: int | None = None,
) -> Topology:
    """The local cluster, its brokers on ``first`` and the addresses after it; an
    application brings its own ``message_types`` and ``contract`` (``brokerd demo``: the
    application guide's) and may quarantine poison messages after ``poison_rollbacks``."""
    brokers = (
        Broker(
            "shop",
            "initiator",
            (
                Database(
                    "shop",
                    ((SHOP_SERVICE, "ClientQueue"),),
                    (
                        Route("Warehouse1", WAREHOUSE_SERVICE, "hub", WAREHOUSE_1),
                        Route("Warehouse2", WAREHOUSE_SERVICE, "hub", WAREHOUSE_2),
                        Route("Parts", PARTS_SERVICE, "parts-principal", mirror="parts-mirror"),
                    ),
                ),
            ),
        ),
        Broker(
            "hub",
            "forwarder",
            (
                Database(
                    "msdb",
                    routes=(
                        Route("Warehouse1", WAREHOUSE_SERVICE, "warehouse-1", WAREHOUSE_1),
                        Route("Warehouse2", WAREHOUSE_SERVICE, "warehouse-2", WAREHOUSE_2),
                        Route("Shop", SHOP_SERVICE, "shop"),
                    ),
                ),
            ),
            forwarding=True,
        ),
        Broker("warehouse-1", "target, load balanced", (_warehouse(WAREHOUSE_1),)),
        Broker("warehouse-2", "target, load balanced", (_warehouse(WAREHOUSE_2),)),
        Broker(
            "parts-principal", "mirrored target: principal", (_parts("principal", "parts-mirror"),)
        ),
        Broker("parts-mirror", "mirrored target: mirror", (_parts("mirror", "parts-principal"),)),
    )
    return Topology(
        brokers,
        message_types,
        contract,
        loopback_hosts([b.name for b in brokers], first),
        poison_rollbacks,
    )


LOCAL = local()
"""The local cluster on 127.0.0.1 to 127.0.0.6."""
