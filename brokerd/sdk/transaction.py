"""A client transaction as the application holds it (``BrokerClient.transaction()``).

Every verb names the transaction; the daemon applies them at COMMIT, together
or not at all, and holds the conversation groups RECEIVE took until then
(``brokerd.dialogs.verbs.transactions`` on the daemon's side). SEND inside a
transaction does not wait for a disk write: COMMIT is the one durability point,
and :attr:`Transaction.sequence_numbers` lists the SENDs' sequence numbers after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

from brokerd.sdk.connection import Request, error_of, roll_back_unowned
from brokerd.sdk.dialog import Handle
from brokerd.sdk.messages import ReceivedMessage, parse_group, parse_received
from brokerd.sdk.requests import (
    begin_dialog_request,
    end_conversation_request,
    get_group_request,
    move_request,
    receive_request,
    rollback_request,
    send_many_request,
    send_request,
    timer_request,
)
from protocol.client_wire import ClientFrame, ClientFrameKind, encode_meta
from protocol.errors import ClientError, TransactionLost, TransactionRolledBack


class Call(Protocol):
    """How a transaction's requests reach the daemon: on the connection it began on."""

    async def __call__(
        self,
        meta: dict[str, Any],
        body: bytes = b"",
        *,
        bound_to: int | None = None,
        abandoned: Callable[[ClientFrame | None], None] | None = None,
    ) -> tuple[dict[str, Any], bytes | bytearray]: ...


class Transaction:
    """A client transaction, bound to the connection it began on: if that connection is
    lost the daemon rolls it back, and every later call fails with ``TransactionLost``."""

    def __init__(self, call: Call, tx_id: int, connection: int) -> None:
        self._call = call
        self.id = tx_id
        self.connection = connection
        """The number of the connection it lives on."""
        self.finished = False
        self.committed = False
        """Its COMMIT was answered: everything took effect."""
        self.sequence_numbers: list[int] = []
        self.spoiled = False
        """A RECEIVE of it was cancelled after it had taken messages, which no caller
        has: :meth:`commit` rolls back instead, so that they return to their queue."""
        self._unsettled: list[asyncio.Future[None]] = []
        """The answers of its cancelled RECEIVEs, which :meth:`commit` waits for."""

    async def _request(
        self,
        meta: dict[str, Any],
        body: bytes = b"",
        abandoned: Callable[[ClientFrame | None], None] | None = None,
    ) -> tuple[dict[str, Any], bytes | bytearray]:
        return await self._call(
            {**meta, "transaction": self.id}, body, bound_to=self.connection, abandoned=abandoned
        )

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
        """RECEIVE; the messages leave the queue only if the transaction commits, and
        their conversation group stays locked until then (SPEC §6).

        ``conversation_handle`` limits it to one conversation, ``conversation_group_id``
        to one group (not both): a group another transaction holds is not taken, the
        RECEIVE waits per ``timeout`` as if the queue were empty. ``groups``: up to that
        many groups, each locked until the transaction ends (see
        :meth:`BrokerClient.receive`). Cancelled while it waits, it is taken back; if it had
        taken messages by then, the transaction can only roll back (:meth:`commit`)."""
        settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def spoil(frame: ClientFrame | None) -> None:
            if frame is not None and parse_received(frame.meta, frame.body):
                self.spoiled = True
            if not settled.done():
                settled.set_result(None)

        try:
            meta, body = await self._request(
                *receive_request(
                    queue,
                    database,
                    top,
                    timeout,
                    conversation_handle,
                    conversation_group_id,
                    groups,
                ),
                abandoned=spoil,
            )
        except asyncio.CancelledError:
            self._unsettled.append(settled)
            raise
        return parse_received(meta, body)

    async def get_conversation_group(
        self, queue: str, *, database: str | None = None, timeout: float = 0.0
    ) -> uuid.UUID | None:
        """GET CONVERSATION GROUP FROM queue (SPEC §6): the id of the next conversation
        group with messages ready that no other transaction holds, locked by this one
        until COMMIT or ROLLBACK; other readers skip it and never wait behind it. Waits
        up to ``timeout`` s (0: do not wait, negative: forever); None when none came.
        Receive its messages with ``receive(queue, conversation_group_id=group)``."""
        meta, _ = await self._request(*get_group_request(queue, database, timeout))
        return parse_group(meta)

    async def send(
        self, conversation_handle: Handle, message_type: str = "DEFAULT", body: bytes = b""
    ) -> None:
        """SEND, checked now and queued at COMMIT."""
        await self._request(*send_request(conversation_handle, message_type, body))

    async def send_many(self, messages: Sequence[tuple[Handle, str, bytes]]) -> None:
        """Several SENDs in one request, queued at COMMIT."""
        await self._request(*send_many_request(messages))

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
    ) -> uuid.UUID:
        """BEGIN DIALOG; the handle may be used in this transaction at once. Its group:
        ``related_conversation``'s or ``related_conversation_group`` (made if none
        exists), as ``BrokerClient.begin_dialog`` (SPEC §6)."""
        meta, _ = await self._request(
            *begin_dialog_request(
                from_service,
                to_service,
                contract,
                database,
                to_broker_instance,
                lifetime,
                related_conversation,
                related_conversation_group,
            )
        )
        return uuid.UUID(meta["conversation_handle"])

    async def end_conversation(
        self,
        conversation_handle: Handle,
        *,
        error_code: int | None = None,
        description: str = "",
        cleanup: bool = False,
    ) -> None:
        """END CONVERSATION [WITH ERROR | WITH CLEANUP] at COMMIT (R-DLG-10)."""
        await self._request(
            *end_conversation_request(conversation_handle, error_code, description, cleanup)
        )

    async def begin_conversation_timer(self, conversation_handle: Handle, timeout: float) -> None:
        """BEGIN CONVERSATION TIMER at COMMIT (R-DLG-11)."""
        await self._request(*timer_request(conversation_handle, timeout))

    async def move_conversation(
        self, conversation_handle: Handle, conversation_group_id: uuid.UUID
    ) -> None:
        """MOVE CONVERSATION at COMMIT: its waiting messages move with it."""
        await self._request(*move_request(conversation_handle, conversation_group_id))

    async def commit(self) -> list[int]:
        """COMMIT: everything at once; raises TransactionRolledBack if nothing took effect
        (also when a RECEIVE of it was cancelled after taking messages: it rolls back)."""
        if self._unsettled:  # what they took, if anything, must be known first
            await asyncio.wait(self._unsettled)
        if self.spoiled:
            reason = "a RECEIVE of this transaction was cancelled after it had taken messages"
            await self.rollback(reason)
            raise TransactionRolledBack(f"{reason}: rolled back, they are in their queue again")
        self.finished = True
        meta, _ = await self._request({"op": "commit"})
        self.committed = True
        self.sequence_numbers = [int(s) for s in meta.get("sequence_numbers") or []]
        return self.sequence_numbers

    async def rollback(self, reason: str = "") -> None:
        """ROLLBACK: received messages go back to their queue, in order. Each counts one
        rollback for poison-message handling, and ``reason`` (say, the error that made the
        application give up) is kept as its last error (SPEC §6). A transaction whose
        connection was lost is rolled back already: nothing to do."""
        self.finished = True
        meta, body = rollback_request(self.id, reason)
        with contextlib.suppress(TransactionLost):
            await self._call(meta, body, bound_to=self.connection)


@contextlib.asynccontextmanager
async def ending(tx: Transaction) -> AsyncIterator[Transaction]:
    """``tx`` for a block: COMMIT when the block ends, unless it was ended in it;
    ROLLBACK, with the exception as its reason, if the block raises."""
    try:
        yield tx
    except BaseException as exc:
        if not tx.finished:
            with contextlib.suppress(ClientError):
                await tx.rollback(reason=f"{type(exc).__name__}: {exc}")
        raise
    if not tx.finished:
        await tx.commit()


async def begin(
    submit: Callable[[Request], None], call: Call, generation: Callable[[], int]
) -> Transaction:
    """BEGIN TRANSACTION: ``submit`` writes the request, ``call`` carries the new
    transaction's, ``generation()`` names the connection it lives on.

    Cancelled after it was written, the transaction it begins has no owner: it is rolled
    back when the daemon's answer comes, so that it holds none of the connection's open
    transactions (SPEC §6, at most 16); cancelled before, it is never written."""
    future: asyncio.Future[ClientFrame] = asyncio.get_running_loop().create_future()
    request = Request(encode_meta({"op": "begin_transaction"}), b"", future)
    submit(request)
    try:
        frame = await asyncio.shield(future)
    except asyncio.CancelledError:
        if request.connection is None:  # waiting for a connection: never written
            future.cancel()
        else:
            future.add_done_callback(functools.partial(roll_back_unowned, request))
        raise
    if frame.kind is ClientFrameKind.ERROR:
        raise error_of(frame)
    return Transaction(call, int(frame.meta["transaction"]), generation())
