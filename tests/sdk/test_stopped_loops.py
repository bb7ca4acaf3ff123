"""The receive loops end promptly when their ``stop`` is set, also while their daemon is
away and the loop waits for a connection (up to ``Reconnect.give_up_after``, a minute by
default), as ``serve``'s readers do (SPEC §6, activation: a stop ends them without
waiting for a connection to come back).

A real daemon runs in the test's process on 127.0.22.2, and stops gracefully under the
loop; the client keeps trying to reconnect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from brokerd.sdk.client import BrokerClient
from brokerd.sdk.messages import ReceivedMessage
from brokerd.sdk.transaction import Transaction
from brokerd.server.daemon import Broker
from tests.daemons import client_of, solo_broker

HOST = "127.0.22.2"


async def _until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not check():
            await asyncio.sleep(0.01)


def _receiving(broker: Broker) -> bool:
    """The daemon has read a request of its one client, not yet answered (a RECEIVE
    waits for messages)."""
    return any(session.unanswered for session in broker.client_sessions)


def _waiting_for_a_connection(client: BrokerClient) -> bool:
    """A request of the client waits for a connection (the daemon is away)."""
    return any(not item.request.reply.done() for item in client._keeper._waiting)


async def test_messages_ends_at_once_when_stopped_while_its_daemon_is_away(
    tmp_path: Path,
) -> None:
    """SPEC §6: ``messages`` whose RECEIVE waits for a connection ends within a moment of
    ``stop`` being set, not once ``give_up_after`` has passed; the RECEIVE it gave up
    never went out."""
    stop = asyncio.Event()
    async with solo_broker(tmp_path, HOST) as broker:
        client = await client_of(broker)

        async def read() -> list[ReceivedMessage]:
            return [m async for m in client.messages("Q2", timeout=0.2, stop=stop)]

        reading = asyncio.ensure_future(read())
        await _until(lambda: _receiving(broker))
    try:
        await _until(lambda: _waiting_for_a_connection(client))
        stop.set()
        assert await asyncio.wait_for(reading, 3) == []
        assert not _waiting_for_a_connection(client)
    finally:
        await client.close()


async def test_consume_ends_at_once_when_stopped_while_its_daemon_is_away(
    tmp_path: Path,
) -> None:
    """SPEC §6: ``consume`` whose next BEGIN TRANSACTION waits for a connection ends
    within a moment of ``stop`` being set, having committed nothing."""
    stop = asyncio.Event()

    async def handler(tx: Transaction, messages: list[ReceivedMessage]) -> None:
        raise AssertionError(f"no message was sent, yet {len(messages)} came")

    async with solo_broker(tmp_path, HOST) as broker:
        client = await client_of(broker)
        consuming = asyncio.ensure_future(client.consume("Q2", handler, timeout=0.2, stop=stop))
        await _until(lambda: _receiving(broker))
    try:
        await _until(lambda: _waiting_for_a_connection(client))
        stop.set()
        assert await asyncio.wait_for(consuming, 3) == 0
        assert not _waiting_for_a_connection(client)
    finally:
        await client.close()
