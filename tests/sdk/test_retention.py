"""RETENTION: received messages stay in the queue with status 0 and are not received
again (R-OBJ-3), both for an autocommit RECEIVE and in a transaction."""

from __future__ import annotations

import asyncio
import sqlite3

from brokerd.tools.example import CONTRACT, ORDER, SHOP_SERVICE, WAREHOUSE_SERVICE
from brokerd.tools.launcher import Deployment
from tests.daemons import drain
from tests.sdk.orders import wait_ready


async def test_received_messages_are_kept_with_status_0(deployment: Deployment) -> None:
    config = deployment.daemons["beta"].config_path
    text = config.read_text()
    config.write_text(text.replace('name = "OrderQueue"', 'name = "OrderQueue"\nretention = true'))
    deployment.stop("beta")
    await asyncio.to_thread(deployment.start, "beta")

    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    for n in range(6):
        await shop.send(handle, ORDER, f"<order n='{n}'/>".encode())
    await wait_ready(warehouse, 6)

    first = await warehouse.receive("OrderQueue", top=3, timeout=5)
    async with warehouse.transaction() as tx:
        second = await tx.receive("OrderQueue", top=3, timeout=5)
    assert [m.message_sequence_number for m in first + second] == [1, 2, 3, 4, 5, 6]
    assert await warehouse.receive("OrderQueue", top=10, timeout=0.5) == []

    database = deployment.daemons["beta"].directory / "data" / "warehouse.sqlite"
    with sqlite3.connect(database) as conn:
        rows = conn.execute(
            "SELECT message_sequence_number, status FROM queue_messages "
            "ORDER BY message_sequence_number"
        ).fetchall()
    assert rows == [(n, 0) for n in range(1, 7)]
    assert await drain(warehouse, "OrderQueue", 0) == []
    for client in (shop, warehouse):
        await client.close()
