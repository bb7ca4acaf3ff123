"""Idempotency keys are forgotten after ``limits.send_key_window`` (SPEC §6), in memory
and in the file; a key sent again after that is a new SEND. The broker runs in this
process (``Broker``, as ``brokerd run`` builds it) so the test can move its clock on."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokerd.server.daemon import Broker
from tests.daemons import client_of, solo_broker

HOST = "127.0.0.247"


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    async with solo_broker(tmp_path, HOST, "[limits]\nsend_key_window = 60\n") as broker:
        yield broker


def _keys_in_file(broker: Broker) -> int:
    with sqlite3.connect(broker.databases["Solo"].store.path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM send_keys").fetchone()[0])


async def test_a_key_is_forgotten_after_its_window(broker: Broker) -> None:
    client = await client_of(broker)
    try:
        handle = await client.begin_dialog("//solo/S1", "//solo/S2")
        first = await client.send(handle, body=b"once", key="k")
        assert await client.send(handle, body=b"once", key="k") == first
        assert _keys_in_file(broker) == 1

        sending = broker.engine.send_verbs
        sending.forget_old_keys(time.time() + 30)  # within the window: kept
        assert await client.send(handle, body=b"once", key="k") == first
        sending.forget_old_keys(time.time() + 61)  # past it: gone, here and in the file
        await broker.databases["Solo"].store.wait_idle()
        assert _keys_in_file(broker) == 0
        assert await client.send(handle, body=b"twice", key="k") == first + 1
        rows = await client.receive("Q2", top=10, timeout=5)
        assert [r.message_body for r in rows] == [b"once", b"twice"]
    finally:
        await client.close()
