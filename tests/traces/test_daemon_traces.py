"""Real daemons write delivery traces that account for every message (docs/traces.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from brokerd.traces.writer import read_events, segment_files
from tests.daemons import drain, wait_until

HOSTS = ("127.0.0.51", "127.0.0.52")


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = shop_and_warehouse(
        tmp_path,
        {"initial": 0.5, "maximum": 2.0, "ack_delay": 0.005, "delayed_retry": 0.5},
        hosts=HOSTS,
    )
    try:
        yield d
    finally:
        d.stop_all()


async def test_every_message_is_traced_from_send_to_receive(deployment: Deployment) -> None:
    deployment.start("alpha")
    deployment.start("beta")
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handles = [await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(5)]
    for n in range(20):
        for h in handles:
            await shop.send(h, ORDER, f"{n}".encode())
    await drain(warehouse, "OrderQueue", 100)

    async def acknowledged() -> bool:
        return not await shop.view("transmission_queue")

    await wait_until(acknowledged, 20)
    await shop.close()
    await warehouse.close()
    deployment.stop_all()  # flushes and closes the segments
    events = list(
        read_events(
            segment_files([d.directory / "data" / "traces" for d in deployment.daemons.values()])
        )
    )
    by = Counter((e["instance"], e["event"]) for e in events)
    assert by[("alpha", "dialog_begun")] == 5 and by[("beta", "dialog_begun")] == 5
    assert by[("alpha", "message_sent")] == 100 and by[("alpha", "enqueued")] == 100
    assert by[("alpha", "route_chosen")] == 5
    assert by[("beta", "delivered")] == 100 and by[("beta", "received")] == 100
    acked = sum(e["acked"] for e in events if e["event"] == "ack_received")
    assert acked == 100
    sent = {(e["conversation_id"], e["seq"]) for e in events if e["event"] == "message_sent"}
    received = {
        (e["conversation_id"], e["seq"])
        for e in events
        if e["event"] == "received" and e["instance"] == "beta"
    }
    assert sent == received  # joined across instances by conversation id and sequence number
    assert all(e["initiator"] for e in events if e["event"] in ("message_sent", "received"))
    assert {e["event"] for e in events if e["instance"] == "alpha"} >= {
        "connection_opened",
        "fragment_sent",
        "ack_received",
    }
