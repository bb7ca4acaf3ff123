"""Reading a whole file: :func:`load_config` (from disk) and :func:`parse_config` (from
TOML text), which check the top level and hand each section to its reader."""

from __future__ import annotations

import tomllib
import uuid
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path

from brokerd.config.databases import _DATABASE_KEYS, _MSDB, _database
from brokerd.config.instance import _CLIENT_KEYS, _client, _endpoint, _limits, _retry, _trace
from brokerd.config.model import (
    BrokerConfig,
    DatabaseConfig,
    EndpointConfig,
    LimitsConfig,
    RetryConfig,
    TraceConfig,
)
from brokerd.config.tables import _Table
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
    base = path.absolute().parent
    top = _Table(
        path, "", data, ("data_dir", "endpoint", "retry", "client", "limits", "trace", "database")
    )
    data_dir = top.path("data_dir", base)
    if data_dir is None:
        raise top.error("data_dir", "is required (the directory for the database files)")

    endpoint_table = top.table("endpoint", [f.name for f in fields(EndpointConfig)], required=True)
    assert endpoint_table is not None
    endpoint = _endpoint(endpoint_table, base)
    retry = _retry(top.table("retry", [f.name for f in fields(RetryConfig)]))
    client = _client(path, top.table("client", _CLIENT_KEYS), endpoint, data_dir, base)
    limits = _limits(top.table("limits", [f.name for f in fields(LimitsConfig)]), endpoint)
    trace = _trace(top.table("trace", [f.name for f in fields(TraceConfig)]), data_dir, base)

    databases: list[DatabaseConfig] = []
    seen: dict[str, str] = {}
    instances: dict[uuid.UUID, str] = {}
    for table in top.tables("database", _DATABASE_KEYS):
        db = _database(table, now, base)
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
        databases.append(db)
    if _MSDB not in seen:
        databases.append(DatabaseConfig(name=_MSDB))

    return BrokerConfig(
        path=path.absolute(),
        data_dir=data_dir,
        endpoint=endpoint,
        retry=retry,
        client=client,
        limits=limits,
        databases=tuple(databases),
        trace=trace,
    )
