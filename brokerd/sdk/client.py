"""The application SDK: Service Broker verbs over the daemon's client listener (SPEC §6).

Imports only ``protocol/``; it never touches the daemon's internals. A
:class:`BrokerClient` holds the verbs; its connection, kept across the daemon's
restarts, is a :class:`~brokerd.sdk.keeper.ConnectionKeeper` (reconnect with backoff,
and an outcome for every request: SPEC §6, outcomes). Calls may run concurrently on
it: answers are paired with requests by id, as aiokafka does.

    async with BrokerClient.connect("127.0.0.1", 4023, token_file=...) as client:
        dialog = await client.begin_dialog("//shop/Client", "//warehouse/Orders",
                                           "//shop/OrderContract")
        await dialog.send("//shop/Order", b"<order/>", key="order-17")
        for message in await client.receive("ClientQueue", timeout=5):
            ...
        await dialog.end()

Three receive loops (SPEC §6, R-DLG-1): :meth:`BrokerClient.messages`, **at most
once** (autocommit RECEIVEs); :meth:`BrokerClient.consume`, **exactly once** for what
its handler does through the batch's client transaction; :meth:`BrokerClient.serve`,
that loop with activation (``brokerd.sdk.loops`` and ``brokerd.sdk.activation`` say
how each works).

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
import ssl
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Mapping,
    Sequence,
)
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from brokerd.sdk.activation import Activation, Handler, ReaderPolicy
from brokerd.sdk.connection import (
    Address,
    Request,
    SequenceReply,
    abandon,
    disown,
    end_unowned_dialog,
    error_of,
)
from brokerd.sdk.dialog import Dialog, Handle, handle_of
from brokerd.sdk.keeper import ConnectionKeeper, Reconnect
from brokerd.sdk.loops import ReceiveLoops
from brokerd.sdk.messages import KeptMessages, ReceivedMessage, parse_group, parse_received
from brokerd.sdk.requests import (
    begin_dialog_key,
    begin_dialog_request,
    end_conversation_request,
    end_quarantined_request,
    get_group_request,
    move_request,
    receive_request,
    release_quarantine_request,
    send_many_request,
    send_meta,
    timer_request,
    view_request,
)
from brokerd.sdk.tls import client_context
from brokerd.sdk.transaction import Transaction, begin, ending
from brokerd.sdk.views import (
    BrokerConnection,
    ConversationEndpoint,
    EndpointAge,
    OldestWaiting,
    QuarantinedConversation,
    QueueInfo,
    QueueMessage,
    RouteInfo,
    TransmissionQueueEntry,
    typed,
)
from protocol.client_wire import ClientFrame, ClientFrameKind, encode_meta
from protocol.errors import AuthenticationFailed, ClientError

DEFAULT_PORT = 4023

__all__ = [
    "DEFAULT_PORT",
    "Activation",
    "BrokerClient",
    "Dialog",
    "ReceivedMessage",
    "Reconnect",
    "Transaction",
]


class Connecting:
    """What :meth:`BrokerClient.connect` returns: await it for the client, or use it
    with ``async with`` (the client is closed when the block ends)."""

    def __init__(self, opening: Coroutine[Any, Any, BrokerClient]) -> None:
        self._opening = opening
        self._client: BrokerClient | None = None

    def __await__(self) -> Generator[Any, None, BrokerClient]:
        return self._opening.__await__()

    async def __aenter__(self) -> BrokerClient:
        self._client = await self._opening
        return self._client

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._client is not None:
            await self._client.close()


_READS = frozenset({"view", "ping", "explain"})
"""Requests that change nothing: safe to send again when their outcome is unknown."""
_WAITING = frozenset({"receive", "get_conversation_group"})
"""Requests that may wait for messages: a caller that stops waiting takes them back
(``withdraw``) rather than leave them to take a message for nobody."""


class BrokerClient:
    """The Service Broker verbs on one daemon, over a connection kept across the
    daemon's restarts (:class:`~brokerd.sdk.keeper.ConnectionKeeper`)."""

    def __init__(self, keeper: ConnectionKeeper) -> None:
        self._keeper = keeper
        self._kept = KeptMessages()
        self._loops = ReceiveLoops(self, keeper)
        self.instance: str = ""
        """The daemon's broker instance id."""
        self.role: str = ""
        """``admin`` or ``application``: what the token this client logged in with may do."""

    @classmethod
    def connect(
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
        reconnect: Reconnect | bool = True,
    ) -> Connecting:
        """Connect (over TLS with ``ssl_context`` or ``tls_ca_file``) and log in with the
        token ``user`` selects. The first connection's failure is raised.

        ``reconnect``: after a lost connection, connect again with backoff (a
        :class:`Reconnect` tunes it; False: never, every later request fails with
        ``NotConnected``). Use as ``async with await BrokerClient.connect(...)`` or
        ``async with BrokerClient.connect(...)``."""
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
        address = Address(host, port, secret, user, timeout, ssl_context, server_hostname)
        policy = Reconnect() if reconnect is True else (reconnect or None)
        return Connecting(cls._open(ConnectionKeeper(address, policy)))

    @classmethod
    async def _open(cls, keeper: ConnectionKeeper) -> BrokerClient:
        connection = await keeper.open()
        client = cls(keeper)
        client.instance = connection.instance
        client.role = connection.role
        return client

    @property
    def tls_version(self) -> str | None:
        """The TLS version of the connection (``TLSv1.3``), None if it is plain TCP."""
        connection = self._keeper.connection
        return None if connection is None else connection.tls_version

    @property
    def connected(self) -> bool:
        """A connection is up now (False while reconnecting)."""
        return self._keeper.connected

    @property
    def reconnects(self) -> int:
        """How many times the connection was made again after being lost."""
        return self._keeper.reconnects

    @property
    def closed(self) -> bool:
        """:meth:`close` was called."""
        return self._keeper.closed

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Until a connection is up; TimeoutError after ``timeout`` s."""
        await self._keeper.wait_connected(timeout)

    async def __aenter__(self) -> BrokerClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection and stop reconnecting: calls in flight fail with their
        outcome (OutcomeUnknown, a ClientError), calls waiting for a connection with
        NotConnected. Idempotent."""
        self._keeper.close()

    # -- requests ------------------------------------------------------------------------

    def _submit(self, request: Request) -> None:
        self._keeper.submit(request)

    async def _call(
        self,
        meta: dict[str, Any],
        body: bytes = b"",
        *,
        bound_to: int | None = None,
        repeatable: bool = False,
        abandoned: Callable[[ClientFrame | None], None] | None = None,
        disowned: Callable[[ClientFrame], None] | None = None,
    ) -> tuple[dict[str, Any], bytes | bytearray]:
        """One request and its answer (the typed error the daemon reports is raised).
        ``bound_to``: the connection a transaction's request must go on; ``repeatable``:
        safe to write again on a new connection when its outcome is unknown.

        A RECEIVE or GET CONVERSATION GROUP whose caller is cancelled while it waits is
        withdrawn: the daemon ends it empty if it has taken nothing yet. If it had, its
        answer, when it comes, goes to ``abandoned`` (R-DLG-1: a message taken for a
        caller that is gone is not dropped). Another request whose caller is cancelled
        after it was written hands its answer to ``disowned``, to undo what it made."""
        future: asyncio.Future[ClientFrame] = asyncio.get_running_loop().create_future()
        op = meta.get("op")
        request = Request(
            encode_meta(meta),
            body,
            future,
            repeatable=repeatable or op in _READS,
            bound_to=bound_to,
            commits=op == "commit",
        )
        self._submit(request)
        if op in _WAITING or disowned is not None:
            try:
                frame = await asyncio.shield(future)
            except asyncio.CancelledError:
                if disowned is not None:
                    disown(request, future, disowned)
                else:
                    abandon(request, future, abandoned)
                raise
        else:
            frame = await future
        if frame.kind is ClientFrameKind.ERROR:
            raise error_of(frame)
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
        related_conversation: Handle | None = None,
        related_conversation_group: uuid.UUID | None = None,
        key: str | None = None,
    ) -> Dialog:
        """BEGIN DIALOG FROM SERVICE ... TO SERVICE ... ON CONTRACT ... (SPEC §6): the new
        conversation, as a :class:`Dialog` (its handle, ``dialog.handle``, and its verbs).
        ``database`` names the initiating service's database when several have it;
        ``to_broker_instance`` picks the target's broker instance (R-ROUTE-4);
        ``lifetime`` in seconds (0: none). The new conversation joins the group of
        ``related_conversation`` (RELATED_CONVERSATION) or the group
        ``related_conversation_group`` (RELATED_CONVERSATION_GROUP; made if none exists),
        not both (``InvalidRequest``); a new group without either. Cancelled once written,
        its conversation, no one's, is ended WITH CLEANUP (nothing sent: no one is told),
        unless it carries the caller's ``key``, which names it to every later call with
        that key.

        Each call carries an idempotency key, a fresh one unless ``key`` (1 to 200
        characters, unique per initiating service) is given: one whose connection is lost
        before its answer is written again on the next connection and begins one dialog;
        the same key used again within ``limits.send_key_window`` names the dialog it
        began (``KeyReused`` with other arguments)."""
        own_key = key is not None
        key = begin_dialog_key(key, self._keeper.features)
        meta, _ = await self._call(
            *begin_dialog_request(
                from_service,
                to_service,
                contract,
                database,
                to_broker_instance,
                lifetime,
                related_conversation,
                related_conversation_group,
                key,
            ),
            repeatable=key is not None,
            # the caller's own key names the dialog to every later call with that key (its
            # retry, say): only one no one else can name is ended when no one waits for it
            disowned=None if own_key else lambda frame: end_unowned_dialog(self._submit, frame),
        )
        handle = uuid.UUID(meta["conversation_handle"])
        return Dialog(self, handle, from_service, to_service, contract)

    async def send(
        self,
        conversation_handle: Handle,
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
        conversation_handle: Handle,
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
        meta = send_meta(conversation_handle, message_type, key)
        self._submit(Request(meta, bytes(body), SequenceReply(future), repeatable=key is not None))
        return future

    async def drain(self) -> None:
        """Until what this client has written is taken by the socket (down to its buffer's
        low-water mark): a producer calling :meth:`send_nowait` in a loop awaits it every
        so often, so that its memory stays bounded by what the kernel and the daemon hold
        (the daemon stops reading a client whose SENDs awaiting their commit carry more
        than ``limits.client_pending_mb``). Raises NotConnected when no connection will
        come."""
        await self._keeper.drain()

    async def receive(
        self,
        queue: str,
        *,
        database: str | None = None,
        top: int = 1,
        timeout: float = 0.0,
        conversation_handle: Handle | None = None,
        conversation_group_id: uuid.UUID | None = None,
        groups: int = 1,
    ) -> list[ReceivedMessage]:
        """RECEIVE TOP (top) FROM queue, WAITFOR up to ``timeout`` s (negative: forever).

        SPEC §6: the messages of one conversation group, in order; ``conversation_handle``
        limits it to one conversation, ``conversation_group_id`` to one group (WHERE
        conversation_group_id = ...), not both (``InvalidRequest``). ``groups`` (at most
        1,024, and only without either limit) returns the messages of up to that many
        groups, ``top`` in all, group after group (``brokerd.sdk.messages.by_group`` splits
        them).

        Cancelled while it waits (``asyncio.wait_for``, a task cancelled), it is taken back
        from the daemon, which ends it with nothing if it had taken nothing; messages it
        had taken by then come first from the next RECEIVE of the same queue."""
        handle = None if conversation_handle is None else handle_of(conversation_handle)
        kept = self._kept.take(queue, database, top, handle, conversation_group_id, groups)
        if kept:
            return kept

        def keep(frame: ClientFrame | None) -> None:
            if frame is not None:
                self._kept.add(queue, database, parse_received(frame.meta, frame.body))

        meta, body = await self._call(
            *receive_request(
                queue, database, top, timeout, conversation_handle, conversation_group_id, groups
            ),
            abandoned=keep,
        )
        messages = parse_received(meta, body)
        if type(body) is bytearray:  # each message has its own copy: nothing refers to it
            self._keeper.reuse(body)
        if self._kept.holds(queue, database):
            # a cancelled RECEIVE's messages came back while this one waited: they are
            # older than these (their group's lock ended with their removal), so first
            self._kept.add(queue, database, messages)
            return self._kept.take(queue, database, top, handle, conversation_group_id, groups)
        return messages

    async def get_conversation_group(
        self, queue: str, *, database: str | None = None, timeout: float = 0.0
    ) -> uuid.UUID | None:
        """GET CONVERSATION GROUP FROM queue, WAITFOR up to ``timeout`` s (0: do not wait,
        negative: forever): the id of the next conversation group with messages ready
        that no transaction holds, or None when none came in time (SPEC §6). Outside a
        transaction nothing stays locked (SQL Server's autocommit): another reader may
        take the group at once; :meth:`Transaction.get_conversation_group` locks it."""
        meta, _ = await self._call(*get_group_request(queue, database, timeout))
        return parse_group(meta)

    async def end_conversation(
        self,
        conversation_handle: Handle,
        *,
        error_code: int | None = None,
        description: str = "",
        cleanup: bool = False,
    ) -> None:
        """END CONVERSATION [WITH ERROR = code DESCRIPTION = ... | WITH CLEANUP]."""
        await self._call(
            *end_conversation_request(conversation_handle, error_code, description, cleanup)
        )

    async def begin_conversation_timer(self, conversation_handle: Handle, timeout: float) -> None:
        """BEGIN CONVERSATION TIMER (handle) TIMEOUT = seconds (R-DLG-11): a DialogTimer
        message arrives in this side's queue when it fires; a new timer replaces the old."""
        await self._call(*timer_request(conversation_handle, timeout))

    async def send_many(
        self,
        messages: Sequence[tuple[Handle, str, bytes]],
        keys: list[str | None] | None = None,
    ) -> list[int]:
        """SEND several (handle, message type, body) in one request and one commit per
        database: a producer's batched path without a transaction. One refusal
        refuses them all; the sequence numbers come back in order. ``keys``: each
        message's idempotency key (or None), as :meth:`send`'s."""
        repeatable = keys is not None and all(key is not None for key in keys)
        meta, _ = await self._call(*send_many_request(messages, keys), repeatable=repeatable)
        return [int(s) for s in meta["sequence_numbers"]]

    async def move_conversation(
        self, conversation_handle: Handle, conversation_group_id: uuid.UUID
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
        return typed(QuarantinedConversation, "quarantined", await self.view("quarantined"))

    async def begin_transaction(self) -> Transaction:
        """BEGIN TRANSACTION; prefer ``async with client.transaction() as tx``. Cancelled
        once written, the transaction it began is rolled back (``transaction.begin``)."""
        return await begin(self._submit, self._call, lambda: self._keeper.generation)

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
        async with ending(await self.begin_transaction()) as tx:
            yield tx

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
        ``top`` (each waiting up to ``timeout`` s), until ``stop`` is set; with the daemon
        away, at once (the RECEIVE waiting for a connection is given up, never written).

        **At most once**: a message is removed from the queue when it is received, so
        one the application had not finished with when it died is lost. Use
        :meth:`consume` for exactly once.
        """
        loop = self._loops.messages(queue, database=database, top=top, timeout=timeout, stop=stop)
        async with contextlib.aclosing(loop):
            async for message in loop:
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
        messages were committed, once ``stop`` is set (with the daemon away, at once: the
        next batch's BEGIN TRANSACTION waiting for a connection is given up) or after
        ``batches`` batches.

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
        return await self._loops.consume(
            queue,
            handler,
            database=database,
            top=top,
            timeout=timeout,
            stop=stop,
            batches=batches,
        )

    def serve(
        self,
        queue: str,
        handler: Handler,
        *,
        max_readers: int = 1,
        database: str | None = None,
        top: int = 100,
        timeout: float = 1.0,
        interval: float = 1.0,
        idle_receives: int = 3,
        until_idle: bool = False,
        stop: asyncio.Event | None = None,
    ) -> Activation:
        """Internal activation (SPEC §6): readers of ``queue``, each handling one batch at
        a time in its own client transaction (RECEIVE up to ``top`` messages of one
        conversation group, ``await handler(tx, messages)``, COMMIT; ROLLBACK if it
        raises, logged, and the reader goes on). A reader is added, one per ``interval``
        s and up to ``max_readers`` (at most 16), while the oldest message of the
        batches waits longer than it did the interval before and no RECEIVE came back
        empty; a reader whose RECEIVE (waiting ``timeout`` s) came back empty
        ``idle_receives`` times in a row goes away, down to one (to none with
        ``until_idle``, which then ends the activation). Goes on across lost
        connections and daemon restarts.

        Returns the :class:`Activation` (its ``readers``, ``handled``, ``failures``);
        await it to run it until ``stop`` is set: ``await client.serve(...)``."""
        policy = ReaderPolicy(
            max_readers=max_readers,
            top=top,
            timeout=timeout,
            interval=interval,
            idle_receives=idle_receives,
            until_idle=until_idle,
        )
        return Activation(self, queue, handler, policy, database=database, stop=stop)

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

    async def view_page(
        self,
        name: str,
        after: str | None = None,
        limit: int | None = None,
        params: Mapping[str, str] | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of the admin view ``name``: its rows after the cursor ``after`` (None:
        from the start), at most ``limit`` (the daemon's default, 500, if None), and the
        cursor of the next page (None after the last). Cursors are keys, not offsets: a
        row that stays in the view is seen once, in order, whatever changes meanwhile."""
        meta, body = await self._call(*view_request(name, after, limit, params))
        if "rows" in meta:  # a daemon that sends rows in the meta, unpaged
            rows: list[dict[str, Any]] = meta["rows"]
            return rows, None
        try:
            decoded = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ClientError(f"view {name!r}: the rows are not valid JSON ({exc})") from None
        if not isinstance(decoded, list) or len(decoded) != meta.get("rows_in_body"):
            raise ClientError(f"view {name!r}: expected {meta.get('rows_in_body')} rows")
        cursor = meta.get("next")
        return decoded, cursor if isinstance(cursor, str) and cursor else None

    async def view_rows(
        self, name: str, page_size: int | None = None, params: Mapping[str, str] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Every row of the admin view ``name``, page after page (``page_size`` rows each;
        ``params`` are the view's own, ``queue`` for ``queue_messages``)."""
        after: str | None = None
        while True:
            rows, after = await self.view_page(name, after, page_size, params)
            for row in rows:
                yield row
            if after is None:
                return

    async def view(self, name: str, **params: str) -> list[dict[str, Any]]:
        """Every row of the daemon's view ``name`` (``conversation_endpoints``,
        ``transmission_queue``, ``queue_messages``, ``queues``, ``routes``,
        ``broker_connections``, ``endpoint_ages``, ``oldest_waiting``, ``mirroring``,
        ``stats`` ...), as dictionaries, read page after page (:meth:`view_rows`);
        admin tokens only."""
        return [row async for row in self.view_rows(name, params=params)]

    async def queue_messages(self, queue: str) -> list[QueueMessage]:
        """A queue's rows (in every database that has a queue of that name) with their
        ``status`` (0 received and retained, 1 ready, 2 not yet complete, 3 sent and
        retained; R-OBJ-3), conversation, sequence number, type and size."""
        return typed(QueueMessage, "queue_messages", await self.view("queue_messages", queue=queue))

    async def endpoint_ages(self) -> list[EndpointAge]:
        """How many endpoints per database, state and age bucket: leaks show here."""
        return typed(EndpointAge, "endpoint_ages", await self.view("endpoint_ages"))

    async def oldest_waiting(self) -> list[OldestWaiting]:
        """Per conversation, its oldest message waiting to be received or acknowledged,
        oldest first."""
        return typed(OldestWaiting, "oldest_waiting", await self.view("oldest_waiting"))

    async def conversation_endpoints(self) -> list[ConversationEndpoint]:
        """``sys.conversation_endpoints``: per endpoint its handle, conversation id,
        ``conversation_group_id``, role, services, contract, ``state`` (SPEC §5),
        ``lifetime`` and ``dialog_timer`` (None if none), sequence numbers and
        unacknowledged messages."""
        rows = await self.view("conversation_endpoints")
        return typed(ConversationEndpoint, "conversation_endpoints", rows)

    async def transmission_queue(self) -> list[TransmissionQueueEntry]:
        """``sys.transmission_queue``: per message sent and not yet acknowledged, its
        conversation, sequence number, type, ``is_conversation_error``,
        ``is_end_of_dialog``, size, attempts and ``transmission_status``."""
        rows = await self.view("transmission_queue")
        return typed(TransmissionQueueEntry, "transmission_queue", rows)

    async def queues(self) -> list[QueueInfo]:
        """Every queue: its database, status (R-DLG-12), retention, messages ready,
        readers and poison-message handling."""
        return typed(QueueInfo, "queues", await self.view("queues"))

    async def routes(self) -> list[RouteInfo]:
        """``sys.routes`` of every database: name, service, broker instance, address,
        mirror address and lifetime (R-OBJ-5)."""
        return typed(RouteInfo, "routes", await self.view("routes"))

    async def broker_connections(self) -> list[BrokerConnection]:
        """The adjacent-broker connections: peer, direction, state and traffic."""
        return typed(BrokerConnection, "broker_connections", await self.view("broker_connections"))

    async def ping(self) -> dict[str, Any]:
        """A round trip to the daemon; its answer names the broker instance."""
        meta, _ = await self._call({"op": "ping"})
        return meta
