"""A small HTTP/1.1 server on ``asyncio`` streams, parsed by ``h11`` (sans-I/O).

Only ``GET`` (and ``HEAD``) is served; any other method is 405, an unknown path 404.
A request's head is bounded (:data:`MAX_REQUEST_HEAD`), a request with a body is
refused (413), a request whose head has not all come within :data:`IDLE_TIMEOUT`
seconds, or an answer the client has not taken within it, is not waited for (the
connection is closed, what it left unread dropped), and at most
:data:`MAX_CONNECTIONS` are served at once: a new connection beyond them closes the
oldest one waiting for its client (for a request, or to take an answer), so that idle,
trickling or never-reading connections never keep the health checks out. Keep-alive
is honoured.

The port answers only requests that name it by an IP address, ``localhost``, the name
it listens on, this machine's host name or a name of ``[admin] names``, or that name
none (421 otherwise; :func:`names_answered`): a web page whose own name is made to
resolve to the port's address (DNS rebinding: 127.0.0.1, or an address of the
operator's network) would otherwise read every page of the port from an operator's
browser. ``names = ["*"]`` answers any name (behind a proxy that checks it, say).

May import: ``h11``, ``brokerd.config.addresses`` and the standard library.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

import h11

from brokerd.config.addresses import is_ip_address

log = logging.getLogger("brokerd.admin_http")

MAX_REQUEST_HEAD = 16 * 1024
"""Bytes of a request line and headers at most."""
IDLE_TIMEOUT = 30.0
"""Seconds a request's head may take to come (from the end of the previous request), and
an answer to be taken by the client."""
MAX_CONNECTIONS = 64
"""Connections served at once; a new one beyond them takes the place of the oldest one
waiting for a request, or is closed when every one is being answered."""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


def text(status: int, message: str) -> Response:
    return Response(status, (message + "\n").encode())


Handler = Callable[[Mapping[str, str]], Awaitable[Response]]
"""A route: given the query's parameters, the response."""


class HttpServer:
    """Serves ``routes`` (path -> :data:`Handler`) on ``host``:``port``."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: Mapping[str, Handler],
        names: frozenset[str] | None,
    ) -> None:
        self.host = host
        self.port = port
        self.routes = dict(routes)
        self.names = names
        """The names a request's ``Host`` may give besides an IP address; None: any
        (:func:`names_answered`)."""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiting: dict[asyncio.Task[None], None] = {}
        """The connections waiting for their client (a request's head, or room for an
        answer), oldest first."""

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, reuse_address=True
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None and len(self._tasks) >= MAX_CONNECTIONS and self._waiting:
            oldest = next(iter(self._waiting))
            del self._waiting[oldest]
            oldest.cancel()  # it has sent no whole request: a newer connection goes first
            self._tasks.discard(oldest)
        if task is None or len(self._tasks) >= MAX_CONNECTIONS:
            writer.close()
            return
        self._tasks.add(task)
        cut = False
        try:
            await self._connection(reader, writer)
        except (ConnectionError, h11.ProtocolError):
            pass  # the client went or spoke no HTTP
        except (TimeoutError, asyncio.CancelledError):
            # the client was too slow to ask or to take an answer, a newer connection
            # took its place, or the port stops (a cancel ends this task)
            cut = True
        finally:
            self._tasks.discard(task)
            self._waiting.pop(task, None)
            await _close(writer, cut)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD)
        while True:
            request = await self._next_request(conn, reader, writer)
            if request is None:
                return
            response = await self._respond(request)
            keep = response.status != 413  # a refused body is left unread: no reuse
            if keep:
                keep = isinstance(conn.next_event(), h11.EndOfMessage)
            _write(conn, writer, response, head_only=request.method == b"HEAD", close=not keep)
            await self._drain(writer)
            if not keep or conn.our_state is not h11.DONE:
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        """Wait until the client has taken enough of the answers written: a wait for the
        client, like one for a request, so a newer connection may take its place, and
        :data:`IDLE_TIMEOUT` at most (TimeoutError)."""
        task = asyncio.current_task()
        if task is not None:
            self._waiting[task] = None
        try:
            async with asyncio.timeout(IDLE_TIMEOUT):
                await writer.drain()
        finally:
            if task is not None:
                self._waiting.pop(task, None)

    async def _next_request(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> h11.Request | None:
        """The next request's head; None when the client is gone or spoke no HTTP (then it
        was told why, with the status h11 suggests), or took :data:`IDLE_TIMEOUT` to send it
        (TimeoutError)."""
        task = asyncio.current_task()
        if task is not None:
            self._waiting[task] = None
        try:
            async with asyncio.timeout(IDLE_TIMEOUT):
                return await self._read_head(conn, reader, writer)
        finally:
            if task is not None:
                self._waiting.pop(task, None)

    async def _read_head(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> h11.Request | None:
        size = len(conn.trailing_data[0])  # what came with the previous request
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    bad = text(exc.error_status_hint, f"bad request: {exc}")
                    with contextlib.suppress(h11.LocalProtocolError):
                        _write(conn, writer, bad, head_only=False, close=True)
                        await writer.drain()
                return None
            if event is h11.NEED_DATA:
                data = await reader.read(8192)
                size += len(data)
                conn.receive_data(data)  # b"" marks the end of the stream
                continue
            if not isinstance(event, h11.Request):
                return None
            if size - len(conn.trailing_data[0]) > MAX_REQUEST_HEAD:
                # h11 bounds a head only while it is incomplete: one that came whole in
                # a read or two is measured here
                too_big = text(431, f"request head over {MAX_REQUEST_HEAD} bytes")
                with contextlib.suppress(h11.LocalProtocolError):
                    _write(conn, writer, too_big, head_only=False, close=True)
                    await writer.drain()
                return None
            return event

    async def _respond(self, request: h11.Request) -> Response:
        if self.names is not None:
            host = _host_of(request)
            if host and not (is_ip_address(host) or host in self.names):  # none: HTTP/1.0
                return text(
                    421,
                    f"this admin port answers to {', '.join(sorted(self.names))} or an IP "
                    f"address, not {host!r}",
                )
        if _has_body(request):
            return text(413, "requests to the admin port carry no body")
        if request.method not in (b"GET", b"HEAD"):
            return text(405, f"method {request.method.decode('latin-1')} not allowed: GET only")
        target = urlsplit(request.target.decode("latin-1"))
        handler = self.routes.get(target.path)
        if handler is None:
            return text(404, f"no page {target.path!r}; pages: {', '.join(sorted(self.routes))}")
        query = dict(parse_qsl(target.query))
        try:
            return await handler(query)
        except Exception:  # a page that fails must not take the port down
            log.exception("admin port: %s failed", target.path)
            return text(500, "internal error (see the daemon's log)")


def names_answered(host: str, configured: Iterable[str]) -> frozenset[str]:
    """The names a port listening on ``host`` answers to besides IP addresses (R-OPS-1):
    ``localhost``, ``host`` itself, this machine's host name (and its first label) and
    the ``configured`` ones (``[admin] names``). A rebinding page cannot make a browser
    name any of these: the ``Host`` it sends is the page's own name."""
    machine = socket.gethostname().lower().rstrip(".")
    return frozenset(
        {"localhost", host.lower(), machine, machine.split(".", 1)[0], *configured} - {""}
    )


def _host_of(request: h11.Request) -> str:
    """The host a request names (its ``Host`` header, the port left out), lower case."""
    value = next((v for k, v in request.headers if k == b"host"), b"").decode("latin-1")
    value = value.strip().lower()
    if value.startswith("["):  # [v6]:port
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


async def _close(writer: asyncio.StreamWriter, cut: bool) -> None:
    """Close a connection: once what was written has left, waited for :data:`IDLE_TIMEOUT`
    at most; at once, dropping it, when the connection was ``cut`` (the client did not take
    it in time, or another connection took its place)."""
    transport = writer.transport
    if cut and transport.get_write_buffer_size():
        transport.abort()
        return
    writer.close()
    try:
        async with asyncio.timeout(IDLE_TIMEOUT):
            await writer.wait_closed()
    except asyncio.CancelledError:
        transport.abort()
        raise
    except Exception:  # the client went, or never took the rest (TimeoutError)
        transport.abort()


def _write(
    conn: h11.Connection,
    writer: asyncio.StreamWriter,
    response: Response,
    *,
    head_only: bool,
    close: bool,
) -> None:
    headers = [
        ("content-type", response.content_type),
        ("content-length", str(len(response.body))),
        ("cache-control", "no-store"),
        ("x-content-type-options", "nosniff"),
    ]
    if response.status == 405:
        headers.append(("allow", "GET, HEAD"))
    if close:
        headers.append(("connection", "close"))
    writer.write(conn.send(h11.Response(status_code=response.status, headers=headers)))
    if not head_only:
        writer.write(conn.send(h11.Data(data=response.body)))
    writer.write(conn.send(h11.EndOfMessage()))


def _has_body(request: h11.Request) -> bool:
    for name, value in request.headers:
        if name == b"content-length" and value.strip() != b"0":
            return True
        if name == b"transfer-encoding":
            return True
    return False
