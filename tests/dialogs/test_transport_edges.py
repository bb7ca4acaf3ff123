"""Edges of the dialog transport against real daemons (R-DLG-1, R-DLG-5, R-DLG-6,
R-DLG-7): send windows, retransmission and acknowledgements when routes move, links
drop and messages are lost on the way. alpha (127.0.0.164) sends to beta
(127.0.0.165), directly or through a fault proxy (127.0.0.166)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from brokerd.sdk.client import BrokerClient
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_database,
    warehouse_database,
)
from brokerd.tools.faultproxy import FaultPlan, FaultProxy
from brokerd.tools.launcher import Deployment
from tests.daemons import drain, running, wait_until

ALPHA, BETA, PROXY = "127.0.0.164", "127.0.0.165", "127.0.0.166"
RETRY = {"initial": 0.3, "maximum": 1.2, "ack_delay": 0.005, "delayed_retry": 0.5}


@contextlib.asynccontextmanager
async def through_proxy(
    root: Path, retry: dict[str, float], extra: str = ""
) -> AsyncIterator[tuple[Deployment, FaultProxy]]:
    """alpha -> proxy -> beta (beta answers alpha directly), all started; stopped at the end.
    alpha's route to the warehouse is made at run time (``ToWarehouse``), so that a test
    may move it."""
    d = Deployment(root, retry)
    d.add("alpha", ALPHA, shop_database(None), extra=extra)
    d.add("beta", BETA, warehouse_database(ALPHA), extra=extra)
    proxy = FaultProxy(PROXY, 4022, BETA, 4022, FaultPlan())
    await proxy.start()
    try:
        with running(d):
            yield d, proxy
    finally:
        await proxy.stop()


async def test_a_route_moved_while_messages_are_in_flight_leaves_no_window_full(
    tmp_path: Path,
) -> None:
    """R-DLG-6, R-DLG-13: two messages fill the send window of the link through the
    proxy (``limits.send_window = 2``) and are lost there; the route moves to beta's
    own address, where they are resent and acknowledged. The link through the proxy
    stays open: when the route comes back to it, its window must be empty again, not
    count for ever the two messages acknowledged on the other link (a later message
    would wait for room that never comes)."""
    retry = {**RETRY, "redial_after": 100}
    extra = "[limits]\nsend_window = 2\nbacklog_send_window = 2\n"
    async with through_proxy(tmp_path, retry, extra) as (d, proxy):
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        await shop.create_route(
            "shop", "ToWarehouse", f"tcp://{PROXY}:4022", remote_service_name=WAREHOUSE_SERVICE
        )
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(handle, ORDER, b"0")
        await drain(warehouse, "OrderQueue", 1)
        proxy.plan.drop_fragments = set(range(1, 100_000))
        await shop.send(handle, ORDER, b"1")
        await shop.send(handle, ORDER, b"2")
        await asyncio.sleep(0.5)  # written through the proxy, and lost
        await shop.alter_route("shop", "ToWarehouse", address=f"tcp://{BETA}:4022")
        received = await drain(warehouse, "OrderQueue", 2, timeout=20)
        assert [m.message_body for m in received] == [b"1", b"2"]
        await wait_until(lambda: _empty(shop), 10)
        proxy.plan.drop_fragments = set()
        await shop.alter_route("shop", "ToWarehouse", address=f"tcp://{PROXY}:4022")
        links = await shop.view("broker_connections")
        assert any(PROXY in str(r) and r["direction"] == "outbound" for r in links), links
        await shop.send(handle, ORDER, b"3")
        received = await drain(warehouse, "OrderQueue", 1, timeout=15)
        assert [m.message_body for m in received] == [b"3"]
        await shop.close()
        await warehouse.close()


async def _empty(client: BrokerClient) -> bool:
    return not await client.view("transmission_queue")
