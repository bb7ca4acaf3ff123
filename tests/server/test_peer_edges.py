"""The broker port's edges against hostile or broken peers, over real sockets (R-PROTO-3,
R-DLG-6): a link nobody waits on any more stops dialling, and a flood of
connections over the per-address cap does not flood the log.

The daemons run on 127.0.0.181-183:4022; a hostile peer is a raw socket.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_database,
    warehouse_database,
)
from brokerd.tools.launcher import Daemon, Deployment
from tests.daemons import FAST_RETRY, wait_until

ALPHA = "127.0.0.181"
BETA = "127.0.0.182"
OTHER = "127.0.0.183"


async def _connections_within(host: str, seconds: float) -> int:
    """Listen on ``host``:4022 for ``seconds`` and count the connections made to it."""
    count = 0

    def arrived(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        count += 1
        writer.close()

    server = await asyncio.start_server(arrived, host, 4022)
    try:
        await asyncio.sleep(seconds)
    finally:
        server.close()
        await server.wait_closed()
    return count


async def test_a_link_nobody_waits_on_stops_dialling(tmp_path: Path) -> None:
    """alpha's message for an address where nothing listens is given up (END CONVERSATION
    WITH CLEANUP): nothing waits for that link any more, so it stops dialling, instead of
    trying the address every ``reconnect_max`` for as long as the daemon runs."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("alpha", ALPHA, shop_database(OTHER))
    try:
        d.start("alpha")
        shop = await d.daemons["alpha"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(handle, ORDER, b"for nobody")

        async def refused() -> bool:
            rows = await shop.view("transmission_queue")
            return bool(rows) and "refused" in rows[0]["transmission_status"]

        await wait_until(refused, 10)
        await shop.end_conversation(handle, cleanup=True)
        assert not await shop.view("transmission_queue")
        await asyncio.sleep(2.5)  # over reconnect_max: an attempt under way has ended
        assert await _connections_within(OTHER, 5.0) == 0
        await shop.close()
    finally:
        d.stop_all()


@pytest.fixture
def one_per_address(tmp_path: Path) -> Iterator[Daemon]:
    """beta taking one incoming connection per address."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add(
        "beta",
        BETA,
        warehouse_database(ALPHA),
        endpoint_extra="handshake_timeout = 60\nmax_connections_per_address = 1\n",
    )
    try:
        d.start("beta")
        yield d.daemons["beta"]
    finally:
        d.stop_all()


async def test_a_flood_over_the_per_address_cap_does_not_flood_the_log(
    one_per_address: Daemon,
) -> None:
    """500 connections from one address over its cap are each closed on arrival, and the
    log says so a bounded number of times, not once per connection (a flood of refused
    connections must not fill the disk with warnings)."""
    kept = socket.create_connection((BETA, 4022))
    before = one_per_address.log_path.read_text().count("refused")
    try:
        for _ in range(500):
            s = socket.create_connection((BETA, 4022))
            s.close()
        await asyncio.sleep(1.0)
        refusals = one_per_address.log_path.read_text().count("refused") - before
        assert 1 <= refusals <= 10, refusals
    finally:
        kept.close()
