"""A flood of hostile connections on both ports of a live daemon: bounded memory and file
descriptors, and legitimate delivery goes on.

1,000 connections to port 4022 from twenty loopback addresses, each announcing a
handshake frame and sending part of it (a slow peer holding a buffer), plus
connections sending random bytes; 300 connections to the client port that never
log in. Meanwhile alpha opens its first connection to the flooded beta and a new
dialog must deliver within 5 s; beta's RSS must stay under 150 MB.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.system import memory_mb
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from protocol import frames
from protocol.client_wire import HEADER_SIZE as CLIENT_HEADER_SIZE
from protocol.handshake import HANDSHAKE_MAX_FRAME_SIZE
from tests.daemons import FAST_RETRY, drain, running

BETA = "127.0.0.2"
HOSTILE = [f"127.0.0.{n}" for n in range(10, 30)]


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running(shop_and_warehouse(tmp_path, FAST_RETRY)) as d:
        yield d


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def hostile_broker_connections(count: int, writers: list[asyncio.StreamWriter]) -> int:
    """Connections that announce a 16 KiB handshake frame and send 1 KiB of it, or that send
    random bytes; returns how many the daemon accepted at first."""
    rng = random.Random(7)
    header = frames.encode_header(1, frames.FrameType.HELLO, 0, HANDSHAKE_MAX_FRAME_SIZE, 0)
    opened = 0
    for n in range(count):
        source = HOSTILE[n % len(HOSTILE)]
        try:
            _, writer = await asyncio.open_connection(BETA, 4022, local_addr=(source, 0))
        except OSError:
            continue
        opened += 1
        if n % 10 == 0:
            writer.write(rng.randbytes(4096))
        else:
            writer.write(header + bytes(1024))
        writers.append(writer)
        if n % 50 == 0:
            await asyncio.sleep(0)  # let the daemon's accepts and the test's reads interleave
    return opened


async def hostile_client_connections(
    port: int, count: int, writers: list[asyncio.StreamWriter]
) -> None:
    """Client-port connections that announce a frame and never log in."""
    partial = bytes(CLIENT_HEADER_SIZE - 1)
    for n in range(count):
        source = HOSTILE[n % len(HOSTILE)]
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection(BETA, port, local_addr=(source, 0))
            writer.write(partial)
            writers.append(writer)


async def test_a_connection_flood_leaves_memory_bounded_and_delivery_going(
    deployment: Deployment,
) -> None:
    """F1, F10: the handshake cap evicts the oldest unauthenticated connections, the
    pre-handshake buffer is 16 KiB, and a broker's own handshake still completes."""
    beta = deployment.daemons["beta"]
    assert beta.process is not None
    pid = beta.process.pid
    shop = await deployment.daemons["alpha"].client()
    warehouse = await beta.client()
    writers: list[asyncio.StreamWriter] = []
    try:
        opened = await hostile_broker_connections(1000, writers)
        await hostile_client_connections(beta.client_port, 300, writers)
        assert opened >= 900  # connections were accepted, then churned by the cap

        started = time.monotonic()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(handle, ORDER, b"through the flood")
        (got,) = await drain(warehouse, "OrderQueue", 1, timeout=5)
        assert got.message_body == b"through the flood"
        assert time.monotonic() - started < 5

        assert memory_mb(pid, "VmRSS") < 150, memory_mb(pid, "VmRSS")
        assert open_fds(pid) < 700, open_fds(pid)
        (stats,) = await warehouse.view("stats")
        # Every tenth connection sent random bytes and was closed for it; of the others, all
        # but the last 128 were evicted by newer ones.
        assert stats["handshakes_evicted"] >= opened * 9 // 10 - 128 - 50, stats
        connections = await warehouse.view("broker_connections")
        assert sum(1 for c in connections if c["state"] == "handshake") <= 128
    finally:
        for writer in writers:
            writer.transport.abort()
        await shop.close()
        await warehouse.close()
