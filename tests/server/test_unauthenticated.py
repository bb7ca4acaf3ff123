"""Connections that never authenticate are closed in bounded time (the broker port 4022
and the client port), so idle unauthenticated sockets cannot pile up."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.tools.example import warehouse_database
from brokerd.tools.launcher import Daemon, Deployment
from tests.daemons import FAST_RETRY


def _beta(root: Path, endpoint_extra: str) -> Deployment:
    d = Deployment(root, FAST_RETRY)
    d.add("beta", "127.0.0.2", warehouse_database("127.0.0.1"), endpoint_extra=endpoint_extra)
    config = d.daemons["beta"].config_path
    config.write_text(config.read_text().replace("[client]", "[client]\nlogin_timeout = 1"))
    return d


@pytest.fixture
def beta(tmp_path: Path) -> Iterator[Daemon]:
    d = _beta(tmp_path, "handshake_timeout = 1")
    try:
        d.start("beta")
        yield d.daemons["beta"]
    finally:
        d.stop_all()


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Daemon]:
    d = _beta(tmp_path, "handshake_timeout = 30\nmax_connections_per_address = 3")
    try:
        d.start("beta")
        yield d.daemons["beta"]
    finally:
        d.stop_all()


async def _closed_after(host: str, port: int, within: float) -> float:
    """Connect, send nothing, and return how long until the daemon closes the socket."""
    reader, writer = await asyncio.open_connection(host, port)
    started = time.monotonic()
    try:
        while await asyncio.wait_for(reader.read(65536), within):
            pass  # a greeting or an error frame, then the end
        return time.monotonic() - started
    finally:
        writer.close()


async def test_a_broker_connection_without_a_handshake_is_closed(beta: Daemon) -> None:
    assert await _closed_after("127.0.0.2", 4022, within=5) < 4


async def test_a_client_connection_without_a_login_is_closed(beta: Daemon) -> None:
    assert await _closed_after("127.0.0.2", beta.client_port, within=5) < 4


async def test_a_logged_in_client_is_not_closed(beta: Daemon) -> None:
    client = await beta.client()
    await asyncio.sleep(1.5)
    assert await client.view("queues")  # still served after the login deadline
    await client.close()


async def test_connections_beyond_the_per_address_cap_are_closed_at_once(capped: Daemon) -> None:
    kept = [await asyncio.open_connection("127.0.0.2", 4022) for _ in range(3)]
    extra = [await asyncio.open_connection("127.0.0.2", 4022) for _ in range(2)]
    for reader, _ in extra:  # closed on arrival: the read ends (or is reset) at once
        with contextlib.suppress(ConnectionResetError):
            assert await asyncio.wait_for(reader.read(65536), 2) == b""
    for reader, _ in kept:  # still open: nothing to read, no end
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(65536), 0.3)
    for _, writer in kept + extra:
        writer.close()
    # once they are gone, a new connection is accepted again
    await asyncio.sleep(0.3)
    reader, writer = await asyncio.open_connection("127.0.0.2", 4022)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(65536), 0.3)
    writer.close()
