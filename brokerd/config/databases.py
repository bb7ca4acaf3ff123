"""The ``[[database]]`` sections: message types, contracts, queues, services, remote
service bindings, routes with their addresses and lifetimes, and mirroring; and
:func:`parse_route`, one route given at run time, checked as in a file."""

from __future__ import annotations

import math
import re
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from brokerd.config.addresses import normal_tcp_address
from brokerd.config.model import (
    DEFAULT_POISON_ROLLBACKS,
    MAX_ACTIVATED_INSTANCES,
    MAX_POISON_ROLLBACKS,
    MIRROR_ROLES,
    MIRROR_WHEN_LOST,
    SENT_BY,
    VALIDATIONS,
    ActivationConfig,
    ContractConfig,
    ContractMessage,
    DatabaseConfig,
    MessageTypeConfig,
    PoisonHandling,
    PoisonPolicy,
    QueueConfig,
    RemoteServiceBindingConfig,
    RouteConfig,
    ServiceConfig,
)
from brokerd.config.tables import Table, Unique, describe, near
from protocol.dialog import BROKER_CONFIGURATION_NOTICE, MISSING_ROUTE

_DEFAULT = "DEFAULT"
_AUTO_ROUTE = "AutoCreatedLocal"
MSDB = "msdb"
_DATABASE_NAME = re.compile(r"[A-Za-z0-9_-]+")

DATABASE_KEYS = (
    "name",
    "broker_instance",
    "message_type",
    "contract",
    "queue",
    "service",
    "route",
    "remote_service_binding",
    "mirror_role",
    "mirror_partner",
    "mirror_when_lost",
    "mirror_timeout",
)


def parse_database(t: Table, now: datetime, base: Path) -> DatabaseConfig:
    name = t.name()
    if not _DATABASE_NAME.fullmatch(name):
        raise t.error(
            "name",
            f"database name {name!r} may contain only letters, digits, '_' and '-' "
            "(it becomes a file name)",
        )
    if name.casefold() == "master":
        raise t.error("name", "'master' is reserved and cannot be configured")
    if name.casefold() == MSDB and name != MSDB:
        raise t.error("name", f"write the msdb database's name as '{MSDB}', not {name!r}")
    broker_instance = t.broker_instance("broker_instance")

    message_types: list[MessageTypeConfig] = []
    names = Unique("message type", name, fold=False)
    for mt in t.tables("message_type", ("name", "validation")):
        mt_name = mt.name()
        if mt_name == _DEFAULT:
            raise mt.error("name", "the message type 'DEFAULT' is built in and cannot be redefined")
        names.add(mt, mt_name)
        validation = mt.choice("validation", "none", VALIDATIONS)
        message_types.append(MessageTypeConfig(mt_name, validation))
    known_types = {*names.seen, _DEFAULT, MISSING_ROUTE}

    contracts: list[ContractConfig] = []
    names = Unique("contract", name, fold=False)
    for ct in t.tables("contract", ("name", "messages")):
        ct_name = ct.name()
        if ct_name == _DEFAULT:
            raise ct.error("name", "the contract 'DEFAULT' is built in and cannot be redefined")
        names.add(ct, ct_name)
        if "messages" not in ct.data:
            raise ct.error("messages", "is required (the message types of the contract)")
        lines: list[ContractMessage] = []
        listed: set[str] = set()
        for line in ct.tables("messages", ("message_type", "sent_by")):
            message_type = line.required_text("message_type")
            if message_type not in known_types:
                raise line.error(
                    "message_type",
                    f"message type '{message_type}' is not defined in database '{name}'"
                    + near(message_type, known_types),
                )
            if message_type in listed:
                raise line.error(
                    "message_type",
                    f"message type '{message_type}' is listed twice in contract '{ct_name}' "
                    '(use sent_by = "any" for both roles)',
                )
            listed.add(message_type)
            if "sent_by" not in line.data:
                raise line.error("sent_by", f"is required (one of {', '.join(SENT_BY)})")
            sent_by = line.choice("sent_by", "any", SENT_BY)
            lines.append(ContractMessage(message_type, sent_by))
        if not lines:
            raise ct.error("messages", f"contract '{ct_name}' needs at least one message type")
        contracts.append(ContractConfig(ct_name, tuple(lines)))
    known_contracts = {*names.seen, _DEFAULT, BROKER_CONFIGURATION_NOTICE}

    queues: list[QueueConfig] = []
    names = Unique("queue", name, fold=True)
    for qt in t.tables(
        "queue",
        (
            "name",
            "status",
            "retention",
            "poison_message_handling",
            "poison_rollbacks",
            "activation",
        ),
    ):
        q_name = qt.name()
        names.add(qt, q_name)
        queues.append(
            QueueConfig(
                q_name,
                _queue_status(qt),
                qt.flag("retention", False),
                _poison(qt),
                _activation(qt, base),
            )
        )
    known_queues = {q.name for q in queues}

    services: list[ServiceConfig] = []
    names = Unique("service", name, fold=False)
    for st in t.tables(
        "service",
        ("name", "queue", "contracts", "certificate", "private_key", "dialog_security"),
    ):
        s_name = st.name()
        names.add(st, s_name)
        queue = st.required_text("queue")
        if queue not in known_queues:
            raise st.error(
                "queue",
                f"queue '{queue}' is not defined in database '{name}'" + near(queue, known_queues),
            )
        accepted = st.strings("contracts")
        for i, contract in enumerate(accepted):
            if contract not in known_contracts:
                raise st.error(
                    f"contracts[{i}]",
                    f"contract '{contract}' is not defined in database '{name}'"
                    + near(contract, known_contracts),
                )
            if contract in accepted[:i]:
                raise st.error(f"contracts[{i}]", f"contract '{contract}' is listed twice")
        certificate = st.path("certificate", base)
        private_key = st.path("private_key", base)
        if (certificate is None) != (private_key is None):
            given, missing = (
                ("certificate", "private_key")
                if certificate is not None
                else ("private_key", "certificate")
            )
            raise st.error(missing, f"is required with {given} (the service's key pair)")
        security = st.choice("dialog_security", "off", ("off", "required")) == "required"
        if security and certificate is None:
            raise st.error(
                "dialog_security",
                "a service that requires dialog security needs its certificate and "
                "private_key (brokerd certs service NAME)",
            )
        services.append(
            ServiceConfig(s_name, queue, tuple(accepted), certificate, private_key, security)
        )

    bindings: list[RemoteServiceBindingConfig] = []
    bound: dict[str, str] = {}
    for bt in t.tables("remote_service_binding", ("service", "certificate")):
        service = bt.required_text("service")
        if service in bound:
            raise bt.error("service", f"service '{service}' is already bound at {bound[service]}")
        bound[service] = bt.where
        bindings.append(RemoteServiceBindingConfig(service, bt.required_path("certificate", base)))

    routes: list[RouteConfig] = []
    names = Unique("route", name, fold=True)
    for rt in t.tables("route", [f.name for f in fields(RouteConfig)]):
        route = _route(rt, now)
        names.add(rt, route.name)
        routes.append(route)

    mirror_role = t.choice("mirror_role", "", MIRROR_ROLES) or None
    if mirror_role is not None and broker_instance is None:
        raise t.error(
            "mirror_role",
            "a mirrored database needs broker_instance set, the same GUID on both partners "
            "(R-ROUTE-10)",
        )
    if mirror_role is not None and name == MSDB:
        raise t.error("mirror_role", "msdb cannot be mirrored")
    partner = t.text("mirror_partner")
    if partner is not None:
        if mirror_role is None:
            raise t.error("mirror_partner", "is only allowed with mirror_role")
        partner = _tcp(t, "mirror_partner", partner)
    when_lost = t.choice("mirror_when_lost", "exposed", MIRROR_WHEN_LOST)
    mirror_timeout = t.seconds("mirror_timeout", 10.0)
    for key in ("mirror_when_lost", "mirror_timeout"):
        if key in t.data and partner is None:
            # Without a partner nothing is shipped: the setting would be ignored (a
            # principal meant to stall would release every commit at once, R-ROUTE-16).
            raise t.error(
                key,
                "is only allowed with mirror_partner (the commits of a database with "
                "no partner are not shipped, so no mirror can be lost)",
            )

    return DatabaseConfig(
        name=name,
        broker_instance=broker_instance,
        mirror_role=mirror_role,
        mirror_partner=partner,
        mirror_when_lost=when_lost,
        mirror_timeout=mirror_timeout,
        message_types=tuple(message_types),
        contracts=tuple(contracts),
        queues=tuple(queues),
        services=tuple(services),
        routes=tuple(routes),
        remote_service_bindings=tuple(bindings),
    )


def _activation(queue: Table, base: Path) -> ActivationConfig | None:
    """``activation = { command = [...], max_instances = n, ... }`` of a queue."""
    keys = [f.name for f in fields(ActivationConfig) if f.name != "directory"]
    t = queue.table("activation", keys)
    if t is None:
        return None
    command = t.strings("command")
    if not command:
        raise t.error("command", "is required: the program to start and its arguments, an array")
    if any("\0" in word for word in command):
        raise t.error(
            "command", "has a NUL character (\\u0000), which no program argument may have"
        )
    user = t.text("user")
    return ActivationConfig(
        command=tuple(command),
        directory=base,
        max_instances=t.integer("max_instances", 1, 1, MAX_ACTIVATED_INSTANCES),
        user=user,
        interval=t.seconds("interval", 5.0),
        stop_grace=t.seconds("stop_grace", 10.0),
    )


def _poison(t: Table) -> PoisonPolicy:
    """A queue's ``poison_message_handling`` and ``poison_rollbacks`` (SPEC §6)."""
    handling = t.choice(
        "poison_message_handling",
        PoisonHandling.QUARANTINE.value,
        tuple(h.value for h in PoisonHandling),
    )
    rollbacks = t.integer("poison_rollbacks", DEFAULT_POISON_ROLLBACKS, 1, MAX_POISON_ROLLBACKS)
    return PoisonPolicy(PoisonHandling(handling), rollbacks)


def _queue_status(t: Table) -> bool:
    value = t.data.get("status")
    if value is None:
        return True
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("on", "off"):
        return value.lower() == "on"
    raise t.error("status", f'must be "on", "off", true or false, not {describe(value)}')


def parse_route(data: dict[str, Any], now: datetime) -> RouteConfig:
    """One route given at run time (``brokerctl route create``), checked as in a file.

    ``data`` has the keys of a ``[[database.route]]`` table; ``lifetime`` in seconds
    counts from ``now``. Raises :class:`ConfigError` whose ``key`` names the bad field.
    """
    return _route(Table(Path("route"), "", data, [f.name for f in fields(RouteConfig)]), now)


def _route(t: Table, now: datetime) -> RouteConfig:
    name = t.name()
    raw = t.required_text("address")
    address = raw.upper() if raw.upper() in ("LOCAL", "TRANSPORT") else _tcp(t, "address", raw)
    mirror = t.text("mirror_address")
    if mirror is not None:
        if address in ("LOCAL", "TRANSPORT"):
            raise t.error(
                "mirror_address", f"is only allowed with a tcp:// address, not with {address}"
            )
        mirror = _tcp(t, "mirror_address", mirror)
        if mirror == address:
            raise t.error("mirror_address", "must differ from address")
    route = RouteConfig(
        name=name,
        address=address,
        remote_service_name=t.optional_name("remote_service_name"),
        broker_instance=t.broker_instance("broker_instance"),
        mirror_address=mirror,
        lifetime=_lifetime(t, now),
    )
    if name.casefold() == _AUTO_ROUTE.casefold():
        fixed = (route.remote_service_name, route.broker_instance, route.address)
        if name != _AUTO_ROUTE or fixed != (None, None, "LOCAL") or route.lifetime is not None:
            raise t.error(
                "name",
                f"the route '{_AUTO_ROUTE}' is created by the store as "
                '(remote_service_name unset, broker_instance unset, address "LOCAL", '
                "lifetime unset) and cannot be configured otherwise (R-OBJ-6); "
                "give your route another name, or drop and create it at run time "
                "(brokerctl route drop / route create)",
            )
    return route


def _tcp(t: Table, key: str, value: str) -> str:
    try:
        return normal_tcp_address(value)
    except ValueError as exc:
        what = "LOCAL, TRANSPORT or tcp://host:port" if key == "address" else "tcp://host:port"
        raise t.error(key, f"must be {what}: {exc}") from None


def _lifetime(t: Table, now: datetime) -> datetime | None:
    value = t.data.get("lifetime")
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise t.error(
                "lifetime",
                "a date-time needs a time zone offset (e.g. 2030-01-01T00:00:00Z), "
                "or give a number of seconds",
            )
        return value.astimezone(UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or value <= 0:
            raise t.error("lifetime", f"must be a positive number of seconds, not {value}")
        try:
            return now.astimezone(UTC) + timedelta(seconds=value)
        except OverflowError:
            raise t.error("lifetime", f"{value} seconds is too far in the future") from None
    raise t.error(
        "lifetime",
        "must be a number of seconds or a date-time with a time zone offset, "
        f"not {describe(value)}",
    )
