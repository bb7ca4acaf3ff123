"""Silent connections are found and dialled again (SPEC R-PROTO-5), with real daemons.

alpha's route to the warehouse goes through the fault proxy on 127.0.0.3:4022,
which can blackhole live connections (they go silent both ways, without a reset,
and stay so) and drop chosen FRAGMENT frames. Without a liveness check a dialog
stalls on such a connection until it is closed for idleness, which never happens
while its messages wait; with heartbeats and the redial rule it goes on, each
message exactly once and in order (R-DLG-1).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.faultproxy import FaultPlan, FaultProxy
from brokerd.tools.launcher import Deployment
from tests.daemons import (
    FAST_RETRY,
    PROXY_HOST,
    assert_exactly_once_in_order,
    drain,
    proxied,
    wait_until,
)

IDLE_TIMEOUT = 90.0


async def _deployment(
    tmp_path: Path, plan: FaultPlan, endpoint: str, retry: dict[str, float]
) -> AsyncIterator[tuple[Deployment, FaultProxy]]:
    d = shop_and_warehouse(
        tmp_path,
        retry,
        beta_route_host=PROXY_HOST,
        endpoint_extra=f"idle_timeout = {IDLE_TIMEOUT}\nconnect_timeout = 2\n{endpoint}",
    )
    async with proxied(d, plan) as proxy:
        yield d, proxy


@pytest.fixture
async def heartbeats(tmp_path: Path) -> AsyncIterator[tuple[Deployment, FaultProxy]]:
    endpoint = "heartbeat_interval = 0.5\nheartbeat_deadline = 2"
    async for pair in _deployment(tmp_path, FaultPlan(), endpoint, FAST_RETRY):
        yield pair


@pytest.fixture
async def redial(tmp_path: Path) -> AsyncIterator[tuple[Deployment, FaultProxy]]:
    # Heartbeats keep flowing (the proxy drops FRAGMENT frames only); the redial rule
    # alone must notice that the connection carries no acknowledgement back. One fragment
    # per frame, so that the plan's ordinals are messages and their retransmissions.
    plan = FaultPlan(drop_fragments={2, 3, 4})
    endpoint = "fragments_per_frame = 1"
    async for pair in _deployment(tmp_path, plan, endpoint, {**FAST_RETRY, "redial_after": 2}):
        yield pair


async def test_a_dialog_resumes_soon_after_a_silent_partition(
    heartbeats: tuple[Deployment, FaultProxy],
) -> None:
    d, proxy = heartbeats
    shop = await d.daemons["alpha"].client()
    warehouse = await d.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    bodies = [f"<order id='{n}'/>".encode() for n in range(8)]
    for body in bodies[:4]:
        await shop.send(handle, ORDER, body)
    received = await drain(warehouse, "OrderQueue", 4, timeout=30)
    assert proxy.stats.connections == 1

    proxy.plan.blackhole = True  # the live connection goes silent, both ways, for good
    for body in bodies[4:]:
        await shop.send(handle, ORDER, body)  # committed at alpha, sent into the void
    await asyncio.sleep(3.0)  # longer than the deadline: alpha's first redials are swallowed too
    proxy.plan.blackhole = False
    healed = time.monotonic()
    received += await drain(warehouse, "OrderQueue", 4, timeout=IDLE_TIMEOUT / 3)
    resumed_after = time.monotonic() - healed
    assert resumed_after < 15.0, resumed_after  # far below idle_timeout (90 s)
    assert [m.message_body for m in received] == bodies
    assert_exactly_once_in_order(received)
    assert proxy.stats.connections >= 2

    async def drained() -> bool:
        return not await shop.view("transmission_queue")

    await wait_until(drained, 15)

    # beta dropped its side of the silent connection too: only the new one is left.
    async def one_inbound() -> bool:
        inbound = [
            c for c in await warehouse.view("broker_connections") if c["direction"] == "inbound"
        ]
        return len(inbound) == 1

    await wait_until(one_inbound, 15)
    await shop.close()
    await warehouse.close()


async def test_retransmissions_without_an_answer_make_the_link_redial(
    redial: tuple[Deployment, FaultProxy],
) -> None:
    d, proxy = redial
    shop = await d.daemons["alpha"].client()
    warehouse = await d.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    await shop.send(handle, ORDER, b"<order id='1'/>")  # FRAGMENT #1 passes
    await shop.send(handle, ORDER, b"<order id='2'/>")  # #2, and retransmissions #3, #4 lost
    received = await drain(warehouse, "OrderQueue", 2, timeout=30)
    assert [m.message_body for m in received] == [b"<order id='1'/>", b"<order id='2'/>"]
    assert proxy.stats.fragments_dropped == 3
    # After two unanswered retransmissions the third went on a new connection.
    assert proxy.stats.connections == 2
    (stats,) = await shop.view("stats")
    assert stats["retransmissions"] >= 3
    log = d.daemons["alpha"].log_path.read_text()
    assert "retransmitted 2 times" in log and "retry.redial_after" in log
    await shop.close()
    await warehouse.close()
