"""The daemon's own sections: ``[endpoint]`` (R-OBJ-7), ``[retry]`` (R-DLG-6),
``[client]`` with its ``[[client.token]]``, ``[trace]`` and ``[limits]`` (R-DLG-7)."""

from __future__ import annotations

import math
import re
from dataclasses import fields
from pathlib import Path

from brokerd.config.addresses import (
    is_loopback,
    is_unspecified,
    parse_tcp_address,
    same_host,
)
from brokerd.config.model import (
    ANY_NAME,
    CLIENT_ROLES,
    AdminConfig,
    ClientConfig,
    ClientToken,
    EndpointConfig,
    LimitsConfig,
    RetryConfig,
    TraceConfig,
)
from brokerd.config.tables import Table, defaults
from brokerd.errors import ConfigError
from protocol import client_wire
from protocol.fragments import MIN_FRAGMENT_SIZE
from protocol.frames import MAX_FRAGMENTS_PER_FRAME, MIN_MAX_FRAME_SIZE

_ENCRYPTIONS = ("required", "supported", "disabled")
_FRAME_RESERVE = 8192
"""Room kept in a frame for the dialog header and the protection overhead."""
MAX_PAGE_CACHE_MB = 4096
"""``limits.page_cache_mb`` at most: SQLite's ``cache_size`` is a 32-bit count of KiB,
and a value past it silently becomes no cache at all."""
MAX_BODY_SEGMENT_MB = 1024
"""``limits.body_segment_mb`` at most: a segment's offsets have 40 bits, and one file is
deleted or compacted as a whole."""
MAX_SEND_WINDOW = 1_000_000
"""``limits.send_window`` and ``limits.backlog_send_window`` at most: a window's
messages each hold an entry until acknowledged, and retransmitting a window takes
longer than any retry wait."""
MAX_SEND_WINDOW_MB = 4096
"""``limits.send_window_mb`` at most."""
_MAX_U32 = 2**32 - 1
_DEFAULT_CLIENT_PORT = 4023
_DEFAULT_CLIENT_HOST = "127.0.0.1"
ADMIN_KEYS = ("listen", "names")
_DEFAULT_ADMIN_PORT = AdminConfig().port
_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})?")


def parse_endpoint(t: Table, base: Path) -> EndpointConfig:
    d = defaults(EndpointConfig)
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


def parse_retry(t: Table | None) -> RetryConfig:
    if t is None:
        return RetryConfig()
    d = defaults(RetryConfig)
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


CLIENT_KEYS = (
    "host",
    "port",
    "token_file",
    "login_timeout",
    "tls_certificate",
    "tls_private_key",
    "token",
    "allow_remote",
)


def parse_client(
    file: Path, t: Table | None, endpoint: EndpointConfig, data_dir: Path, base: Path
) -> ClientConfig:
    default_host = endpoint.host if is_loopback(endpoint.host) else _DEFAULT_CLIENT_HOST
    if t is None:
        t = Table(file, "client", {}, CLIENT_KEYS)
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
    if not (is_loopback(host) or host == "localhost") and tls_certificate is None:
        raise t.error(
            "host",
            f"{host!r} is not a loopback address: a client listener reachable from other "
            "hosts must use TLS; set client.tls_certificate and client.tls_private_key "
            "(the instance certificate may be reused if it names this host), or listen on "
            "127.0.0.1 or ::1",
        )
    if _clash(host, port, endpoint.host, endpoint.port):
        raise t.error(
            "port",
            f"{port} is also endpoint.port on the same host; the client listener needs "
            "a port of its own",
        )
    token_file = t.path("token_file", base) or data_dir / "client.token"
    tokens = _client_tokens(t, base, token_file)
    return ClientConfig(
        host=host,
        port=port,
        token_file=token_file,
        login_timeout=t.seconds("login_timeout", defaults(ClientConfig)["login_timeout"]),
        tls_certificate=tls_certificate,
        tls_private_key=tls_private_key,
        tokens=tokens,
    )


def _client_tokens(client: Table, base: Path, admin_file: Path) -> tuple[ClientToken, ...]:
    """The named tokens; each has a file of its own, not the admin token's either
    (R-CLIENT-2: any login name not listed selects the admin token, so a token holding
    its secret could log in as admin)."""
    tokens: list[ClientToken] = []
    names: dict[str, str] = {}
    files: dict[Path, str] = {admin_file.resolve(): "client.token_file (the admin token)"}
    for t in client.tables("token", [f.name for f in fields(ClientToken)]):
        name = t.name()
        if name in names:
            raise t.error("name", f"client token '{name}' is already defined at {names[name]}")
        names[name] = t.where
        path = t.required_path("file", base)
        if path.resolve() in files:
            raise t.error(
                "file", f"{path} is already the file of {files[path.resolve()]}; one token each"
            )
        files[path.resolve()] = t.where
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


def parse_trace(t: Table | None, data_dir: Path, base: Path) -> TraceConfig:
    d = defaults(TraceConfig)
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
        durable=t.flag("durable", d["durable"]),
        compress=t.flag("compress", d["compress"]),
        max_total_mb=t.integer("max_total_mb", d["max_total_mb"], 0),
        max_age_hours=t.integer("max_age_hours", d["max_age_hours"], 0),
    )


def parse_limits(t: Table | None, endpoint: EndpointConfig) -> LimitsConfig:
    d = defaults(LimitsConfig)
    top = endpoint.max_frame_size - _FRAME_RESERVE
    if t is None:
        # An unset fragment size shrinks to fit a small max_frame_size.
        return LimitsConfig(fragment_size=min(d["fragment_size"], top))
    # A received message travels to the application in one client frame.
    max_message_size = t.integer(
        "max_message_size", d["max_message_size"], 1, client_wire.DEFAULT_MAX_BODY
    )
    fragment_size = t.integer("fragment_size", min(d["fragment_size"], top), 1)
    if not MIN_FRAGMENT_SIZE <= fragment_size <= top:
        raise t.error(
            "fragment_size",
            f"must be between {MIN_FRAGMENT_SIZE} and {top} (endpoint.max_frame_size "
            f"{endpoint.max_frame_size} minus {_FRAME_RESERVE} for headers), not {fragment_size}",
        )
    send_window = t.integer("send_window", d["send_window"], 1, MAX_SEND_WINDOW)
    backlog_send_window = t.integer(
        "backlog_send_window", d["backlog_send_window"], 1, MAX_SEND_WINDOW
    )
    if backlog_send_window < send_window:
        raise t.error(
            "backlog_send_window",
            f"({backlog_send_window}) must not be below {t.key('send_window')} ({send_window})",
        )
    return LimitsConfig(
        max_message_size=max_message_size,
        fragment_size=fragment_size,
        held_bodies_mb=t.integer("held_bodies_mb", d["held_bodies_mb"], 0),
        transit_bodies_mb=t.integer("transit_bodies_mb", d["transit_bodies_mb"], 1),
        client_pending_mb=t.integer("client_pending_mb", d["client_pending_mb"], 1),
        mirror_pairs=t.integer("mirror_pairs", d["mirror_pairs"], 1),
        route_requests=t.integer("route_requests", d["route_requests"], 1),
        partial_messages=t.integer("partial_messages", d["partial_messages"], 1),
        page_cache_mb=t.integer("page_cache_mb", d["page_cache_mb"], 1, MAX_PAGE_CACHE_MB),
        body_segment_mb=t.integer("body_segment_mb", d["body_segment_mb"], 1, MAX_BODY_SEGMENT_MB),
        body_compact_after=t.seconds("body_compact_after", d["body_compact_after"]),
        backlog_page=t.integer("backlog_page", d["backlog_page"], 1),
        send_window=send_window,
        backlog_send_window=backlog_send_window,
        send_window_mb=t.integer("send_window_mb", d["send_window_mb"], 1, MAX_SEND_WINDOW_MB),
        send_key_window=t.seconds("send_key_window", d["send_key_window"]),
        closed_endpoint_keep=t.seconds("closed_endpoint_keep", d["closed_endpoint_keep"]),
    )


def parse_admin(
    file: Path, t: Table | None, endpoint: EndpointConfig, client: ClientConfig
) -> AdminConfig:
    """``[admin] listen = "host:port"`` (``[v6]:port``), or ``"off"``. By default the port
    listens on the endpoint's host, port 8022, when that host is a loopback address, and
    is off otherwise: an address reachable from other hosts is opened only when asked.
    Its address, given or by default, is refused when the endpoint or the client
    listener has it too (the daemon could not start)."""
    listen = t.text("listen") if t is not None else None
    if listen is None:
        if is_loopback(endpoint.host) or endpoint.host == "localhost":
            host = endpoint.host
            taken = _taken_by(host, _DEFAULT_ADMIN_PORT, endpoint, client)
            if taken:
                raise ConfigError(
                    file,
                    "admin.listen",
                    f"is unset, so the admin port listens on {host}:{_DEFAULT_ADMIN_PORT}, "
                    f"which is also {taken}'s address; set [admin] listen to an address "
                    'of its own, or "off"',
                )
            return AdminConfig(host, _DEFAULT_ADMIN_PORT)
        return AdminConfig(None)
    assert t is not None
    if listen.lower() == "off":
        return AdminConfig(None)
    names = _admin_names(t)
    try:
        host, port = parse_tcp_address(f"tcp://{listen}")
    except ValueError as exc:
        reason = str(exc).replace(f"'tcp://{listen}'", repr(listen)).replace("tcp://", "")
        raise t.error(
            "listen", f'{reason}; expected host:port (e.g. "127.0.0.1:8022") or "off"'
        ) from None
    taken = _taken_by(host, port, endpoint, client)
    if taken:
        raise t.error(
            "listen",
            f"{listen!r} is also {taken}'s address; the admin port needs a port of its own",
        )
    return AdminConfig(host, port, names)


def _admin_names(t: Table) -> tuple[str, ...]:
    """``[admin] names``: host names a request's ``Host`` may give (R-OPS-1), lower case
    and without a final dot; ``["*"]`` alone: any name."""
    names = t.strings("names")
    if ANY_NAME in names:
        if len(names) > 1:
            raise t.error("names", f'"{ANY_NAME}" (any name) stands alone: drop the other names')
        return (ANY_NAME,)
    kept: list[str] = []
    for i, name in enumerate(names):
        if not _HOST_NAME.fullmatch(name):
            raise t.error(
                f"names[{i}]",
                f"{name!r} is not a host name (letters, digits, '-', '_' and dots; no port)",
            )
        kept.append(name.lower().rstrip("."))
    return tuple(dict.fromkeys(kept))


def _taken_by(host: str, port: int, endpoint: EndpointConfig, client: ClientConfig) -> str:
    """The listener (``endpoint.port``, ``client.port``) that has ``host:port`` too; ""."""
    for key, other_host, other_port in (
        ("endpoint.port", endpoint.host, endpoint.port),
        ("client.port", client.host, client.port),
    ):
        if _clash(host, port, other_host, other_port):
            return key
    return ""


def _clash(host: str, port: int, other_host: str, other_port: int) -> bool:
    """Whether listeners on ``host:port`` and ``other_host:other_port`` need one address."""
    if port != other_port:
        return False
    return is_unspecified(host) or is_unspecified(other_host) or same_host(host, other_host)
