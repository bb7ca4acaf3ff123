"""Calls the application stopped waiting for (their task cancelled, ``asyncio.timeout``
running out) leave the connection as it was.

SPEC §6 (client transactions): a connection holds at most 16 open transactions; one
whose BEGIN TRANSACTION's caller was cancelled has no owner to commit or roll it back,
so the SDK rolls it back once the daemon's answer comes, and the connection's slots stay
free.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

from brokerd.sdk.messages import ReceivedMessage
from brokerd.sdk.transaction import Transaction
from brokerd.server.daemon import Broker
from tests.daemons import client_of, solo_broker

HOSTS = ("127.0.21.1", "127.0.21.2", "127.0.21.3")


async def _until(check: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + 5
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in 5 s")
        await asyncio.sleep(0.01)


def _open_transactions(broker: Broker) -> int:
    return sum(len(session.transactions) for session in broker.client_sessions)


async def test_a_cancelled_begin_transaction_leaves_no_transaction_open(tmp_path: Path) -> None:
    """SPEC §6: a BEGIN TRANSACTION whose caller was cancelled after it was written is
    rolled back when its answer comes: the connection's 16 transactions stay free."""
    async with solo_broker(tmp_path, HOSTS[0]) as broker:
        client = await client_of(broker)
        for _ in range(20):
            beginning = asyncio.create_task(client.begin_transaction())
            await asyncio.sleep(0)  # written with this turn of the loop
            beginning.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beginning
        await client.ping()
        await _until(lambda: _open_transactions(broker) == 0)
        held = [await client.begin_transaction() for _ in range(16)]
        for tx in held:
            await tx.rollback()
        await client.close()


async def test_serve_stops_at_once_while_its_daemon_is_away(tmp_path: Path) -> None:
    """SPEC §6 (activation): setting ``stop`` ends ``serve`` promptly also while its
    daemon is away, its readers waiting for a connection to begin their next batch (up to
    ``Reconnect.give_up_after``, a minute by default)."""
    async with solo_broker(tmp_path, HOSTS[1]) as broker:
        client = await client_of(broker)

        async def handler(tx: Transaction, messages: list[ReceivedMessage]) -> None:
            pass

        activation = client.serve("Q2", handler, timeout=0.1)
        serving = asyncio.ensure_future(activation.run())
        await _until(lambda: _open_transactions(broker) == 1)  # a reader's RECEIVE waits
    await _until(lambda: not client.connected)  # the daemon stopped gracefully
    await asyncio.sleep(0.3)  # its readers wait for a connection
    assert not serving.done()
    activation.stop.set()
    try:
        assert await asyncio.wait_for(serving, 3) == 0
    finally:
        await client.close()
