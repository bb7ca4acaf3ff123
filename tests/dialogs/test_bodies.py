"""Unacknowledged bodies within a memory budget, read back from the file when sent
(R-DLG-5, R-DLG-13): a backlog far larger than the budget, a SIGKILL, a restart that
loads no body, and delivery of everything exactly once and in order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.storage.body_files import STORED_FROM
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from tests.daemons import FAST_RETRY, drain, stats_with, wait_until

MB = 1024 * 1024
BODY = 16 * 1024
DIALOGS, PER_DIALOG = 3, 100


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = shop_and_warehouse(
        tmp_path, FAST_RETRY, extra="[limits]\nheld_bodies_mb = 1\ntransit_bodies_mb = 1\n"
    )
    try:
        yield d
    finally:
        d.stop_all()


async def bodies(client: BrokerClient) -> dict[str, Any]:
    return await stats_with(client, "bodies_")


@pytest.mark.parametrize(
    "body", [BODY, 3 * BODY], ids=["bodies in their rows", "bodies in segment files"]
)
async def test_a_backlog_beyond_the_budget_survives_a_kill_and_is_read_back(
    deployment: Deployment, body: int
) -> None:
    """A body of 48 KiB is stored beside the database file (``storage.body_files``): it
    is as durable, read back as the row's, and its segments go once all is delivered."""
    deployment.start("alpha")
    shop = await deployment.daemons["alpha"].client()
    handles = [
        await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(DIALOGS)
    ]
    for n in range(PER_DIALOG):
        for d, handle in enumerate(handles):
            await shop.send(handle, ORDER, f"{d}:{n}:".encode().ljust(body, b"."))
    held = await bodies(shop)
    assert held["bodies_held_bytes"] <= 1 * MB, held  # 4.8 or 14.4 MB were sent
    data = deployment.daemons["alpha"].directory / "data"
    assert bool(list(data.glob("*-bodies/*.seg"))) == (body >= STORED_FROM)
    assert held["bodies_held_bytes"] + held["bodies_in_transit_bytes"] <= 2 * MB, held
    await shop.close()

    deployment.kill("alpha")
    deployment.start("alpha")
    shop = await deployment.daemons["alpha"].client()
    after_restart = await bodies(shop)
    assert after_restart["bodies_held_bytes"] == 0, after_restart  # no body loaded at start
    assert len(await shop.view("transmission_queue")) == DIALOGS * PER_DIALOG

    deployment.start("beta")
    warehouse = await deployment.daemons["beta"].client()
    peaks: list[int] = []

    async def watch() -> None:
        while True:
            seen = await bodies(shop)
            peaks.append(seen["bodies_held_bytes"] + seen["bodies_in_transit_bytes"])
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        received = await drain(warehouse, "OrderQueue", DIALOGS * PER_DIALOG, timeout=120)
    finally:
        watcher.cancel()
    per_dialog: dict[str, list[int]] = {}
    for m in received:
        d, n, _ = m.message_body.split(b":", 2)
        per_dialog.setdefault(d.decode(), []).append(int(n))
        assert len(m.message_body) == body
    assert per_dialog == {str(d): list(range(PER_DIALOG)) for d in range(DIALOGS)}
    assert await warehouse.receive("OrderQueue", timeout=0.5) == []
    assert max(peaks) <= 1 * MB + body, max(peaks)  # fed to the connection as it drains
    await wait_until(lambda: _empty(shop), 30)
    final = await bodies(shop)
    assert final["bodies_read_back"] >= DIALOGS * PER_DIALOG, final
    assert final["bodies_held_bytes"] == final["bodies_in_transit_bytes"] == 0, final
    assert final["bodies_ahead_bytes"] == 0, final
    assert final["bodies_waiting"] == 0, final
    await wait_until(lambda: _none(data.glob("*-bodies/*.seg")), 10)
    await shop.close()
    await warehouse.close()


async def _none(found: Iterator[Path]) -> bool:
    return not list(found)


async def _empty(client: BrokerClient) -> bool:
    return not await client.view("transmission_queue")
