"""The TOML configuration of one broker daemon (one instance): ``brokerd run --config FILE``.

This module owns reading and validating that file, and nothing else. It turns the TOML
into frozen dataclasses, resolves relative paths against the file's own directory and
refuses every mistake it can see without touching the disk or the network, raising
:class:`~brokerd.errors.ConfigError` with the file, the dotted key
(``database[0].service[1].queue``) and the problem in plain English. It does not open
certificate files, create databases or bind ports: the daemon and the store do that.

What a file declares (SPEC section 1):

* R-OBJ-1 message types: a name and a validation (``none``, ``empty``,
  ``well_formed_xml``).
* R-OBJ-2 contracts: a name and the message types each role may send (``sent_by`` is
  ``initiator``, ``target`` or ``any``). Every database implicitly has the message type
  ``DEFAULT`` (validation ``none``) and the contract ``DEFAULT`` (``DEFAULT`` sent by
  ``any``); the store creates them, the file may use but not redefine them, and they are
  not listed in :attr:`DatabaseConfig.message_types` / :attr:`DatabaseConfig.contracts`.
* R-OBJ-3 queues: a name, status on/off and the retention flag.
* R-OBJ-4 services: a name (case-sensitive, compared byte-for-byte), the queue and the
  contracts the service accepts as a target.
* R-OBJ-5 routes: ``name``, ``remote_service_name``, ``broker_instance``, ``address``
  (``LOCAL``, ``TRANSPORT`` or ``tcp://host:port``), ``mirror_address`` and ``lifetime``;
  a lifetime given in seconds counts from the moment the file is read and is stored as an
  absolute UTC expiry.
* R-OBJ-6 the route ``AutoCreatedLocal`` belongs to the store, which creates it in every
  database; a file may only restate it exactly as (NULL, NULL, ``LOCAL``, NULL).
* R-OBJ-7 the endpoint: listen address (port 4022), certificate, ``encryption``,
  ``message_forwarding`` and ``message_forward_size`` (MB).

Besides these, the daemon's own settings: retransmission timing (R-DLG-6, ``[retry]``),
the local client listener (``[client]``) and message size limits (R-DLG-7,
``[limits]``). Each database becomes one file, so database names are restricted to
``[A-Za-z0-9_-]+`` and compared without regard to case; ``master`` is refused, and
``msdb`` (the routes for traffic from outside the instance, R-ROUTE-1) is always present.

Name comparisons: message types, contracts and services travel between brokers and are
compared byte-for-byte; queue and route names are local identifiers (SQL identifiers in
Service Broker) and must be unique without regard to case, although references to a
queue must spell it exactly. Enumerated values (``encryption``, ``validation``,
``sent_by``, queue ``status``) are accepted in any case and stored in lower case; route
addresses ``LOCAL`` / ``TRANSPORT`` are stored in upper case.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
import tomllib
import uuid
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, fields
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from brokerd.errors import ConfigError
from protocol import client_wire
from protocol.dialog import BROKER_CONFIGURATION_NOTICE, MISSING_ROUTE
from protocol.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    MAX_FRAGMENTS_PER_FRAME,
    MAX_NAME_BYTES,
    MIN_MAX_FRAME_SIZE,
)

__all__ = [
    "SENT_BY",
    "VALIDATIONS",
    "BrokerConfig",
    "ClientConfig",
    "ClientToken",
    "ContractConfig",
    "ContractMessage",
    "DatabaseConfig",
    "EndpointConfig",
    "LimitsConfig",
    "MessageTypeConfig",
    "QueueConfig",
    "RetryConfig",
    "RouteConfig",
    "ServiceConfig",
    "load_config",
    "parse_config",
    "parse_tcp_address",
]

VALIDATIONS = ("none", "empty", "well_formed_xml")
"""R-OBJ-1 message type validations."""
SENT_BY = ("initiator", "target", "any")
MIRROR_ROLES = ("principal", "mirror")
MIRROR_WHEN_LOST = ("exposed", "stall")
"""R-OBJ-2 roles that may send a message type on a contract."""

_ENCRYPTIONS = ("required", "supported", "disabled")
_DEFAULT = "DEFAULT"
_AUTO_ROUTE = "AutoCreatedLocal"
_MSDB = "msdb"
_DATABASE_NAME = re.compile(r"[A-Za-z0-9_-]+")
_HOST_NAME = re.compile(r"[A-Za-z0-9._-]+")
_FRAME_RESERVE = 8192
"""Room kept in a frame for the dialog header and the protection overhead."""
_MIN_FRAGMENT_SIZE = 1024
_MAX_U32 = 2**32 - 1
_DEFAULT_CLIENT_PORT = 4023
_DEFAULT_CLIENT_HOST = "127.0.0.1"


@dataclass(frozen=True)
class MessageTypeConfig:
    """R-OBJ-1."""

    name: str
    validation: str = "none"


@dataclass(frozen=True)
class ContractMessage:
    """One line of a contract (R-OBJ-2)."""

    message_type: str
    sent_by: str


@dataclass(frozen=True)
class ContractConfig:
    """R-OBJ-2."""

    name: str
    messages: tuple[ContractMessage, ...]


@dataclass(frozen=True)
class QueueConfig:
    """R-OBJ-3; ``status`` True means on."""

    name: str
    status: bool = True
    retention: bool = False


@dataclass(frozen=True)
class ServiceConfig:
    """R-OBJ-4; ``contracts`` are those the service accepts as a target."""

    name: str
    queue: str
    contracts: tuple[str, ...] = ()
    certificate: Path | None = None
    """The service's own certificate (EC P-256, from ``brokerd certs service``), for dialog
    security (R-DLG-14); with ``private_key``."""
    private_key: Path | None = None
    dialog_security: bool = False
    """``dialog_security = "required"``: every dialog this service begins or accepts is
    secured (R-DLG-14), as ENCRYPTION = ON; an unsecured one is refused."""


@dataclass(frozen=True)
class RemoteServiceBindingConfig:
    """The certificate of a service in another database or instance (R-DLG-14), as SQL
    Server's REMOTE SERVICE BINDING: dialogs begun to that service are secured with it, and
    dialogs it begins are checked against it."""

    service: str
    certificate: Path


@dataclass(frozen=True)
class RouteConfig:
    """R-OBJ-5; ``address`` is ``LOCAL``, ``TRANSPORT`` or a normalised ``tcp://host:port``."""

    name: str
    address: str
    remote_service_name: str | None = None
    broker_instance: uuid.UUID | None = None
    mirror_address: str | None = None
    lifetime: datetime | None = None
    """Absolute expiry, timezone-aware UTC; None = never expires."""


@dataclass(frozen=True)
class DatabaseConfig:
    """One database of the instance and its catalog (without the implicit DEFAULTs)."""

    name: str
    broker_instance: uuid.UUID | None = None
    message_types: tuple[MessageTypeConfig, ...] = ()
    contracts: tuple[ContractConfig, ...] = ()
    queues: tuple[QueueConfig, ...] = ()
    services: tuple[ServiceConfig, ...] = ()
    routes: tuple[RouteConfig, ...] = ()
    remote_service_bindings: tuple[RemoteServiceBindingConfig, ...] = ()
    mirror_role: str | None = None
    """``principal`` or ``mirror`` for a mirrored database (R-ROUTE-10); None = not mirrored."""
    mirror_partner: str | None = None
    """``tcp://host:port`` of the other partner: the database's committed units of work are
    shipped between them (R-ROUTE-16). None: the partners share only the identifier."""
    mirror_when_lost: str = "exposed"
    """R-ROUTE-16: with no mirror attached (or one silent for ``mirror_timeout``), the
    principal goes on alone (``exposed``) or holds every commit's outcome until a mirror
    has it (``stall``)."""
    mirror_timeout: float = 10.0
    """Seconds a principal waits for a confirmation before it deems the mirror lost."""


@dataclass(frozen=True)
class EndpointConfig:
    """R-OBJ-7: where the instance listens for other brokers, and how."""

    certificate: Path
    private_key: Path
    ca_certificate: Path
    host: str = "127.0.0.1"
    port: int = 4022
    encryption: str = "required"
    """``required`` | ``supported`` | ``disabled`` (``EncryptionMode[encryption.upper()]``)."""
    message_forwarding: bool = False
    message_forward_size: int = 10
    """MB of forwarded messages held in memory (R-ROUTE-7)."""
    max_hop_count: int = 32
    """A message already forwarded this many times is dropped, not forwarded (R-ROUTE-7)."""
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    idle_timeout: float = 90.0
    heartbeat_interval: float = 5.0
    """An open connection that has sent nothing for this long sends a heartbeat (R-PROTO-5)."""
    heartbeat_deadline: float = 20.0
    """An open connection that has received nothing for this long is closed, and an
    outgoing one dialled again (R-PROTO-5); must exceed ``heartbeat_interval``."""
    handshake_timeout: float = 10.0
    """A connection that has not completed its handshake by then is closed."""
    max_connections: int = 512
    """Incoming broker connections at once; more are closed when they arrive."""
    max_connections_per_address: int = 64
    """Incoming broker connections at once from one IP address."""
    fragments_per_frame: int = MAX_FRAGMENTS_PER_FRAME
    """Fragments one frame to another broker may carry (protocol version 2's FRAGMENTS
    frame: one seal and signature for all); 1 sends each in a frame of its own."""
    inbound_backlog_mb: int = 32
    """MB received from peers and not yet committed above which broker connections stop
    being read until a quarter of it is left (peers wait instead of resending)."""
    max_pending_handshakes: int = 128
    """Incoming connections still in their handshake at once; a new one beyond this (or
    beyond ``max_connections``) closes the oldest of them instead of being refused, so
    unauthenticated connections cannot keep a broker from completing its handshake."""
    connect_timeout: float = 5.0
    reconnect_initial: float = 1.0
    reconnect_max: float = 2.0
    """An unreachable peer is dialled again at most this long after the last attempt, so a
    peer that returns is reached within seconds (a refused attempt costs next to nothing);
    a connection from the peer itself makes the link dial at once."""


@dataclass(frozen=True)
class RetryConfig:
    """Timings in seconds: retransmission (R-DLG-6), acknowledgement delay, DELAYED re-routing."""

    initial: float = 4.0
    maximum: float = 64.0
    ack_delay: float = 0.02
    delayed_retry: float = 5.0
    redial_after: int = 4
    """A message retransmitted this many times on a connection that acknowledged nothing
    meanwhile makes the link close that connection and dial again (R-PROTO-5)."""


CLIENT_ROLES = ("admin", "application")
"""What a client token may do: everything, or the verbs on its own services and queues."""


@dataclass(frozen=True)
class ClientToken:
    """One ``[[client.token]]``: the login name that selects it, its secret's file and
    its role. An ``application`` token may BEGIN DIALOG from, SEND on and END the
    conversations of ``services`` and RECEIVE from ``queues`` (names in any database);
    nothing else. An ``admin`` token may do everything, as the ``token_file`` one."""

    name: str
    file: Path
    role: str
    services: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClientConfig:
    """The listener for the client SDK."""

    host: str
    port: int
    token_file: Path
    """The admin token, selected by any login name that no ``[[client.token]]`` has."""
    login_timeout: float = 10.0
    """A client connection that has not logged in (TLS handshake included) by then is
    closed."""
    tls_certificate: Path | None = None
    """With ``tls_private_key``: the listener speaks TLS (1.2 or later) only. Required when
    ``host`` is not a loopback address."""
    tls_private_key: Path | None = None
    tokens: tuple[ClientToken, ...] = ()

    @property
    def tls(self) -> bool:
        return self.tls_certificate is not None


@dataclass(frozen=True)
class LimitsConfig:
    """Sizes in bytes."""

    max_message_size: int = 100 * 1024 * 1024
    fragment_size: int = 64 * 1024
    held_bodies_mb: int = 64
    """MB of unacknowledged message bodies kept in memory from SEND until acknowledged;
    beyond it a body is read back from the database file whenever it is sent."""
    transit_bodies_mb: int = 16
    """MB of bodies not kept (read back, or beyond ``held_bodies_mb``) in memory at once
    while they wait to be written: a backlog is fed to a connection as it drains."""
    backlog_page: int = 256
    """Unacknowledged messages of one endpoint paged in from the file at once when it has a
    backlog (after a restart, or while its link is down): see ``brokerd.dialogs.backlog``."""
    client_pending_mb: int = 16
    """MB of request bodies one client connection may have awaiting their replies (SENDs
    waiting for their commit); beyond it the broker stops reading that connection until
    replies bring it under half (the application's sends then wait in its own socket)."""


@dataclass(frozen=True)
class TraceConfig:
    """Delivery traces (``[trace]``): append-only JSON Lines segments, see docs/traces.md."""

    enabled: bool = True
    directory: Path | None = None
    """Where segments go; default ``<data_dir>/traces``."""
    segment_mb: int = 64
    """A segment is closed when it reaches this size (MB) ..."""
    segment_seconds: float = 300.0
    """... or this age, whichever comes first."""
    sample: float = 1.0
    """Fraction of conversations traced (chosen by conversation id, so whole conversations)."""
    flush_interval: float = 0.2
    """Buffered events are written at least this often (seconds)."""


@dataclass(frozen=True)
class BrokerConfig:
    """The whole file. ``databases`` always holds one named ``msdb``."""

    path: Path
    data_dir: Path
    endpoint: EndpointConfig
    retry: RetryConfig
    client: ClientConfig
    limits: LimitsConfig
    databases: tuple[DatabaseConfig, ...]
    trace: TraceConfig = TraceConfig()

    def database(self, name: str) -> DatabaseConfig:
        """The database named exactly ``name``; KeyError if there is none."""
        for db in self.databases:
            if db.name == name:
                return db
        raise KeyError(name)


def parse_tcp_address(address: str) -> tuple[str, int]:
    """``tcp://host:port`` -> ``(host, port)``; IPv6 hosts in brackets (``tcp://[::1]:4022``).

    The scheme is case-insensitive; nothing may follow the port but one ``/`` (as the
    Service Broker documentation writes addresses). Raises ValueError with a readable reason.
    """
    if address[:6].lower() != "tcp://":
        raise ValueError(f"'{address}' is not of the form tcp://host:port")
    rest = address[6:]
    if rest.endswith("/"):
        rest = rest[:-1]
    if rest.startswith("["):
        end = rest.find("]")
        if end < 0:
            raise ValueError(f"'{address}': unclosed '[' around an IPv6 address")
        host, after = rest[1:end], rest[end + 1 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"'{address}': '{host}' is not an IPv6 address") from None
        if not after.startswith(":"):
            raise ValueError(f"'{address}' has no port (tcp://host:port)")
        port_text = after[1:]
    else:
        host, sep, port_text = rest.rpartition(":")
        if not sep:
            raise ValueError(f"'{address}' has no port (tcp://host:port)")
        if not host:
            raise ValueError(f"'{address}' has no host (tcp://host:port)")
        if not _HOST_NAME.fullmatch(host):
            raise ValueError(
                f"'{address}': host '{host}' is not a host name or address "
                "(IPv6 addresses go in brackets; no paths or user names)"
            )
    if not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"'{address}': port '{port_text}' is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"'{address}': port {port} is not between 1 and 65535")
    return host, port


def normal_tcp_address(address: str) -> str:
    """The one spelling of an address: ``tcp://host:port`` (``tcp://[v6]:port``); ValueError."""
    host, port = parse_tcp_address(address)
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


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


# --------------------------------------------------------------------------- reading tables


def _describe(value: object) -> str:
    """A TOML-flavoured description of a value for error messages."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the float {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime):
        return "a local date-time" if value.tzinfo is None else "a date-time"
    if isinstance(value, date):
        return "a date"
    if isinstance(value, time):
        return "a time"
    return type(value).__name__


def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


class _Table:
    """One TOML table being read: knows its dotted key and refuses unknown keys at once."""

    def __init__(
        self, file: Path, where: str, data: dict[str, Any], allowed: Iterable[str]
    ) -> None:
        self.file = file
        self.where = where
        self.data = data
        allowed = tuple(allowed)
        for key in data:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ConfigError(
                    file,
                    self.key(key),
                    f"unknown key '{key}'{hint}; allowed keys here: {', '.join(sorted(allowed))}",
                )

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def error(self, name: str, problem: str) -> ConfigError:
        return ConfigError(self.file, self.key(name), problem)

    def _typed(self, name: str, kinds: tuple[type, ...], what: str) -> Any:
        """The value, None if absent; refuses another type (a boolean is never a number)."""
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise self.error(name, f"must be {what}, not {_describe(value)}")
        return value

    def text(self, name: str) -> str | None:
        value: str | None = self._typed(name, (str,), "a string")
        if value is not None and not value:
            raise self.error(name, "must not be empty")
        return value

    def required_text(self, name: str) -> str:
        value = self.text(name)
        if value is None:
            raise self.error(name, "is required")
        return value

    def name(self, name: str = "name") -> str:
        value = self.required_text(name)
        size = len(value.encode("utf-8"))
        if size > MAX_NAME_BYTES:
            raise self.error(
                name, f"is {size} bytes long in UTF-8; at most {MAX_NAME_BYTES} are allowed"
            )
        return value

    def optional_name(self, name: str) -> str | None:
        return self.name(name) if name in self.data else None

    def integer(self, name: str, default: int, low: int, high: int | None = None) -> int:
        value: int | None = self._typed(name, (int,), "an integer")
        if value is None:
            return default
        if value < low or (high is not None and value > high):
            bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise self.error(name, f"must be {bounds}, not {value}")
        return value

    def seconds(self, name: str, default: float) -> float:
        value: float | None = self._typed(name, (int, float), "a number of seconds")
        if value is None:
            return default
        if not math.isfinite(value) or value <= 0:
            raise self.error(name, f"must be a positive number of seconds, not {value}")
        return float(value)

    def flag(self, name: str, default: bool) -> bool:
        value: bool | None = self._typed(name, (bool,), "true or false")
        return default if value is None else value

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.text(name)
        if value is None:
            return default
        if value.lower() not in choices:
            raise self.error(name, f"must be one of {', '.join(choices)}, not {value!r}")
        return value.lower()

    def path(self, name: str, base: Path) -> Path | None:
        value = self.text(name)
        if value is None:
            return None
        if "\x00" in value:
            raise self.error(name, "must not contain a NUL character")
        path = Path(value).expanduser()
        return path if path.is_absolute() else base / path

    def required_path(self, name: str, base: Path) -> Path:
        value = self.path(name, base)
        if value is None:
            raise self.error(name, "is required (a file path)")
        return value

    def broker_instance(self, name: str) -> uuid.UUID | None:
        value = self.text(name)
        if value is None:
            return None
        try:
            return uuid.UUID(value)
        except ValueError:
            raise self.error(name, f"{value!r} is not a UUID") from None

    def strings(self, name: str) -> list[str]:
        value: list[Any] | None = self._typed(name, (list,), "an array of strings")
        if value is None:
            return []
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise self.error(
                    f"{name}[{i}]", f"must be a non-empty string, not {_describe(item)}"
                )
        return value

    def table(self, name: str, allowed: Iterable[str], required: bool = False) -> _Table | None:
        value = self.data.get(name)
        if value is None:
            if required:
                raise self.error(name, f"is required (a [{self.key(name)}] table)")
            return None
        if not isinstance(value, dict):
            raise self.error(name, f"must be a table ([{self.key(name)}]), not {_describe(value)}")
        return _Table(self.file, self.key(name), value, allowed)

    def tables(self, name: str, allowed: Iterable[str]) -> list[_Table]:
        """An array of tables (``[[name]]`` or an array of inline tables)."""
        value = self.data.get(name)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(
                name, f"must be an array of tables ([[{self.key(name)}]]), not {_describe(value)}"
            )
        result = []
        for i, item in enumerate(value):
            where = f"{self.key(name)}[{i}]"
            if not isinstance(item, dict):
                raise ConfigError(self.file, where, f"must be a table, not {_describe(item)}")
            result.append(_Table(self.file, where, item, allowed))
        return result


# --------------------------------------------------------------------------- instance sections


def _endpoint(t: _Table, base: Path) -> EndpointConfig:
    d = _defaults(EndpointConfig)
    host = t.text("host") or d["host"]
    if any(ch.isspace() for ch in host):
        raise t.error("host", f"{host!r} is not a host name or address")
    max_frame_size = t.integer("max_frame_size", d["max_frame_size"], MIN_MAX_FRAME_SIZE, _MAX_U32)
    endpoint = EndpointConfig(
        certificate=t.required_path("certificate", base),
        private_key=t.required_path("private_key", base),
        ca_certificate=t.required_path("ca_certificate", base),
        host=host,
        port=t.integer("port", d["port"], 1, 65535),
        encryption=t.choice("encryption", d["encryption"], _ENCRYPTIONS),
        message_forwarding=t.flag("message_forwarding", d["message_forwarding"]),
        message_forward_size=t.integer("message_forward_size", d["message_forward_size"], 0),
        max_hop_count=t.integer("max_hop_count", d["max_hop_count"], 1, 255),
        max_frame_size=max_frame_size,
        idle_timeout=t.seconds("idle_timeout", d["idle_timeout"]),
        heartbeat_interval=t.seconds("heartbeat_interval", d["heartbeat_interval"]),
        heartbeat_deadline=t.seconds("heartbeat_deadline", d["heartbeat_deadline"]),
        handshake_timeout=t.seconds("handshake_timeout", d["handshake_timeout"]),
        max_connections=t.integer("max_connections", d["max_connections"], 1),
        max_connections_per_address=t.integer(
            "max_connections_per_address", d["max_connections_per_address"], 1
        ),
        max_pending_handshakes=t.integer("max_pending_handshakes", d["max_pending_handshakes"], 1),
        fragments_per_frame=t.integer(
            "fragments_per_frame", d["fragments_per_frame"], 1, MAX_FRAGMENTS_PER_FRAME
        ),
        inbound_backlog_mb=t.integer("inbound_backlog_mb", d["inbound_backlog_mb"], 1),
        connect_timeout=t.seconds("connect_timeout", d["connect_timeout"]),
        reconnect_initial=t.seconds("reconnect_initial", d["reconnect_initial"]),
        reconnect_max=t.seconds("reconnect_max", d["reconnect_max"]),
    )
    if endpoint.heartbeat_deadline <= endpoint.heartbeat_interval:
        raise t.error(
            "heartbeat_deadline",
            f"({endpoint.heartbeat_deadline}) must exceed "
            f"{t.key('heartbeat_interval')} ({endpoint.heartbeat_interval})",
        )
    if endpoint.reconnect_initial > endpoint.reconnect_max:
        raise t.error(
            "reconnect_initial",
            f"({endpoint.reconnect_initial}) must not exceed "
            f"{t.key('reconnect_max')} ({endpoint.reconnect_max})",
        )
    return endpoint


def _retry(t: _Table | None) -> RetryConfig:
    if t is None:
        return RetryConfig()
    d = _defaults(RetryConfig)
    retry = RetryConfig(
        initial=t.seconds("initial", d["initial"]),
        maximum=t.seconds("maximum", d["maximum"]),
        ack_delay=t.seconds("ack_delay", d["ack_delay"]),
        delayed_retry=t.seconds("delayed_retry", d["delayed_retry"]),
        redial_after=t.integer("redial_after", d["redial_after"], 1, 1000),
    )
    if retry.initial > retry.maximum:
        raise t.error(
            "initial", f"({retry.initial}) must not exceed {t.key('maximum')} ({retry.maximum})"
        )
    return retry


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


_CLIENT_KEYS = (
    "host",
    "port",
    "token_file",
    "login_timeout",
    "tls_certificate",
    "tls_private_key",
    "token",
    "allow_remote",
)


def _client(
    file: Path, t: _Table | None, endpoint: EndpointConfig, data_dir: Path, base: Path
) -> ClientConfig:
    default_host = endpoint.host if _is_loopback(endpoint.host) else _DEFAULT_CLIENT_HOST
    if t is None:
        t = _Table(file, "client", {}, _CLIENT_KEYS)
    if "allow_remote" in t.data:
        raise t.error(
            "allow_remote",
            "is no longer accepted: a client listener on an address that is not loopback "
            "needs TLS instead (set client.tls_certificate and client.tls_private_key)",
        )
    host = t.text("host") or default_host
    port = t.integer("port", _DEFAULT_CLIENT_PORT, 1, 65535)
    tls_certificate = t.path("tls_certificate", base)
    tls_private_key = t.path("tls_private_key", base)
    if (tls_certificate is None) != (tls_private_key is None):
        given, missing = (
            ("tls_certificate", "tls_private_key")
            if tls_private_key is None
            else ("tls_private_key", "tls_certificate")
        )
        raise t.error(missing, f"is required with {t.key(given)} (TLS needs both)")
    if not (_is_loopback(host) or host == "localhost") and tls_certificate is None:
        raise t.error(
            "host",
            f"{host!r} is not a loopback address: a client listener reachable from other "
            "hosts must use TLS; set client.tls_certificate and client.tls_private_key "
            "(the instance certificate may be reused if it names this host), or listen on "
            "127.0.0.1 or ::1",
        )
    if port == endpoint.port and (
        host == endpoint.host or _is_unspecified(endpoint.host) or _is_unspecified(host)
    ):
        raise t.error(
            "port",
            f"{port} is also endpoint.port on the same host; the client listener needs "
            "a port of its own",
        )
    return ClientConfig(
        host=host,
        port=port,
        token_file=t.path("token_file", base) or data_dir / "client.token",
        login_timeout=t.seconds("login_timeout", _defaults(ClientConfig)["login_timeout"]),
        tls_certificate=tls_certificate,
        tls_private_key=tls_private_key,
        tokens=_client_tokens(t, base),
    )


def _client_tokens(client: _Table, base: Path) -> tuple[ClientToken, ...]:
    tokens: list[ClientToken] = []
    names: dict[str, str] = {}
    files: dict[Path, str] = {}
    for t in client.tables("token", [f.name for f in fields(ClientToken)]):
        name = t.name()
        if name in names:
            raise t.error("name", f"client token '{name}' is already defined at {names[name]}")
        names[name] = t.where
        path = t.required_path("file", base)
        if path in files:
            raise t.error("file", f"{path} is already the file of {files[path]}; one token each")
        files[path] = t.where
        if "role" not in t.data:
            raise t.error("role", f"is required (one of {', '.join(CLIENT_ROLES)})")
        role = t.choice("role", "", CLIENT_ROLES)
        services, queues = tuple(t.strings("services")), tuple(t.strings("queues"))
        if role == "admin" and (services or queues):
            raise t.error(
                "services" if services else "queues",
                "an admin token may do everything; services and queues are for "
                'role = "application"',
            )
        if role == "application" and not (services or queues):
            raise t.error(
                "services",
                "an application token needs the services it may use and/or the queues it "
                "may RECEIVE from",
            )
        tokens.append(ClientToken(name, path, role, services, queues))
    return tuple(tokens)


def _trace(t: _Table | None, data_dir: Path, base: Path) -> TraceConfig:
    d = _defaults(TraceConfig)
    if t is None:
        return TraceConfig(directory=data_dir / "traces")
    sample = t._typed("sample", (int, float), "a fraction between 0 and 1")
    if sample is None:
        sample = d["sample"]
    if not (math.isfinite(sample) and 0 < sample <= 1):
        raise t.error("sample", f"must be more than 0 and at most 1, not {sample}")
    return TraceConfig(
        enabled=t.flag("enabled", d["enabled"]),
        directory=t.path("directory", base) or data_dir / "traces",
        segment_mb=t.integer("segment_mb", d["segment_mb"], 1, 4096),
        segment_seconds=t.seconds("segment_seconds", d["segment_seconds"]),
        sample=float(sample),
        flush_interval=t.seconds("flush_interval", d["flush_interval"]),
    )


def _limits(t: _Table | None, endpoint: EndpointConfig) -> LimitsConfig:
    d = _defaults(LimitsConfig)
    top = endpoint.max_frame_size - _FRAME_RESERVE
    if t is None:
        # An unset fragment size shrinks to fit a small max_frame_size.
        return LimitsConfig(fragment_size=min(d["fragment_size"], top))
    # A received message travels to the application in one client frame.
    max_message_size = t.integer(
        "max_message_size", d["max_message_size"], 1, client_wire.DEFAULT_MAX_BODY
    )
    fragment_size = t.integer("fragment_size", min(d["fragment_size"], top), 1)
    if not _MIN_FRAGMENT_SIZE <= fragment_size <= top:
        raise t.error(
            "fragment_size",
            f"must be between {_MIN_FRAGMENT_SIZE} and {top} (endpoint.max_frame_size "
            f"{endpoint.max_frame_size} minus {_FRAME_RESERVE} for headers), not {fragment_size}",
        )
    return LimitsConfig(
        max_message_size=max_message_size,
        fragment_size=fragment_size,
        held_bodies_mb=t.integer("held_bodies_mb", d["held_bodies_mb"], 0),
        transit_bodies_mb=t.integer("transit_bodies_mb", d["transit_bodies_mb"], 1),
        client_pending_mb=t.integer("client_pending_mb", d["client_pending_mb"], 1),
        backlog_page=t.integer("backlog_page", d["backlog_page"], 1),
    )


# --------------------------------------------------------------------------- databases

_DATABASE_KEYS = (
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


class _Unique:
    """Names of one kind in one database, each remembered with the key that defined it."""

    def __init__(self, kind: str, database: str, fold: bool) -> None:
        self.kind = kind
        self.database = database
        self.fold = fold
        self.seen: dict[str, str] = {}

    def add(self, t: _Table, name: str) -> None:
        key = name.casefold() if self.fold else name
        if key in self.seen:
            how = " (compared without regard to case)" if self.fold else ""
            raise t.error(
                "name",
                f"{self.kind} '{name}' is already defined in database '{self.database}' "
                f"at {self.seen[key]}{how}",
            )
        self.seen[key] = t.where


def _database(t: _Table, now: datetime, base: Path) -> DatabaseConfig:
    name = t.name()
    if not _DATABASE_NAME.fullmatch(name):
        raise t.error(
            "name",
            f"database name {name!r} may contain only letters, digits, '_' and '-' "
            "(it becomes a file name)",
        )
    if name.casefold() == "master":
        raise t.error("name", "'master' is reserved and cannot be configured")
    if name.casefold() == _MSDB and name != _MSDB:
        raise t.error("name", f"write the msdb database's name as '{_MSDB}', not {name!r}")
    broker_instance = t.broker_instance("broker_instance")

    message_types: list[MessageTypeConfig] = []
    names = _Unique("message type", name, fold=False)
    for mt in t.tables("message_type", ("name", "validation")):
        mt_name = mt.name()
        if mt_name == _DEFAULT:
            raise mt.error("name", "the message type 'DEFAULT' is built in and cannot be redefined")
        names.add(mt, mt_name)
        validation = mt.choice("validation", "none", VALIDATIONS)
        message_types.append(MessageTypeConfig(mt_name, validation))
    known_types = {*names.seen, _DEFAULT, MISSING_ROUTE}

    contracts: list[ContractConfig] = []
    names = _Unique("contract", name, fold=False)
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
                    + _near(message_type, known_types),
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
    names = _Unique("queue", name, fold=True)
    for qt in t.tables("queue", ("name", "status", "retention")):
        q_name = qt.name()
        names.add(qt, q_name)
        queues.append(QueueConfig(q_name, _queue_status(qt), qt.flag("retention", False)))
    known_queues = {q.name for q in queues}

    services: list[ServiceConfig] = []
    names = _Unique("service", name, fold=False)
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
                f"queue '{queue}' is not defined in database '{name}'" + _near(queue, known_queues),
            )
        accepted = st.strings("contracts")
        for i, contract in enumerate(accepted):
            if contract not in known_contracts:
                raise st.error(
                    f"contracts[{i}]",
                    f"contract '{contract}' is not defined in database '{name}'"
                    + _near(contract, known_contracts),
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
    names = _Unique("route", name, fold=True)
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
    if mirror_role is not None and name == _MSDB:
        raise t.error("mirror_role", "msdb cannot be mirrored")
    partner = t.text("mirror_partner")
    if partner is not None:
        if mirror_role is None:
            raise t.error("mirror_partner", "is only allowed with mirror_role")
        partner = _tcp(t, "mirror_partner", partner)
    when_lost = t.choice("mirror_when_lost", "exposed", MIRROR_WHEN_LOST)
    mirror_timeout = t.seconds("mirror_timeout", 10.0)

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


def _near(name: str, known: set[str]) -> str:
    """A hint for a reference that does not resolve: same name in another case, or a typo."""
    for candidate in sorted(known):
        if candidate.casefold() == name.casefold():
            return f" (names are case-sensitive: did you mean '{candidate}'?)"
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _queue_status(t: _Table) -> bool:
    value = t.data.get("status")
    if value is None:
        return True
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("on", "off"):
        return value.lower() == "on"
    raise t.error("status", f'must be "on", "off", true or false, not {_describe(value)}')


def parse_route(data: dict[str, Any], now: datetime) -> RouteConfig:
    """One route given at run time (``brokerctl route create``), checked as in a file.

    ``data`` has the keys of a ``[[database.route]]`` table; ``lifetime`` in seconds
    counts from ``now``. Raises :class:`ConfigError` whose ``key`` names the bad field.
    """
    return _route(_Table(Path("route"), "", data, [f.name for f in fields(RouteConfig)]), now)


def _route(t: _Table, now: datetime) -> RouteConfig:
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
                "give your route another name",
            )
    return route


def _tcp(t: _Table, key: str, value: str) -> str:
    try:
        return normal_tcp_address(value)
    except ValueError as exc:
        what = "LOCAL, TRANSPORT or tcp://host:port" if key == "address" else "tcp://host:port"
        raise t.error(key, f"must be {what}: {exc}") from None


def _lifetime(t: _Table, now: datetime) -> datetime | None:
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
        f"not {_describe(value)}",
    )
