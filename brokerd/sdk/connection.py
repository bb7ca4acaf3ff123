"""One authenticated connection to a daemon's client listener (SPEC §7), and the
requests in flight on it.

A :class:`Connection` owns its socket, its frame reader and the requests written on
it. It logs in (R-CLIENT-1), writes the requests of one turn of the event loop
together, pairs each answer with its request by id, and when the socket goes it hands
every request still unanswered to its owner (the :class:`~brokerd.sdk.keeper.ConnectionKeeper`),
with what the daemon said of them: a daemon stopping gracefully names the last request
it read, so those after it were never executed, and so were those the socket went
before they were written (SPEC §6, outcomes).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from brokerd.sdk.tls import describe_failure
from protocol.buffers import Buffer, coalesce
from protocol.client_wire import (
    ClientFrame,
    ClientFrameKind,
    ClientFrameReader,
    auth_proof,
    encode_meta,
    encode_request_parts,
    read_buffer_in,
)
from protocol.errors import (
    AuthenticationFailed,
    BrokerError,
    BrokerStopping,
    ClientError,
    RemoteError,
    RemoteProtocolError,
    for_code,
)


class Reply(Protocol):
    """What waits for a request's answer: a future of the frame, or an adapter."""

    def done(self) -> bool: ...

    def set_result(self, frame: ClientFrame, /) -> None: ...

    def set_exception(self, exc: BaseException, /) -> None: ...


def _sequence_number(meta: dict[str, Any]) -> int:
    """The sequence number a SEND's reply carries; RemoteProtocolError if it has none."""
    value = meta.get("sequence_number")
    if type(value) is not int:
        raise RemoteProtocolError(f"the daemon's SEND reply has no sequence number: {value!r}")
    return value


class SequenceReply:
    """A SEND's answer delivered straight to a future of its sequence number."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[int]) -> None:
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, frame: ClientFrame, /) -> None:
        """Called by the reader for the reply: never raises into it (a reply without a
        sequence number fails this future only)."""
        if frame.kind is ClientFrameKind.ERROR:
            self.future.set_exception(error_of(frame))
            return
        try:
            self.future.set_result(_sequence_number(frame.meta))
        except RemoteProtocolError as exc:
            self.future.set_exception(exc)

    def set_exception(self, exc: BaseException, /) -> None:
        self.future.set_exception(exc)


@dataclass(slots=True)
class Request:
    """A request as the SDK keeps it until its answer: enough to write it again on a
    new connection when that is safe."""

    meta: bytes
    """The request's meta, encoded once (``protocol.client_wire.encode_meta``)."""
    body: Buffer
    reply: Reply
    repeatable: bool = False
    """Safe to send again when its outcome is unknown: it changes nothing (a view, a
    ping) or carries idempotency keys (SPEC §6)."""
    bound_to: int | None = None
    """The connection it must go on (its number, :attr:`ConnectionKeeper.generation`): a
    client transaction's requests, since the transaction lives and dies with its
    connection. None: any connection."""
    commits: bool = False
    """A COMMIT: its outcome is unknown when its connection goes before the answer."""
    connection: Connection | None = None
    """The connection it was last written on (None: not written yet), and its id there:
    what a ``withdraw`` names (:meth:`BrokerClient.receive`'s caller stopped waiting)."""
    request_id: int = 0
    only_here: bool = False
    """Never written again on another connection: it fails with its own (a ``withdraw``,
    which names a request by its id on this one, or a request no caller waits for)."""
    maybe_executed: bool = False
    """Written on a connection lost before its answer, without the daemon saying it was
    not executed: kept for the next connection (it is repeatable), but if it is never
    written again its outcome is unknown, not "never sent"."""


@dataclass(frozen=True, slots=True)
class Address:
    """Where a daemon's client listener is and how to log in to it."""

    host: str
    port: int
    secret: bytes
    user: str
    timeout: float
    ssl_context: ssl.SSLContext | None = None
    server_hostname: str | None = None

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(slots=True)
class Ending:
    """How a connection ended, for the requests it leaves unanswered."""

    reason: str
    last_read: int | None = None
    """The last request the daemon read, when it said so (a graceful stop): the ones
    after it were never executed."""
    stopping: BrokerStopping | None = None
    """The daemon's goodbye, when it sent one."""
    refused: Exception | None = None
    """Why the daemon closed the connection, when it said so (an ERROR that answers no
    request: something this client wrote broke the client protocol, or no login came in
    time). What it left unanswered is not written again: it would be refused again."""
    unanswered: list[tuple[int, Request]] = field(default_factory=list)
    """In the order they were written."""
    unwritten: frozenset[int] = frozenset()
    """The ids of those the socket went before they were written (made in its last turn
    of the event loop): the daemon never read them."""


def error_of(frame: ClientFrame) -> Exception:
    """The typed error an ERROR frame reports."""
    kind = str(frame.meta.get("error", "BrokerError"))
    message = str(frame.meta.get("message", ""))
    if kind == "AuthenticationFailed":
        return AuthenticationFailed(message)
    error = for_code(frame.meta.get("code"))
    return error(message, kind=kind, retriable=bool(frame.meta.get("retriable", False)))


_THREAD = threading.local()
"""Where this thread's connections keep their read buffer (:func:`read_buffer_in`)."""


class _Protocol(asyncio.BufferedProtocol):
    """Reads go where the frame reader says: a large body (RECEIVE's replies of 1 MiB
    messages) straight into its own buffer, no copy on this side of the kernel."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.connection.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.connection.reader.get_buffer(read_buffer_in(_THREAD))

    def buffer_updated(self, nbytes: int) -> None:
        self.connection.on_read(nbytes)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection.on_lost(exc)

    def pause_writing(self) -> None:
        self.connection.writable.clear()

    def resume_writing(self) -> None:
        self.connection.writable.set()


class Connection:
    """One socket to the daemon, logged in. ``on_end`` is called once, when the socket
    is gone, with the requests it leaves unanswered."""

    def __init__(self, address: Address, on_end: Callable[[Connection, Ending], None]) -> None:
        self.address = address
        self.transport: asyncio.Transport | None = None
        self._on_end = on_end
        self.reader = ClientFrameReader()
        self._ids = itertools.count(1)
        self._pending: dict[int, Request] = {}
        self._out: list[Buffer] | None = None
        """Request frames of this turn of the event loop, written together at its end."""
        self._unwritten: set[int] = set()
        """The ids of the requests in ``_out``, or left there by a socket gone first."""
        self._challenge: asyncio.Future[ClientFrame] | None = None
        self.writable = asyncio.Event()
        """Clear while the socket's send buffer is over its high-water mark (:meth:`drain`)."""
        self.writable.set()
        self._ending = Ending("")
        self._ended = False
        self.instance = ""
        self.role = ""
        self.max_body: int | None = None
        """The longest request body the daemon reads (its ``limits.max_message_size``,
        from the login's answer; None from a daemon that does not say)."""
        self.features: frozenset[str] = frozenset()
        """What the daemon offers beyond the first client protocol, from the login's answer
        (``protocol.client_wire.BEGIN_DIALOG_KEYS``; none from a daemon that does not say)."""

    # -- opening -----------------------------------------------------------------------

    async def open(self) -> None:
        """Connect and log in; ClientError (AuthenticationFailed for refused credentials)
        if either fails, the socket closed."""
        address = self.address
        loop = asyncio.get_running_loop()
        self._challenge = loop.create_future()
        tls = address.ssl_context
        try:
            await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Protocol(self),
                    address.host,
                    address.port,
                    ssl=tls,
                    server_hostname=(address.server_hostname or address.host) if tls else None,
                    ssl_handshake_timeout=address.timeout if tls else None,
                ),
                address.timeout,
            )
        except (OSError, TimeoutError) as exc:
            reason = describe_failure(exc) or str(exc) or type(exc).__name__
            raise ClientError(f"cannot connect to brokerd at {address}: {reason}") from exc
        try:
            await self._login()
        except BaseException:
            self.close()
            raise

    async def _login(self) -> None:
        address = self.address
        assert self._challenge is not None
        challenge: ClientFrame | None = None
        tls_hint = "; does its client port require TLS? (pass tls_ca_file= or ssl_context=)"
        try:
            challenge = await asyncio.wait_for(self._challenge, address.timeout)
            nonce = bytes.fromhex(str(challenge.meta.get("nonce", "")))
            future: asyncio.Future[ClientFrame] = asyncio.get_running_loop().create_future()
            proof = auth_proof(address.secret, nonce, address.user)
            login = {"op": "login", "user": address.user, "proof": proof}
            self.submit(Request(encode_meta(login), b"", future))
            frame = await asyncio.wait_for(future, address.timeout)
        except TimeoutError:
            hint = tls_hint if challenge is None and address.ssl_context is None else ""
            raise ClientError(
                f"{address} did not complete the brokerd login in {address.timeout} s{hint}"
            ) from None
        except ValueError:
            raise ClientError(f"{address} sent a malformed login challenge") from None
        except ClientError as exc:
            if challenge is None and address.ssl_context is None:
                raise ClientError(
                    f"{address} closed the connection before its login challenge ({exc})" + tls_hint
                ) from exc
            raise
        if frame.kind is ClientFrameKind.ERROR:
            raise error_of(frame)
        self.instance = str(frame.meta.get("instance", ""))
        self.role = str(frame.meta.get("role", "admin"))
        limit = frame.meta.get("max_message_size")
        self.max_body = limit if type(limit) is int and limit > 0 else None
        features = frame.meta.get("features")
        if isinstance(features, list):
            self.features = frozenset(f for f in features if isinstance(f, str))

    # -- state -------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Requests may be written: open, and the daemon has not said it is stopping."""
        return (
            self.transport is not None
            and not self.transport.is_closing()
            and self._ending.stopping is None
        )

    @property
    def ended(self) -> bool:
        """The socket is gone and its unanswered requests were handed on (``on_end``)."""
        return self._ended

    @property
    def stopping(self) -> BrokerStopping | None:
        """The daemon's goodbye: it is stopping and reads no more requests."""
        return self._ending.stopping

    @property
    def tls_version(self) -> str | None:
        if self.transport is None:
            return None
        ssl_object = self.transport.get_extra_info("ssl_object")
        return None if ssl_object is None else ssl_object.version()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        """Write what was requested this turn, then close; the unanswered requests go to
        ``on_end`` once the socket is gone."""
        if self.transport is not None:
            self._write_out()
            self.transport.close()
            self.transport = None
        self._ending.reason = self._ending.reason or "client closed"
        self._end(None)

    # -- writing -----------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Write ``request`` (with the others of this turn of the event loop, in order)."""
        request_id = next(self._ids) & 0xFFFFFFFF
        if not request_id:  # id 0 answers no request (a goodbye, a refusal): skipped
            request_id = next(self._ids) & 0xFFFFFFFF
        # encoded first: a request that cannot be written is not left in flight
        pieces = encode_request_parts(request_id, request.meta, request.body)
        self._pending[request_id] = request
        self._unwritten.add(request_id)
        request.connection, request.request_id = self, request_id
        if self._out is None:
            self._out = pieces
            asyncio.get_running_loop().call_soon(self._write_out)
        else:
            self._out.extend(pieces)

    async def drain(self) -> None:
        """Write what was requested this turn, then wait until the socket has taken what
        was written down to its buffer's low-water mark (or the connection is gone)."""
        self._write_out()
        await self.writable.wait()

    def _write_out(self) -> None:
        out, self._out = self._out, None
        if not out or self.transport is None or self.transport.is_closing():
            return  # left unanswered with the connection, and known never written
        self._unwritten.clear()
        pieces = coalesce(out)
        if len(pieces) == 1:
            self.transport.write(pieces[0])
        else:  # large bodies as they are (one writev), never joined into a copy
            self.transport.writelines(pieces)

    # -- reading -----------------------------------------------------------------------

    def on_read(self, nbytes: int) -> None:
        """``nbytes`` arrived where ``reader.get_buffer()`` said."""
        try:
            frames = self.reader.buffer_updated(nbytes)
        except RemoteProtocolError as exc:
            self._ending.reason = f"daemon sent bad data: {exc}"
            if self.transport is not None:
                self.transport.close()
            return
        for frame in frames:
            if frame.kind is ClientFrameKind.CHALLENGE:
                if self._challenge is not None and not self._challenge.done():
                    self._challenge.set_result(frame)
                continue
            if (
                frame.kind is ClientFrameKind.ERROR
                and frame.request_id == 0
                and frame.meta.get("code") == BrokerStopping.code
            ):
                self._goodbye(frame)
                continue
            if frame.kind is ClientFrameKind.ERROR and frame.request_id == 0:
                self._refused(frame)
                continue
            request = self._pending.pop(frame.request_id, None)
            if request is not None and not request.reply.done():
                request.reply.set_result(frame)

    def _goodbye(self, frame: ClientFrame) -> None:
        """The daemon is stopping (SIGTERM) and read nothing after request
        ``last_request``; what it read is still answered before it closes."""
        self._ending.stopping = BrokerStopping(
            str(frame.meta.get("message", "the daemon is stopping"))
        )
        last = frame.meta.get("last_request")
        if type(last) is int:
            self._ending.last_read = last

    def _refused(self, frame: ClientFrame) -> None:
        """The daemon closes the connection and says why (it answers no request)."""
        error = error_of(frame)
        self._ending.refused = error
        message = error.remote_message if isinstance(error, RemoteError) else str(error)
        self._ending.reason = f"the daemon closed the connection: {message}"

    def on_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.reader.close()
        self._end(exc)

    def _end(self, exc: Exception | None) -> None:
        if self._ended:
            return
        self._ended = True
        self.writable.set()  # a drain waiting on it is over: the keeper says what follows
        ending = self._ending
        if not ending.reason:
            ending.reason = f"connection to brokerd lost{': ' + str(exc) if exc else ''}"
        if self._challenge is not None and not self._challenge.done():
            self._challenge.set_exception(ClientError(ending.reason))
        pending, self._pending = self._pending, {}
        for request in pending.values():
            if request.only_here and not request.reply.done():
                request.reply.set_exception(ClientError(ending.reason))
        # in the order written: ``pending`` keeps it, the ids do not once they wrap
        ending.unanswered = [i for i in pending.items() if not i[1].only_here]
        ending.unwritten = frozenset(self._unwritten)
        self._unwritten.clear()
        self._on_end(self, ending)


def abandon(
    request: Request,
    future: asyncio.Future[ClientFrame],
    abandoned: Callable[[ClientFrame | None], None] | None,
) -> None:
    """The caller of ``request`` (a RECEIVE or GET CONVERSATION GROUP, which may wait)
    stopped waiting for ``future``, its answer: take the request back (``withdraw``: the
    daemon ends it empty if it has taken nothing yet), and hand its answer to
    ``abandoned`` once it comes (None: it failed, or it will never be written)."""

    def answered(done: asyncio.Future[ClientFrame]) -> None:
        if abandoned is None:
            return
        if done.cancelled() or done.exception() is not None:
            abandoned(None)
            return
        frame = done.result()
        abandoned(None if frame.kind is ClientFrameKind.ERROR else frame)

    if future.done():
        answered(future)
        return
    connection = request.connection
    if connection is None or connection.ended:  # waiting for a connection: never written
        future.cancel()
        answered(future)
        return
    # Its connection's end settles it: never written again on another, where nothing
    # would withdraw it and a withdraw naming it by its id here would name another.
    request.only_here = True
    future.add_done_callback(answered)
    if connection.usable:
        withdrawn: asyncio.Future[ClientFrame] = future.get_loop().create_future()
        withdrawn.add_done_callback(_ignored)
        meta = encode_meta({"op": "withdraw", "request": request.request_id})
        connection.submit(Request(meta, b"", withdrawn, only_here=True))


def roll_back_unowned(request: Request, done: asyncio.Future[ClientFrame]) -> None:
    """``done`` answers ``request``, a BEGIN TRANSACTION whose caller stopped waiting:
    the transaction it began, which no one can end, is rolled back on its connection
    (one that is gone took it along: the daemon rolls back a lost connection's)."""
    if done.cancelled() or done.exception() is not None:
        return
    frame = done.result()
    connection = request.connection
    tx_id = frame.meta.get("transaction")
    if frame.kind is ClientFrameKind.ERROR or type(tx_id) is not int:
        return
    if connection is None or not connection.usable:
        return
    answer: asyncio.Future[ClientFrame] = done.get_loop().create_future()
    answer.add_done_callback(_ignored)
    meta = encode_meta({"op": "rollback", "transaction": tx_id})
    connection.submit(Request(meta, b"", answer, only_here=True))


def disown(
    request: Request, future: asyncio.Future[ClientFrame], undo: Callable[[ClientFrame], None]
) -> None:
    """The caller of ``request`` stopped waiting for ``future``, its answer, and what the
    request makes would have no owner: one waiting for a connection is never written;
    one written hands its answer, when it comes and is not an error, to ``undo``."""
    if request.connection is None:  # waiting for a connection: never written
        future.cancel()
        return

    def answered(done: asyncio.Future[ClientFrame]) -> None:
        if not done.cancelled() and done.exception() is None:
            frame = done.result()
            if frame.kind is not ClientFrameKind.ERROR:
                undo(frame)

    future.add_done_callback(answered)


def end_unowned_dialog(submit: Callable[[Request], None], frame: ClientFrame) -> None:
    """``frame`` answers a BEGIN DIALOG whose caller stopped waiting: the conversation it
    began, whose handle no one has, is ended WITH CLEANUP (``submit`` writes it, on this
    connection or the next). Nothing crosses the network before a conversation's first
    SEND, so no one is told (SPEC §6)."""
    handle = frame.meta.get("conversation_handle")
    if not isinstance(handle, str):
        return
    answer: asyncio.Future[ClientFrame] = asyncio.get_running_loop().create_future()
    answer.add_done_callback(_ignored)
    meta = encode_meta({"op": "end_conversation", "conversation_handle": handle, "cleanup": True})
    with contextlib.suppress(BrokerError):  # the client is closed: nothing goes any more
        submit(Request(meta, b"", answer, repeatable=True))


def _ignored(done: asyncio.Future[ClientFrame]) -> None:
    """An answer no one waits for (a ``withdraw``'s: the RECEIVE's own answer says what
    came of it; an unowned transaction's rollback, an unowned dialog's end)."""
    if not done.cancelled():
        done.exception()
