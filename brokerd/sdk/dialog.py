"""A dialog as the application holds it: what ``BrokerClient.begin_dialog`` returns.

    dialog = await client.begin_dialog("//shop/Client", "//warehouse/Orders", CONTRACT)
    await dialog.send("//shop/Order", b"<order/>", key="order-17")
    replies = await dialog.receive("ClientQueue", timeout=5)
    await dialog.end()

A :class:`Dialog` stands for its conversation handle: it compares and hashes as the
handle (``dialog == message.conversation_handle``), prints as it, and every verb of
the client that takes a handle takes a dialog too.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Protocol

from brokerd.sdk.messages import ReceivedMessage


class DialogVerbs(Protocol):
    """What a dialog asks of its client (``BrokerClient`` has these verbs)."""

    async def send(
        self,
        conversation_handle: uuid.UUID,
        message_type: str = ...,
        body: bytes = ...,
        *,
        key: str | None = ...,
    ) -> int: ...

    def send_nowait(
        self,
        conversation_handle: uuid.UUID,
        message_type: str = ...,
        body: bytes = ...,
        *,
        key: str | None = ...,
    ) -> asyncio.Future[int]: ...

    async def receive(
        self,
        queue: str,
        *,
        database: str | None = ...,
        top: int = ...,
        timeout: float = ...,
        conversation_handle: uuid.UUID | None = ...,
    ) -> list[ReceivedMessage]: ...

    async def end_conversation(
        self,
        conversation_handle: uuid.UUID,
        *,
        error_code: int | None = ...,
        description: str = ...,
        cleanup: bool = ...,
    ) -> None: ...

    async def begin_conversation_timer(
        self, conversation_handle: uuid.UUID, timeout: float
    ) -> None: ...

    async def move_conversation(
        self, conversation_handle: uuid.UUID, conversation_group_id: uuid.UUID
    ) -> None: ...


class Dialog:
    """One conversation endpoint begun by this client: its handle and its verbs."""

    __slots__ = ("_client", "contract", "from_service", "handle", "to_service")

    def __init__(
        self,
        client: DialogVerbs,
        handle: uuid.UUID,
        from_service: str,
        to_service: str,
        contract: str,
    ) -> None:
        self._client = client
        self.handle = handle
        self.from_service = from_service
        self.to_service = to_service
        self.contract = contract

    def __repr__(self) -> str:
        return f"Dialog({self.handle}, {self.from_service!r} -> {self.to_service!r})"

    def __str__(self) -> str:
        return str(self.handle)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Dialog):
            return self.handle == other.handle
        if isinstance(other, uuid.UUID):
            return self.handle == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.handle)

    async def send(
        self, message_type: str = "DEFAULT", body: bytes = b"", *, key: str | None = None
    ) -> int:
        """SEND ON CONVERSATION (``BrokerClient.send``): the sequence number, once the
        message is durably queued. ``key``: an idempotency key."""
        return await self._client.send(self.handle, message_type, body, key=key)

    def send_nowait(
        self, message_type: str = "DEFAULT", body: bytes = b"", *, key: str | None = None
    ) -> asyncio.Future[int]:
        """SEND without waiting (``BrokerClient.send_nowait``)."""
        return self._client.send_nowait(self.handle, message_type, body, key=key)

    async def receive(
        self, queue: str, *, top: int = 1, timeout: float = 0.0, database: str | None = None
    ) -> list[ReceivedMessage]:
        """RECEIVE of this conversation's messages only, from ``queue`` (this side's
        service's queue), waiting up to ``timeout`` s (negative: forever)."""
        return await self._client.receive(
            queue, database=database, top=top, timeout=timeout, conversation_handle=self.handle
        )

    async def end(
        self, *, error_code: int | None = None, description: str = "", cleanup: bool = False
    ) -> None:
        """END CONVERSATION [WITH ERROR | WITH CLEANUP] (R-DLG-10)."""
        await self._client.end_conversation(
            self.handle, error_code=error_code, description=description, cleanup=cleanup
        )

    async def begin_timer(self, timeout: float) -> None:
        """BEGIN CONVERSATION TIMER (R-DLG-11)."""
        await self._client.begin_conversation_timer(self.handle, timeout)

    async def move_to(self, conversation_group_id: uuid.UUID) -> None:
        """MOVE CONVERSATION to another conversation group."""
        await self._client.move_conversation(self.handle, conversation_group_id)


Handle = uuid.UUID | Dialog
"""A conversation handle, or the dialog that stands for it."""


def handle_of(handle: Handle) -> uuid.UUID:
    """The UUID of a handle given either way."""
    return handle.handle if isinstance(handle, Dialog) else handle
