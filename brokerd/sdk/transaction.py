"""A client transaction as the application holds it (``BrokerClient.transaction()``).

Every verb names the transaction; the daemon applies them at COMMIT, together
or not at all, and holds the conversation groups RECEIVE took until then
(``brokerd.dialogs.verbs.transactions`` on the daemon's side). SEND inside a
transaction does not wait for a disk write: COMMIT is the one durability point,
and :attr:`Transaction.sequence_numbers` lists the SENDs' sequence numbers after it.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from brokerd.sdk.messages import ReceivedMessage, parse_received
from brokerd.sdk.requests import (
    begin_dialog_request,
    end_conversation_request,
    move_request,
    receive_request,
    rollback_request,
    send_many_request,
    send_request,
    timer_request,
)

Call = Callable[[dict[str, Any], bytes], Awaitable[tuple[dict[str, Any], bytes]]]


class Transaction:
    def __init__(self, call: Call, tx_id: int) -> None:
        self._call = call
        self.id = tx_id
        self.finished = False
        self.sequence_numbers: list[int] = []

    async def _request(
        self, meta: dict[str, Any], body: bytes = b""
    ) -> tuple[dict[str, Any], bytes]:
        return await self._call({**meta, "transaction": self.id}, body)

    async def receive(
        self,
        queue: str,
        *,
        database: str | None = None,
        top: int = 1,
        timeout: float = 0.0,
        conversation_handle: uuid.UUID | None = None,
    ) -> list[ReceivedMessage]:
        """RECEIVE; the messages leave the queue only if the transaction commits."""
        meta, body = await self._request(
            *receive_request(queue, database, top, timeout, conversation_handle)
        )
        return parse_received(meta, body)

    async def send(
        self, conversation_handle: uuid.UUID, message_type: str = "DEFAULT", body: bytes = b""
    ) -> None:
        """SEND, checked now and queued at COMMIT."""
        await self._request(*send_request(conversation_handle, message_type, body))

    async def send_many(self, messages: list[tuple[uuid.UUID, str, bytes]]) -> None:
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
        related_conversation: uuid.UUID | None = None,
    ) -> uuid.UUID:
        """BEGIN DIALOG; the handle may be used in this transaction at once."""
        meta, _ = await self._request(
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

    async def end_conversation(
        self,
        conversation_handle: uuid.UUID,
        *,
        error_code: int | None = None,
        description: str = "",
        cleanup: bool = False,
    ) -> None:
        await self._request(
            *end_conversation_request(conversation_handle, error_code, description, cleanup)
        )

    async def begin_conversation_timer(
        self, conversation_handle: uuid.UUID, timeout: float
    ) -> None:
        await self._request(*timer_request(conversation_handle, timeout))

    async def move_conversation(
        self, conversation_handle: uuid.UUID, conversation_group_id: uuid.UUID
    ) -> None:
        await self._request(*move_request(conversation_handle, conversation_group_id))

    async def commit(self) -> list[int]:
        """COMMIT: everything at once; raises TransactionRolledBack if nothing took effect."""
        self.finished = True
        meta, _ = await self._call({"op": "commit", "transaction": self.id}, b"")
        self.sequence_numbers = [int(s) for s in meta.get("sequence_numbers") or []]
        return self.sequence_numbers

    async def rollback(self, reason: str = "") -> None:
        """ROLLBACK: received messages go back to their queue, in order. Each counts one
        rollback for poison-message handling, and ``reason`` (say, the error that made the
        application give up) is kept as its last error (SPEC §6)."""
        self.finished = True
        await self._call(*rollback_request(self.id, reason))
