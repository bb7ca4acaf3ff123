"""Reading a whole file: :func:`load_config` (from disk) and :func:`parse_config` (from
TOML text), which check the top level and hand each section to its reader."""

from __future__ import annotations

import tomllib
import uuid
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path

from brokerd.config.addresses import is_loopback, is_unspecified, parse_tcp_address, same_host
from brokerd.config.databases import DATABASE_KEYS, MSDB, parse_database
from brokerd.config.instance import (
    ADMIN_KEYS,
    CLIENT_KEYS,
    parse_admin,
    parse_client,
    parse_endpoint,
    parse_limits,
    parse_retry,
    parse_trace,
)
from brokerd.config.model import (
    BrokerConfig,
    ClientConfig,
    DatabaseConfig,
    EndpointConfig,
    LimitsConfig,
    RetryConfig,
    TraceConfig,
)
from brokerd.config.tables import Table, near
from brokerd.errors import ConfigError


def load_config(path: str | Path) -> BrokerConfig:
    """Read and validate the configuration file at ``path``."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read the file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(path, "", f"the file is not UTF-8: {exc}") from None
    return parse_config(text, path)


def parse_config(text: str, path: Path, now: datetime | None = None) -> BrokerConfig:
    """Validate TOML ``text``; ``path`` names the file in errors and anchors relative paths.

    ``now`` (default: the current UTC time; a naive value is taken as UTC) is the moment
    from which route lifetimes given in seconds count.
    """
    path = Path(path)
    if now is None:
        now = datetime.now(UTC)
    elif now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "", f"invalid TOML: {exc}") from None
    except RecursionError:  # arrays or tables nested thousands deep
        raise ConfigError(path, "", "invalid TOML: nested too deeply") from None
    base = path.absolute().parent
    top = Table(
        path,
        "",
        data,
        (
            "data_dir",
            "endpoint",
            "retry",
            "client",
            "admin",
            "limits",
            "trace",
            "database",
        ),
    )
    data_dir = top.path("data_dir", base)
    if data_dir is None:
        raise top.error("data_dir", "is required (the directory for the database files)")

    endpoint_table = top.table("endpoint", [f.name for f in fields(EndpointConfig)], required=True)
    assert endpoint_table is not None
    endpoint = parse_endpoint(endpoint_table, base)
    retry = parse_retry(top.table("retry", [f.name for f in fields(RetryConfig)]))
    client = parse_client(path, top.table("client", CLIENT_KEYS), endpoint, data_dir, base)
    admin = parse_admin(path, top.table("admin", ADMIN_KEYS), endpoint, client)
    limits = parse_limits(top.table("limits", [f.name for f in fields(LimitsConfig)]), endpoint)
    trace = parse_trace(top.table("trace", [f.name for f in fields(TraceConfig)]), data_dir, base)

    databases: list[DatabaseConfig] = []
    seen: dict[str, str] = {}
    instances: dict[uuid.UUID, str] = {}
    for table in top.tables("database", DATABASE_KEYS):
        db = parse_database(table, now, base)
        folded = db.name.casefold()
        if folded in seen:
            raise table.error(
                "name",
                f"database '{db.name}' is already defined at {seen[folded]} "
                "(database names become file names and are compared without regard to case)",
            )
        seen[folded] = table.where
        if db.broker_instance is not None:
            if db.broker_instance in instances:
                raise table.error(
                    "broker_instance",
                    f"broker instance {db.broker_instance} is already used by "
                    f"{instances[db.broker_instance]}; each database has its own",
                )
            instances[db.broker_instance] = table.where
        _check_activation_users(table, db, client)
        _check_partner(table, db, endpoint)
        databases.append(db)
    if MSDB not in seen:
        databases.append(DatabaseConfig(name=MSDB))

    return BrokerConfig(
        path=path.absolute(),
        data_dir=data_dir,
        endpoint=endpoint,
        retry=retry,
        client=client,
        limits=limits,
        databases=tuple(databases),
        trace=trace,
        admin=admin,
    )


def _check_partner(table: Table, db: DatabaseConfig, endpoint: EndpointConfig) -> None:
    """A database's ``mirror_partner`` is the other instance of the pair, not this one's
    own endpoint (a file copied from the partner's and only half edited): the principal
    would wait for a mirror that never attaches (R-ROUTE-16)."""
    if db.mirror_partner is None:
        return
    host, port = parse_tcp_address(db.mirror_partner)
    everywhere = is_unspecified(endpoint.host) and (is_loopback(host) or host == "localhost")
    if port == endpoint.port and (everywhere or same_host(host, endpoint.host)):
        raise table.error(
            "mirror_partner",
            f"{db.mirror_partner} is this instance's own endpoint (endpoint.host "
            f"{endpoint.host!r}, endpoint.port {endpoint.port}); the partner is the other "
            "instance of the mirrored pair",
        )


def _check_activation_users(table: Table, db: DatabaseConfig, client: ClientConfig) -> None:
    """An activated command's ``user`` names a ``[[client.token]]`` that may RECEIVE from
    its queue."""
    tokens = {token.name: token for token in client.tokens}
    for i, queue in enumerate(db.queues):
        activation = queue.activation
        if activation is None or activation.user is None:
            continue
        key = f"queue[{i}].activation.user"
        token = tokens.get(activation.user)
        if token is None:
            raise table.error(
                key,
                f"no [[client.token]] is named {activation.user!r}"
                + near(activation.user, set(tokens)),
            )
        if token.role != "admin" and queue.name not in token.queues:
            raise table.error(
                key,
                f"token {token.name!r} may not RECEIVE from queue {queue.name!r}: "
                "add it to the token's queues",
            )
