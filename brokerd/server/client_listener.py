"""The client listener: applications reach the dialog engine through it (SPEC §6).

Binds to loopback by default and requires credentials: on connect it sends a
CHALLENGE nonce, and the first request must be ``login`` with an HMAC proof of
the shared token (``protocol.client_wire``). Anything else before a good login
gets an ``AuthenticationFailed`` error and the connection is closed; before
the login, frame bodies over 4 KiB are refused from the header alone.

Operations (``meta["op"]``): ``login``, ``begin_dialog``, ``send`` (the body is
the message), ``receive`` (message bodies concatenated in the response body,
their lengths in meta), ``end_conversation``, ``begin_conversation_timer``
(R-DLG-11), ``alter_queue``, the routing administration ``create_route``,
``alter_route``, ``drop_route`` (R-OBJ-5, persisted), ``explain`` (why a route is
chosen, SPEC §2) and ``set_mirror_role`` (failover, R-ROUTE-10), ``view``
(``conversation_endpoints``, ``transmission_queue``, ``queues``, ``routes``,
``broker_connections``, ``databases``, ``stats``, ``drops``, ``mirrors``) and
``ping``. Each request runs as its own task, so a RECEIVE waiting for messages does not
hold up the client's other calls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from protocol.client_wire import (
    ClientFrame,
    ClientFrameKind,
    ClientFrameReader,
    check_proof,
    encode_frame,
    new_nonce,
)
from protocol.errors import BrokerError, RemoteProtocolError

if TYPE_CHECKING:
    from brokerd.config import BrokerConfig
    from brokerd.dialogs.engine import DialogEngine
    from brokerd.server.transport import Transport


class Broker(Protocol):
    """What the listener needs of the daemon (``brokerd.server.daemon.Broker``)."""

    config: BrokerConfig
    engine: DialogEngine
    transport: Transport
    instance_name: str
    client_sessions: set[ClientSession]


log = logging.getLogger("brokerd.server.client_listener")

PRE_LOGIN_MAX_BODY = 4096


def load_or_create_token(path: Path) -> bytes:
    """The shared client token; created (mode 0600) on first start."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
    return path.read_text().strip().encode()


def _uuid(meta: dict[str, Any], key: str, required: bool = True) -> uuid.UUID | None:
    value = meta.get(key)
    if value in (None, ""):
        if required:
            raise BrokerError(f"{key} is required")
        return None
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise BrokerError(f"{key} {value!r} is not a UUID") from None


def _str(meta: dict[str, Any], key: str, default: str | None = None) -> str:
    value = meta.get(key, default)
    if not isinstance(value, str):
        raise BrokerError(f"{key} must be a string")
    return value


class ClientSession(asyncio.Protocol):
    def __init__(self, broker: Broker, token: bytes) -> None:
        self.broker = broker
        self.token = token
        # Until the login succeeds a peer may send only small frames.
        self.reader = ClientFrameReader(max_body=PRE_LOGIN_MAX_BODY)
        self.nonce = new_nonce(os.urandom)
        self.user: str | None = None
        self.transport: asyncio.Transport | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.broker.client_sessions.add(self)
        self.transport.write(
            encode_frame(
                ClientFrame(
                    ClientFrameKind.CHALLENGE, 0, {"nonce": self.nonce.hex(), "server": "brokerd"}
                )
            )
        )

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except RemoteProtocolError as exc:
            self._reply_error(0, exc)
            self._close()
            return
        for frame in frames:
            if frame.kind is not ClientFrameKind.REQUEST:
                self._reply_error(frame.request_id, BrokerError("only REQUEST frames are accepted"))
                continue
            if self.user is None:
                self._login(frame)
                continue
            task = asyncio.get_running_loop().create_task(self._run(frame))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def connection_lost(self, exc: Exception | None) -> None:
        self.broker.client_sessions.discard(self)
        for task in list(self.tasks):
            task.cancel()
        self.transport = None

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _login(self, frame: ClientFrame) -> None:
        meta = frame.meta
        user = meta.get("user")
        if (
            meta.get("op") != "login"
            or not isinstance(user, str)
            or not check_proof(self.token, self.nonce, user, meta.get("proof"))
        ):
            from protocol.errors import AuthenticationFailed

            log.warning("client login refused")
            self._reply_error(
                frame.request_id,
                AuthenticationFailed(
                    "credentials refused: log in first with the daemon's client token "
                    "(see [client] token_file in the configuration)"
                ),
            )
            self._close()
            return
        self.user = user
        self.reader.max_body = self.broker.config.limits.max_message_size
        self._reply(frame.request_id, {"user": user, "instance": self.broker.instance_name})

    def _reply(self, request_id: int, meta: dict[str, Any], body: bytes = b"") -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(
                encode_frame(ClientFrame(ClientFrameKind.RESPONSE, request_id, meta, body))
            )

    def _reply_error(self, request_id: int, exc: BaseException) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        retriable = bool(getattr(exc, "retriable", False))
        meta = {"error": type(exc).__name__, "message": str(exc), "retriable": retriable}
        self.transport.write(encode_frame(ClientFrame(ClientFrameKind.ERROR, request_id, meta)))

    async def _run(self, frame: ClientFrame) -> None:
        op = frame.meta.get("op")
        handler = _OPS.get(op) if isinstance(op, str) else None
        try:
            if handler is None:
                raise BrokerError(f"unknown operation {op!r}")
            meta, body = await handler(self.broker, frame)
        except asyncio.CancelledError:
            raise
        except BrokerError as exc:
            self._reply_error(frame.request_id, exc)
            return
        except Exception as exc:
            log.exception("client operation %s failed", op)
            self._reply_error(frame.request_id, exc)
            return
        self._reply(frame.request_id, meta, body)


Handler = Callable[["Broker", ClientFrame], Awaitable[tuple[dict[str, Any], bytes]]]


async def _begin_dialog(broker: Broker, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    m = frame.meta
    lifetime = m.get("lifetime", 0)
    if not isinstance(lifetime, int) or lifetime < 0:
        raise BrokerError("lifetime must be a whole number of seconds >= 0")
    ep = await broker.engine.begin_dialog(
        _str(m, "from_service"),
        _str(m, "to_service"),
        _str(m, "contract", "DEFAULT"),
        database=m.get("database") or None,
        to_broker_instance=_uuid(m, "to_broker_instance", required=False),
        lifetime=lifetime,
        related_conversation=_uuid(m, "related_conversation", required=False),
    )
    return {
        "conversation_handle": str(ep.handle),
        "conversation_id": str(ep.conversation_id),
        "database": ep.database,
    }, b""


async def _send(broker: Broker, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    m = frame.meta
    handle = _uuid(m, "conversation_handle")
    assert handle is not None
    seq = await broker.engine.send(handle, _str(m, "message_type", "DEFAULT"), frame.body)
    return {"sequence_number": seq}, b""


async def _receive(broker: Broker, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    m = frame.meta
    top, timeout = m.get("top", 1), m.get("timeout", 0)
    if not isinstance(top, int) or top < 1:
        raise BrokerError("top must be a whole number >= 1")
    if not isinstance(timeout, int | float):
        raise BrokerError("timeout must be a number of seconds")
    rows = await broker.engine.receive(
        _str(m, "queue"),
        database=m.get("database") or None,
        top=top,
        timeout=float(timeout),
        handle=_uuid(m, "conversation_handle", required=False),
    )
    bodies = []
    messages = []
    for row in rows:
        body = row.pop("message_body")
        bodies.append(body)
        row["body_length"] = len(body)
        messages.append(row)
    return {"messages": messages}, b"".join(bodies)


async def _end(broker: Broker, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    m = frame.meta
    handle = _uuid(m, "conversation_handle")
    assert handle is not None
    code = m.get("error_code")
    if code is not None and not isinstance(code, int):
        raise BrokerError("error_code must be an integer")
    await broker.engine.end_conversation(
        handle,
        error_code=code,
        description=_str(m, "description", ""),
        cleanup=bool(m.get("cleanup", False)),
    )
    return {}, b""


async def _begin_timer(broker: Broker, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    m = frame.meta
    handle = _uuid(m, "conversation_handle")
    assert handle is not None
    timeout = m.get("timeout")
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout < 0:
        raise BrokerError("timeout must be a number of seconds >= 0")
    await broker.engine.begin_conversation_timer(handle, float(timeout))
    return {}, b""


async def _alter_queue(broker: Broker, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    m = frame.meta
    status = m.get("status")
    if not isinstance(status, bool):
        raise BrokerError("status must be true (on) or false (off)")
    await broker.engine.alter_queue(_str(m, "queue"), status, m.get("database") or None)
    return {}, b""


_ROUTE_FIELDS = (
    "name",
    "address",
    "remote_service_name",
    "broker_instance",
    "mirror_address",
    "lifetime",
)


def _route_fields(m: dict[str, Any], only_given: bool) -> dict[str, Any]:
    """The route's fields from a request; with ``only_given``, just those present (ALTER)."""
    fields = m.get("route")
    if not isinstance(fields, dict):
        raise BrokerError("route must be an object with the route's fields")
    unknown = set(fields) - set(_ROUTE_FIELDS)
    if unknown:
        raise BrokerError(f"unknown route field(s): {', '.join(sorted(unknown))}")
    for key, value in fields.items():
        if value is not None and not isinstance(value, str | int | float):
            raise BrokerError(f"route field {key} must be a string or a number")
    return dict(fields) if only_given else {k: fields.get(k) for k in _ROUTE_FIELDS}


async def _create_route(broker: Broker, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    route = await broker.engine.router.create_route(
        _str(frame.meta, "database"), _route_fields(frame.meta, only_given=False)
    )
    return {"name": route.name}, b""


async def _alter_route(broker: Broker, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    m = frame.meta
    route = await broker.engine.router.alter_route(
        _str(m, "database"), _str(m, "name"), _route_fields(m, only_given=True)
    )
    return {"name": route.name}, b""


async def _drop_route(broker: Broker, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    await broker.engine.router.drop_route(_str(frame.meta, "database"), _str(frame.meta, "name"))
    return {}, b""


async def _explain(broker: Broker, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    m = frame.meta
    from_outside = bool(m.get("from_outside", False))
    database = (m.get("database") or "msdb") if from_outside else _str(m, "database")
    result = broker.engine.router.explain(
        database,
        _str(m, "service"),
        _uuid(m, "broker_instance", required=False),
        from_outside,
    )
    return result, b""


async def _set_mirror_role(broker: Broker, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    m = frame.meta
    await broker.engine.router.set_mirror_role(_str(m, "database"), _str(m, "role"))
    return {}, b""


async def _view(broker: Broker, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    name = _str(frame.meta, "name")
    engine = broker.engine
    views: dict[str, Callable[[], Any]] = {
        "conversation_endpoints": engine.conversation_endpoints,
        "transmission_queue": engine.transmission_queue,
        "queues": engine.queues,
        "routes": engine.routes,
        "databases": engine.databases_view,
        "broker_connections": broker.transport.broker_connections,
        "stats": lambda: [
            {
                **{k: v for k, v in asdict(engine.stats).items() if k != "drop_reasons"},
                **engine.router.stats_view(),
                **engine.trace.view(),
            }
        ],
        "mirrors": engine.router.mirrors_view,
        "drops": lambda: [{"reason": r} for r in engine.stats.drop_reasons],
    }
    view = views.get(name)
    if view is None:
        raise BrokerError(f"unknown view {name!r}; views: {', '.join(sorted(views))}")
    return {"rows": view()}, b""


async def _ping(broker: Broker, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    return {"instance": broker.instance_name, "pid": os.getpid()}, b""


_OPS: dict[str, Handler] = {
    "begin_dialog": _begin_dialog,
    "send": _send,
    "receive": _receive,
    "end_conversation": _end,
    "begin_conversation_timer": _begin_timer,
    "alter_queue": _alter_queue,
    "create_route": _create_route,
    "alter_route": _alter_route,
    "drop_route": _drop_route,
    "explain": _explain,
    "set_mirror_role": _set_mirror_role,
    "view": _view,
    "ping": _ping,
}
