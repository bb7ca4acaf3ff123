"""The application SDK: Service Broker verbs over the daemon's client listener (SPEC §6).

Imports only ``protocol/``; it never touches the daemon's internals. One
:class:`BrokerClient` is one authenticated connection; calls may run
concurrently on it (a reader task pairs responses with requests by id, and
closing fails every pending call, as aiokafka does).

    async with await BrokerClient.connect("127.0.0.1", 4023, token_file=...) as client:
        handle = await client.begin_dialog("//shop/Client", "//warehouse/Orders",
                                           "//shop/OrderContract")
        await client.send(handle, "//shop/Order", b"<order/>")
        for message in await client.receive("ClientQueue", timeout=5):
            ...
        await client.end_conversation(handle)

Two receive loops (SPEC §6, R-DLG-1):

* :meth:`BrokerClient.messages` yields messages taken by autocommit RECEIVEs. A
  message leaves the queue before the application sees it, so one that the
  application had not finished with when it (or its host) died is gone: **at
  most once**.
* :meth:`BrokerClient.consume` receives each batch inside a client transaction,
  hands it to the application's handler with that transaction, and commits when
  the handler returns: the messages leave the queue together with whatever the
  handler did through the transaction (SENDs, END CONVERSATION, ...), or not at
  all. If the handler raises, the transaction rolls back; if the client dies or
  loses its connection first, the daemon rolls it back. Either way the messages
  are receivable again, in order. This is the **exactly-once** loop for
  everything the handler does through the transaction; what it does elsewhere
  (a file, another system) may happen again for a batch received again, so make
  that idempotent.

A daemon whose client port speaks TLS (``[client] tls_certificate``, required when
it listens on an address other than loopback) is reached with ``tls_ca_file=`` (the
CA that issued its certificate) or ``ssl_context=`` (an ``ssl.SSLContext`` of your
own, e.g. with a client certificate); the certificate must name the host dialled
(``server_hostname=`` overrides the name checked). ``user=`` selects the token: a
``[[client.token]]`` name with that token's file, or the admin token for any
other name. An application token may use only its own services and queues; what
it may not do is refused with ``PermissionDenied``.

Errors the daemon reports arrive as the subclass of
:class:`protocol.errors.RemoteError` named by their code (``ConversationEnded``,
``QueueDisabled``, ``LockConflict``, ...; docs/errors.md lists them), ``kind``
naming the daemon-side class; connection problems as :class:`ClientError`;
refused credentials as :class:`AuthenticationFailed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, cast

import orjson

from brokerd.sdk.messages import (
    QuarantinedConversation,
    ReceivedMessage,
    parse_quarantined,
    parse_received,
)
from brokerd.sdk.requests import (
    begin_dialog_request,
    end_conversation_request,
    end_quarantined_request,
    move_request,
    receive_request,
    release_quarantine_request,
    send_many_request,
    send_meta,
    timer_request,
)
from brokerd.sdk.tls import client_context, describe_failure
from brokerd.sdk.transaction import Transaction
from protocol.buffers import Buffer, coalesce
from protocol.client_wire import (
    ClientFrame,
    ClientFrameKind,
    ClientFrameReader,
    auth_proof,
    encode_frame,
    encode_request_parts,
)
from protocol.errors import (
    AuthenticationFailed,
    BrokerStopping,
    ClientError,
    OutcomeUnknown,
    RemoteProtocolError,
    for_code,
)

DEFAULT_PORT = 4023

__all__ = ["DEFAULT_PORT", "BrokerClient", "ReceivedMessage", "Transaction"]


class _ClientProtocol(asyncio.Protocol):
    def __init__(self, client: BrokerClient) -> None:
        self.client = client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client._attach(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        self.client._on_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._on_lost(exc)


class _Reply(Protocol):
    """What waits for a request's answer: a future of the frame, or an adapter."""

    def done(self) -> bool: ...

    def set_result(self, frame: ClientFrame, /) -> None: ...

    def set_exception(self, exc: BaseException, /) -> None: ...


def _error_of(frame: ClientFrame) -> Exception:
    """The typed error an ERROR frame reports."""
    kind = str(frame.meta.get("error", "BrokerError"))
    message = str(frame.meta.get("message", ""))
    if kind == "AuthenticationFailed":
        return AuthenticationFailed(message)
    error = for_code(frame.meta.get("code"))
    return error(message, kind=kind, retriable=bool(frame.meta.get("retriable", False)))


def _sequence_number(meta: dict[str, Any]) -> int:
    """The sequence number a SEND's reply carries; RemoteProtocolError if it has none."""
    value = meta.get("sequence_number")
    if type(value) is not int:
        raise RemoteProtocolError(f"the daemon's SEND reply has no sequence number: {value!r}")
    return value


class _SequenceReply:
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
            self.future.set_exception(_error_of(frame))
            return
        try:
            self.future.set_result(_sequence_number(frame.meta))
        except RemoteProtocolError as exc:
            self.future.set_exception(exc)

    def set_exception(self, exc: BaseException, /) -> None:
        self.future.set_exception(exc)


class BrokerClient:
    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._reader = ClientFrameReader()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Reply] = {}
        self._out: list[Buffer] | None = None
        """Request frames of this turn of the event loop, written together at its end."""
        self._challenge: asyncio.Future[ClientFrame] | None = None
        self._closed_reason: str | None = None
        self._goodbye: BrokerStopping | None = None
        """The daemon said it is stopping: new requests are refused with this at once."""
        self.instance: str = ""
        self.role: str = ""
        """``admin`` or ``application``: what the token this client logged in with may do."""

    @classmethod
    async def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        token: bytes | str | None = None,
        token_file: str | Path | None = None,
        user: str = "app",
        timeout: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        tls_ca_file: str | Path | None = None,
        server_hostname: str | None = None,
    ) -> BrokerClient:
        """Connect (over TLS with ``ssl_context`` or ``tls_ca_file``) and log in with the
        token ``user`` selects."""
        if token is None:
            if token_file is None:
                raise AuthenticationFailed("no credentials: pass token= or token_file=")
            try:
                token = Path(token_file).read_text().strip()
            except OSError as exc:
                raise AuthenticationFailed(f"cannot read token file {token_file}: {exc}") from exc
        secret = token.encode() if isinstance(token, str) else token
        if ssl_context is None and tls_ca_file is not None:
            ssl_context = client_context(tls_ca_file)
        client = cls()
        loop = asyncio.get_running_loop()
        client._challenge = loop.create_future()
        try:
            await asyncio.wait_for(
                loop.create_connection(
                    lambda: _ClientProtocol(client),
                    host,
                    port,
                    ssl=ssl_context,
                    server_hostname=(server_hostname or host) if ssl_context else None,
                    ssl_handshake_timeout=timeout if ssl_context else None,
                ),
                timeout,
            )
        except (OSError, TimeoutError) as exc:
            reason = describe_failure(exc) or str(exc) or type(exc).__name__
            raise ClientError(f"cannot connect to brokerd at {host}:{port}: {reason}") from exc
        challenge: ClientFrame | None = None
        try:
            challenge = await asyncio.wait_for(client._challenge, timeout)
            nonce = bytes.fromhex(str(challenge.meta.get("nonce", "")))
            meta = await asyncio.wait_for(
                client._call(
                    {"op": "login", "user": user, "proof": auth_proof(secret, nonce, user)}
                ),
                timeout,
            )
        except TimeoutError:
            await client.close()
            hint = (
                "; does its client port require TLS? (pass tls_ca_file= or ssl_context=)"
                if challenge is None and ssl_context is None
                else ""
            )
            raise ClientError(
                f"{host}:{port} did not complete the brokerd login in {timeout} s{hint}"
            ) from None
        except ValueError:
            await client.close()
            raise ClientError(f"{host}:{port} sent a malformed login challenge") from None
        except ClientError as exc:
            await client.close()
            if challenge is None and ssl_context is None:
                raise ClientError(
                    f"{host}:{port} closed the connection before its login challenge ({exc}); "
                    "does its client port require TLS? (pass tls_ca_file= or ssl_context=)"
                ) from exc
            raise
        except BaseException:
            await client.close()
            raise
        client.instance = str(meta[0].get("instance", ""))
        client.role = str(meta[0].get("role", "admin"))
        return client

    @property
    def tls_version(self) -> str | None:
        """The TLS version of the connection (``TLSv1.3``), None if it is plain TCP."""
        if self._transport is None:
            return None
        ssl_object = self._transport.get_extra_info("ssl_object")
        return None if ssl_object is None else ssl_object.version()

    async def __aenter__(self) -> BrokerClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection; pending calls fail with OutcomeUnknown (a ClientError).
        Idempotent."""
        if self._transport is not None:
            self._write_out()  # requests already made reach the daemon, as before a close
            self._transport.close()
            self._transport = None
        self._fail_all("client closed")

    # -- wire ----------------------------------------------------------------------

    def _attach(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def _write(self, *pieces: Buffer) -> None:
        """Queue a request frame, whole or as its pieces; the requests of one turn of the
        event loop (a pipelined producer's SENDs) go to the socket in one write, in
        order, at the end of the turn."""
        if self._out is None:
            self._out = list(pieces)
            asyncio.get_running_loop().call_soon(self._write_out)
        else:
            self._out.extend(pieces)

    def _write_out(self) -> None:
        out, self._out = self._out, None
        if not out or self._transport is None or self._transport.is_closing():
            return  # the pending calls fail with the connection
        pieces = coalesce(out)
        if len(pieces) == 1:
            self._transport.write(pieces[0])
        else:  # large bodies as they are (one writev), never joined into a copy
            self._transport.writelines(pieces)

    def _on_data(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except RemoteProtocolError as exc:
            self._fail_all(f"daemon sent bad data: {exc}")
            if self._transport is not None:
                self._transport.close()
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
                self._stopping(frame)
                continue
            future = self._pending.pop(frame.request_id, None)
            if future is not None and not future.done():
                future.set_result(frame)

    def _stopping(self, frame: ClientFrame) -> None:
        """The daemon is stopping (SIGTERM) and read nothing after request
        ``last_request``: the requests after it were not executed and fail now with
        :class:`BrokerStopping` (safe to send again); the ones it read are still answered
        before it closes; new ones are refused at once."""
        last = frame.meta.get("last_request")
        goodbye = self._goodbye = BrokerStopping(
            str(frame.meta.get("message", "the daemon is stopping"))
        )
        if type(last) is not int:
            return  # a daemon that does not say: what is in flight stays unknown
        for request_id in [r for r in self._pending if r > last]:
            reply = self._pending.pop(request_id)
            if not reply.done():
                reply.set_exception(
                    BrokerStopping(
                        goodbye.remote_message + " (not executed)", kind="BrokerStopping"
                    )
                )

    def _on_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._fail_all(f"connection to brokerd lost{': ' + str(exc) if exc else ''}")

    def _fail_all(self, reason: str) -> None:
        """The connection is gone: what was in flight may or may not have taken effect."""
        self._closed_reason = self._closed_reason or reason
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(
                    OutcomeUnknown(f"{reason}: the request may or may not have taken effect")
                )
        if self._challenge is not None and not self._challenge.done():
            self._challenge.set_exception(ClientError(reason))

    def _request(self, meta: dict[str, Any], body: bytes, reply: _Reply) -> None:
        """Queue a request; ``reply`` gets its answer (or the connection's failure)."""
        if self._goodbye is not None:
            raise self._goodbye
        if self._transport is None or self._transport.is_closing():
            raise ClientError(self._closed_reason or "not connected")
        request_id = next(self._ids) & 0xFFFFFFFF
        self._pending[request_id] = reply
        self._write(encode_frame(ClientFrame(ClientFrameKind.REQUEST, request_id, meta, body)))

    async def _call(self, meta: dict[str, Any], body: bytes = b"") -> tuple[dict[str, Any], bytes]:
        future: asyncio.Future[ClientFrame] = asyncio.get_running_loop().create_future()
        self._request(meta, body, future)
        frame = await future
        if frame.kind is ClientFrameKind.ERROR:
            raise _error_of(frame)
        return frame.meta, frame.body

    # -- verbs -----------------------------------------------------------------------

    async def begin_dialog(
        self,
        from_service: str,
        to_service: str,
        contract: str = "DEFAULT",
        *,
        database: str | None = None,
        to_broker_instance: uuid.UUID | str | None = None,
        lifetime: int = 0,
        related_conversation: uuid.UUID | None = None,
    ) -> uuid.UUID:
        """BEGIN DIALOG FROM SERVICE ... TO SERVICE ... ON CONTRACT ...; the new handle."""
        meta, _ = await self._call(
            *begin_dialog_request(
                from_service,
                to_service,
                contract,
                database,
                to_broker_instance,
                lifetime,
                related_conversation,
            )
        )
        return uuid.UUID(meta["conversation_handle"])

    async def send(
        self,
        conversation_handle: uuid.UUID,
        message_type: str = "DEFAULT",
        body: bytes = b"",
        *,
        key: str | None = None,
    ) -> int:
        """SEND ON CONVERSATION; returns after the message is durably queued.

        ``key`` is an idempotency key (1 to 200 characters, unique per conversation): a
        SEND whose outcome is unknown (``OutcomeUnknown``: the daemon was killed, the
        connection cut) may be sent again with the same key, on a new connection; the
        daemon commits it once and answers both with the same sequence number. Keys are
        kept for ``limits.send_key_window`` (a day by default) while the conversation
        lasts. Not for SENDs in a transaction (its COMMIT is the one outcome)."""
        return await self.send_nowait(conversation_handle, message_type, body, key=key)

    def send_nowait(
        self,
        conversation_handle: uuid.UUID,
        message_type: str = "DEFAULT",
        body: bytes = b"",
        *,
        key: str | None = None,
    ) -> asyncio.Future[int]:
        """SEND ON CONVERSATION without waiting (aiokafka's ``send`` to :meth:`send`'s
        ``send_and_wait``): the request goes out with the others of this turn of the event
        loop, in the order made, and the future gives the message's sequence number once
        it is durably queued, or the error. A producer keeps many in flight without a
        task for each. Raises ClientError at once if the connection is closed. ``key``:
        an idempotency key, as :meth:`send`'s."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if self._goodbye is not None:
            raise self._goodbye
        if self._transport is None or self._transport.is_closing():
            raise ClientError(self._closed_reason or "not connected")
        request_id = next(self._ids) & 0xFFFFFFFF
        self._pending[request_id] = _SequenceReply(future)
        meta = send_meta(conversation_handle, message_type, key)
        self._write(*encode_request_parts(request_id, meta, bytes(body)))
        return future

    async def receive(
        self,
        queue: str,
        *,
        database: str | None = None,
        top: int = 1,
        timeout: float = 0.0,
        conversation_handle: uuid.UUID | None = None,
    ) -> list[ReceivedMessage]:
        """RECEIVE TOP (top) FROM queue, WAITFOR up to ``timeout`` s (negative: forever)."""
        meta, body = await self._call(
            *receive_request(queue, database, top, timeout, conversation_handle)
        )
        return parse_received(meta, body)

    async def end_conversation(
        self,
        conversation_handle: uuid.UUID,
        *,
        error_code: int | None = None,
        description: str = "",
        cleanup: bool = False,
    ) -> None:
        """END CONVERSATION [WITH ERROR = code DESCRIPTION = ... | WITH CLEANUP]."""
        await self._call(
            *end_conversation_request(conversation_handle, error_code, description, cleanup)
        )

    async def begin_conversation_timer(
        self, conversation_handle: uuid.UUID, timeout: float
    ) -> None:
        """BEGIN CONVERSATION TIMER (handle) TIMEOUT = seconds (R-DLG-11): a DialogTimer
        message arrives in this side's queue when it fires; a new timer replaces the old."""
        await self._call(*timer_request(conversation_handle, timeout))

    async def send_many(
        self,
        messages: list[tuple[uuid.UUID, str, bytes]],
        keys: list[str | None] | None = None,
    ) -> list[int]:
        """SEND several (handle, message type, body) in one request and one commit per
        database: a producer's batched path without a transaction. One refusal
        refuses them all; the sequence numbers come back in order. ``keys``: each
        message's idempotency key (or None), as :meth:`send`'s."""
        meta, _ = await self._call(*send_many_request(messages, keys))
        return [int(s) for s in meta["sequence_numbers"]]

    async def move_conversation(
        self, conversation_handle: uuid.UUID, conversation_group_id: uuid.UUID
    ) -> None:
        """MOVE CONVERSATION (handle) TO (group): its waiting messages move with it."""
        await self._call(*move_request(conversation_handle, conversation_group_id))

    async def release_quarantine(self, conversation_handle: uuid.UUID) -> int:
        """Release a conversation quarantined by poison-message handling (SPEC §6): its
        messages are receivable again, in order, their rollback counts reset. Returns how
        many messages it released; NotQuarantined if it is not quarantined."""
        meta, _ = await self._call(*release_quarantine_request(conversation_handle))
        return int(meta.get("released", 0))

    async def end_quarantined(
        self, conversation_handle: uuid.UUID, error_code: int, description: str = ""
    ) -> None:
        """END CONVERSATION WITH ERROR of a quarantined conversation (SPEC §6): its messages
        are discarded and the far side receives the Error."""
        await self._call(*end_quarantined_request(conversation_handle, error_code, description))

    async def quarantined(self) -> list[QuarantinedConversation]:
        """The ``quarantined`` view, typed: every conversation set aside, its failing
        message, rollback count and last error (an admin view)."""
        return parse_quarantined(await self.view("quarantined"))

    async def begin_transaction(self) -> Transaction:
        """BEGIN TRANSACTION; prefer ``async with client.transaction() as tx``."""
        meta, _ = await self._call({"op": "begin_transaction"})
        return Transaction(self._call, int(meta["transaction"]))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """A client transaction: COMMIT when the block ends, ROLLBACK if it raises.

        Inside it RECEIVE holds its conversation group until the end; SEND, BEGIN
        DIALOG, END CONVERSATION, the timer and MOVE take effect at COMMIT, all
        together or not at all. A connection lost mid-transaction rolls it back.

            async with client.transaction() as tx:
                for message in await tx.receive("OrderQueue", top=10, timeout=5):
                    await tx.send(message.conversation_handle, "//shop/Reply", b"...")
                    await tx.end_conversation(message.conversation_handle)
        """
        tx = await self.begin_transaction()
        try:
            yield tx
        except BaseException as exc:
            if not tx.finished and self._transport is not None:
                with contextlib.suppress(ClientError):
                    await tx.rollback(reason=f"{type(exc).__name__}: {exc}")
            raise
        if not tx.finished:
            await tx.commit()

    async def messages(
        self,
        queue: str,
        *,
        database: str | None = None,
        top: int = 100,
        timeout: float = 1.0,
        stop: asyncio.Event | None = None,
    ) -> AsyncIterator[ReceivedMessage]:
        """Every message of ``queue`` as it arrives, by autocommit RECEIVEs of up to
        ``top`` (each waiting up to ``timeout`` s), until ``stop`` is set.

        **At most once**: a message is removed from the queue when it is received, so
        one the application had not finished with when it died is lost. Use
        :meth:`consume` for exactly once.
        """
        while stop is None or not stop.is_set():
            for message in await self.receive(queue, database=database, top=top, timeout=timeout):
                yield message

    async def consume(
        self,
        queue: str,
        handler: Callable[[Transaction, list[ReceivedMessage]], Awaitable[None]],
        *,
        database: str | None = None,
        top: int = 100,
        timeout: float = 1.0,
        stop: asyncio.Event | None = None,
        batches: int | None = None,
    ) -> int:
        """Receive ``queue`` batch by batch, each inside its own client transaction:
        RECEIVE up to ``top`` messages of one conversation group (waiting up to
        ``timeout`` s), ``await handler(tx, messages)``, then COMMIT. Returns how many
        messages were committed, once ``stop`` is set or after ``batches`` batches.

        **Exactly once** for what the handler does through ``tx``: the messages leave
        the queue in the same commit as the handler's SENDs and other verbs. If the
        handler raises, the transaction rolls back (the messages are back in the queue,
        first in their group and in order; each counts one rollback, with the exception
        as its reason, for the queue's poison-message handling, SPEC §6) and the
        exception propagates; if the client
        dies between RECEIVE and COMMIT, the daemon rolls back when the connection
        closes. A batch handed out again may therefore reach the handler twice: make
        its effects outside the broker idempotent.
        """
        done = 0
        handled = 0
        while (stop is None or not stop.is_set()) and (batches is None or handled < batches):
            async with self.transaction() as tx:
                received = await tx.receive(queue, database=database, top=top, timeout=timeout)
                if not received:
                    await tx.rollback()  # nothing held: no commit needed
                    continue
                await handler(tx, received)
            done += len(received)
            handled += 1
        return done

    async def alter_queue(self, queue: str, status: bool, *, database: str | None = None) -> None:
        """ALTER QUEUE queue WITH STATUS = ON | OFF (R-DLG-12)."""
        await self._call(
            {"op": "alter_queue", "queue": queue, "status": status, "database": database}
        )

    async def create_route(
        self,
        database: str,
        name: str,
        address: str,
        *,
        remote_service_name: str | None = None,
        broker_instance: uuid.UUID | str | None = None,
        mirror_address: str | None = None,
        lifetime: float | None = None,
    ) -> None:
        """CREATE ROUTE in ``database`` (persisted; ``lifetime`` in seconds from now, R-OBJ-5)."""
        route = {
            "name": name,
            "address": address,
            "remote_service_name": remote_service_name,
            "broker_instance": str(broker_instance) if broker_instance else None,
            "mirror_address": mirror_address,
            "lifetime": lifetime,
        }
        await self._call({"op": "create_route", "database": database, "route": route})

    async def alter_route(self, database: str, name: str, **changes: Any) -> None:
        """ALTER ROUTE: change only the given fields (``address=``, ``mirror_address=None`` ...)."""
        route = {k: str(v) if isinstance(v, uuid.UUID) else v for k, v in changes.items()}
        await self._call({"op": "alter_route", "database": database, "name": name, "route": route})

    async def drop_route(self, database: str, name: str) -> None:
        """DROP ROUTE."""
        await self._call({"op": "drop_route", "database": database, "name": name})

    async def explain(
        self,
        service: str,
        *,
        database: str | None = None,
        broker_instance: uuid.UUID | str | None = None,
        from_outside: bool = False,
    ) -> dict[str, Any]:
        """Which route a new conversation to ``service`` takes now, with every step's reason."""
        meta, _ = await self._call(
            {
                "op": "explain",
                "database": database,
                "service": service,
                "broker_instance": str(broker_instance) if broker_instance else None,
                "from_outside": from_outside,
            }
        )
        return meta

    async def set_mirror_role(self, database: str, role: str) -> None:
        """Failover: make this partner of a mirrored database ``principal`` or ``mirror``."""
        await self._call({"op": "set_mirror_role", "database": database, "role": role})

    async def view(self, name: str) -> list[dict[str, Any]]:
        meta, body = await self._call({"op": "view", "name": name})
        if "rows" in meta:  # a daemon that sends rows in the meta
            rows: list[dict[str, Any]] = meta["rows"]
            return rows
        try:
            decoded = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ClientError(f"view {name!r}: the rows are not valid JSON ({exc})") from None
        if not isinstance(decoded, list) or len(decoded) != meta.get("rows_in_body"):
            raise ClientError(f"view {name!r}: expected {meta.get('rows_in_body')} rows")
        return decoded

    async def conversation_endpoints(self) -> list[dict[str, Any]]:
        """``sys.conversation_endpoints``: per endpoint its handle, conversation id,
        ``conversation_group_id``, role, services, contract, ``state`` (SPEC §5),
        ``lifetime`` and ``dialog_timer`` (ISO 8601 UTC, empty if none), sequence numbers
        and unacknowledged messages."""
        return await self.view("conversation_endpoints")

    async def transmission_queue(self) -> list[dict[str, Any]]:
        """``sys.transmission_queue``: per message sent and not yet acknowledged, its
        conversation, sequence number, type, ``is_conversation_error``,
        ``is_end_of_dialog``, size, attempts and ``transmission_status``."""
        return await self.view("transmission_queue")

    async def queues(self) -> list[dict[str, Any]]:
        return await self.view("queues")

    async def routes(self) -> list[dict[str, Any]]:
        return await self.view("routes")

    async def broker_connections(self) -> list[dict[str, Any]]:
        return await self.view("broker_connections")

    async def ping(self) -> dict[str, Any]:
        meta, _ = await self._call({"op": "ping"})
        return meta
