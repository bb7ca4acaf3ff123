"""The SDK's receive loops (SPEC §6, R-DLG-1), and how a loop's ``stop`` ends a call
that waits for a connection.

* :meth:`ReceiveLoops.messages` (``BrokerClient.messages``) yields messages taken by
  autocommit RECEIVEs. A message leaves the queue before the application sees it, so
  one that the application had not finished with when it (or its host) died is gone:
  **at most once**.
* :meth:`ReceiveLoops.consume` (``BrokerClient.consume``) receives each batch inside a
  client transaction, hands it to the application's handler with that transaction, and
  commits when the handler returns: the messages leave the queue together with
  whatever the handler did through the transaction (SENDs, END CONVERSATION, ...), or
  not at all. If the handler raises, the transaction rolls back; if the client dies or
  loses its connection first, the daemon rolls it back. Either way the messages are
  receivable again, in order. This is the **exactly-once** loop for everything the
  handler does through the transaction; what it does elsewhere (a file, another
  system) may happen again for a batch received again, so make that idempotent.
* ``BrokerClient.serve`` is that loop with activation (:mod:`brokerd.sdk.activation`):
  readers added while messages wait longer, up to ``max_readers``, and released when
  idle.

Each goes on across lost connections and daemon restarts, and ends when its ``stop``
is set, without waiting for a connection to come back (:func:`unless_stopped`): with
the daemon away, its next request waits for one up to ``Reconnect.give_up_after``.

May import: ``protocol`` and the SDK's own modules (not ``client``: the client is
handed in as a :class:`Receiving`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Protocol, TypeVar

from brokerd.sdk.keeper import ConnectionKeeper
from brokerd.sdk.messages import ReceivedMessage
from brokerd.sdk.transaction import Transaction, ending
from protocol.errors import OutcomeUnknown, TransactionLost

T = TypeVar("T")


def _always() -> bool:
    return True


async def unless_stopped(
    call: Awaitable[T], stop: asyncio.Event | None, may_give_up: Callable[[], bool] = _always
) -> T | None:
    """What ``call`` returns (or raises), or None when ``stop`` is set first and
    ``may_give_up()`` then says the call may be given up: it is cancelled, and a request
    it made that still waits for a connection is never written (a BEGIN TRANSACTION
    written is rolled back when its answer comes, ``transaction.begin``). When
    ``may_give_up()`` says no, the call is awaited to its end."""
    if stop is None:
        return await call
    calling = asyncio.ensure_future(call)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((calling, stopping), return_when=asyncio.FIRST_COMPLETED)
        if calling.done() or not may_give_up():
            return await calling
    finally:
        stopping.cancel()
        if not calling.done():
            calling.add_done_callback(_settled)
            calling.cancel()
    return None


def _settled(calling: asyncio.Future[T]) -> None:
    """A call given up: whatever came of it is not anyone's error."""
    if not calling.cancelled():
        calling.exception()


class Receiving(Protocol):
    """What the receive loops need of the client: RECEIVE and transactions."""

    async def receive(
        self, queue: str, *, database: str | None = ..., top: int = ..., timeout: float = ...
    ) -> list[ReceivedMessage]: ...

    async def begin_transaction(self) -> Transaction: ...


class ReceiveLoops:
    """The loops of one client: its verbs, and its connection (whether it reconnects,
    whether one is up)."""

    def __init__(self, client: Receiving, keeper: ConnectionKeeper) -> None:
        self.client = client
        self.keeper = keeper

    async def messages(
        self,
        queue: str,
        *,
        database: str | None,
        top: int,
        timeout: float,
        stop: asyncio.Event | None,
    ) -> AsyncGenerator[ReceivedMessage, None]:
        """Autocommit RECEIVEs of ``queue`` until ``stop`` is set (``BrokerClient.messages``).
        A RECEIVE that waits for a connection when ``stop`` is set is given up, never
        written; one written goes on to its answer (its messages, if any, are taken from
        the queue already) and they are yielded."""
        while stop is None or not stop.is_set():
            receiving = self.client.receive(queue, database=database, top=top, timeout=timeout)
            try:
                received = await unless_stopped(receiving, stop, self._disconnected)
            except OutcomeUnknown:
                if self.keeper.reconnect is None:
                    raise
                continue  # the connection went with a RECEIVE: its messages may be lost
            if received is None:
                return
            for message in received:
                yield message

    def _disconnected(self) -> bool:
        """No connection is up: a RECEIVE made now waits for one, not yet written."""
        return not self.keeper.connected

    async def consume(
        self,
        queue: str,
        handler: Callable[[Transaction, list[ReceivedMessage]], Awaitable[None]],
        *,
        database: str | None,
        top: int,
        timeout: float,
        stop: asyncio.Event | None,
        batches: int | None,
    ) -> int:
        """Batches of ``queue``, each in a client transaction, until ``stop`` is set or
        after ``batches`` (``BrokerClient.consume``); how many messages were committed.
        A BEGIN TRANSACTION that waits for a connection when ``stop`` is set is given up."""
        done = 0
        handled = 0
        while (stop is None or not stop.is_set()) and (batches is None or handled < batches):
            try:
                tx = await unless_stopped(self.client.begin_transaction(), stop)
                if tx is None:
                    break
                async with ending(tx):
                    received = await tx.receive(queue, database=database, top=top, timeout=timeout)
                    if not received:
                        await tx.rollback()  # nothing held: no commit needed
                        continue
                    await handler(tx, received)
            except (TransactionLost, OutcomeUnknown):
                # the connection went: the batch was rolled back (or, for a COMMIT
                # written and not answered, perhaps committed): either way the next
                # batch is right, once reconnected
                if self.keeper.reconnect is None:
                    raise
                continue
            done += len(received)
            handled += 1
        return done
