"""Connections that never authenticate are closed in bounded time (the broker port 4022
and the client port), so idle unauthenticated sockets cannot pile up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.tools.example import warehouse_database
from brokerd.tools.launcher import Daemon, Deployment
from tests.daemons import FAST_RETRY


@pytest.fixture
def beta(tmp_path: Path) -> Iterator[Daemon]:
    d = Deployment(tmp_path, FAST_RETRY)
    d.add(
        "beta",
        "127.0.0.2",
        warehouse_database("127.0.0.1"),
        endpoint_extra="handshake_timeout = 1",
        extra="",
    )
    config = d.daemons["beta"].config_path
    config.write_text(config.read_text().replace("[client]", "[client]\nlogin_timeout = 1"))
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
    assert await client.queues()  # still served after the login deadline
    await client.close()
