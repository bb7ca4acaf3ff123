"""ALTER QUEUE ... STATUS survives a restart; a change of the configured status still
applies at the next start; what waits for a queue that is off is visible (R-DLG-12)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from brokerd.tools.example import CONTRACT, ORDER, SHOP_SERVICE, WAREHOUSE_SERVICE
from brokerd.tools.launcher import Deployment
from protocol.errors import QueueDisabled
from tests.daemons import drain, wait_until


async def _status(deployment: Deployment) -> str:
    client = await deployment.daemons["beta"].client()
    try:
        rows = await client.view("queues")
        return str(next(r["status"] for r in rows if r["queue"] == "OrderQueue"))
    finally:
        await client.close()


async def _alter(deployment: Deployment, status: bool) -> None:
    client = await deployment.daemons["beta"].client()
    await client.alter_queue("OrderQueue", status)
    await client.close()


async def _restart(deployment: Deployment, kill: bool = False) -> None:
    if kill:
        deployment.kill("beta")
    else:
        deployment.stop("beta")
    await asyncio.to_thread(deployment.start, "beta")


def _configure(config: Path, status: str | None) -> None:
    text = config.read_text().replace('\nstatus = "off"', "").replace('\nstatus = "on"', "")
    if status is not None:
        text = text.replace('name = "OrderQueue"', f'name = "OrderQueue"\nstatus = "{status}"')
    config.write_text(text)


async def test_a_queue_status_set_by_alter_queue_survives_a_restart(
    deployment: Deployment,
) -> None:
    await _alter(deployment, False)
    await _restart(deployment, kill=True)
    assert await _status(deployment) == "off"  # the configuration (on) did not overwrite it

    await _alter(deployment, True)
    _configure(deployment.daemons["beta"].config_path, "off")  # the configuration changes
    await _restart(deployment)
    assert await _status(deployment) == "off"

    await _alter(deployment, True)  # the configuration still says off, unchanged
    await _restart(deployment)
    assert await _status(deployment) == "on"


async def test_messages_for_a_queue_that_is_off_show_in_the_transmission_queue_view(
    deployment: Deployment,
) -> None:
    """R-DLG-12: held for a queue that is off, the messages are listed in the receiving
    database's transmission_queue view with a status that says why, and delivered in
    order once the queue is on."""
    await _alter(deployment, False)
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    for n in (1, 2):
        await shop.send(handle, ORDER, b"order %d" % n)

    async def held() -> bool:
        return len(await warehouse.view("transmission_queue")) == 2

    await wait_until(held)
    rows = await warehouse.view("transmission_queue")
    assert [r["message_sequence_number"] for r in rows] == [1, 2]
    assert all("OrderQueue" in r["transmission_status"] for r in rows)
    assert all("off" in r["transmission_status"] for r in rows)
    assert {r["to_service"] for r in rows} == {WAREHOUSE_SERVICE}
    assert rows[0]["message_type"] == ORDER and rows[0]["size"] == len(b"order 1")
    with pytest.raises(QueueDisabled):
        await warehouse.receive("OrderQueue")
    await warehouse.alter_queue("OrderQueue", True)
    received = await drain(warehouse, "OrderQueue", 2)
    assert [m.message_body for m in received] == [b"order 1", b"order 2"]
    assert await warehouse.view("transmission_queue") == []
    await shop.close()
    await warehouse.close()
