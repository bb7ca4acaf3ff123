"""An endpoint's row is written as a whole snapshot; the last one queued wins (R-DLG-1,
R-DLG-13). ``send_many`` took its snapshots, then queued them from tasks that start
on a later turn of the event loop: a message received on the same endpoint in
between queued a newer snapshot first, and the older one, written last, put back a
lower ``receive_sequence``. After a crash the received messages beyond it were
accepted again when retransmitted, and RECEIVE handed them out twice (found by the
soak, brokerd/tools/soak: one RECEIVE returned ten replies twice).

The broker runs in this process (``Broker``, as ``brokerd run`` builds it) so the
test can see the order in which work reaches the store.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokerd.server.daemon import Broker
from tests.daemons import client_of, solo_broker

HOST = "127.0.0.245"


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    async with solo_broker(tmp_path, HOST) as broker:
        yield broker


async def test_send_many_queues_its_snapshots_before_anything_else_runs(broker: Broker) -> None:
    client = await client_of(broker)
    try:
        handle = await client.begin_dialog("//solo/S1", "//solo/S2")
        await client.send(handle, body=b"first")
        (message,) = await client.receive("Q2", timeout=5)
        target = message.conversation_handle
    finally:
        await client.close()
    store = broker.databases["Solo"].store

    def queued(conn: sqlite3.Connection) -> int:
        # (Snapshots are written at the end of a batch; the message row comes with them.)
        row = conn.execute(
            "SELECT COUNT(*) FROM transmission_queue WHERE conversation_handle = ?",
            (str(target),),
        ).fetchone()
        return int(row[0])

    sending = broker.engine.send_verbs
    task = asyncio.ensure_future(sending.send_many([(target, "DEFAULT", b"reply")]))
    await asyncio.sleep(0)  # send_many runs up to its first wait
    # Work queued now is ordered after send_many's, snapshot and message row alike.
    assert await store.run(queued) == 1
    assert await task == [1]
