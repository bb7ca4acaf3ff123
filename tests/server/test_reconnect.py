"""A peer that comes back is dialled at once, whatever the reconnect back-off has reached."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from brokerd.tools.example import (
    CONFIRMATION,
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_database,
    warehouse_database,
)
from brokerd.tools.launcher import Deployment
from tests.daemons import FAST_RETRY, drain, wait_until


async def test_a_connection_from_the_peer_ends_the_reconnect_wait(tmp_path: Path) -> None:
    """alpha waits 30 s between attempts to reach beta; beta restarts and connects to alpha
    to deliver a reply: alpha dials beta at once, and its waiting message arrives in
    seconds instead of at the next scheduled attempt."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add(
        "alpha",
        "127.0.0.1",
        shop_database("127.0.0.2"),
        endpoint_extra="reconnect_initial = 30.0\nreconnect_max = 30.0\n",
    )
    d.add("beta", "127.0.0.2", warehouse_database("127.0.0.1"))
    try:
        d.start("alpha")
        d.start("beta")
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(handle, ORDER, b"first")
        (first,) = await drain(warehouse, "OrderQueue", 1)
        await warehouse.close()
        d.stop("beta")

        await shop.send(handle, ORDER, b"second")

        async def refused() -> bool:
            rows = await shop.view("transmission_queue")
            return bool(rows) and "next attempt in 30" in rows[0]["transmission_status"]

        await wait_until(refused, 20)
        d.start("beta")
        warehouse = await d.daemons["beta"].client()
        started = time.monotonic()
        await warehouse.send(first.conversation_handle, CONFIRMATION, b"reply to first")
        (second,) = await drain(warehouse, "OrderQueue", 1, timeout=20)
        assert second.message_body == b"second"
        assert time.monotonic() - started < 10  # not the 30 s of the back-off
        (reply,) = await drain(shop, "ClientQueue", 1)
        assert reply.message_body == b"reply to first"
        await asyncio.gather(shop.close(), warehouse.close())
    finally:
        d.stop_all()
