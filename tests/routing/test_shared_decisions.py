"""Routing decisions shared by the conversations they do not depend on (R-ROUTE-4, R-ROUTE-5).

A decision made without a choice among equal routes is the same for every
conversation to a service: it is made once per side, not once per conversation,
and made again as soon as a route changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from brokerd.sdk.client import BrokerClient
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from tests.daemons import drain, running

DIALOGS = 30


async def stats(client: BrokerClient) -> dict[str, Any]:
    (row,) = await client.view("stats")
    return row


async def test_one_decision_serves_every_conversation_until_a_route_changes(
    tmp_path: Path,
) -> None:
    d = shop_and_warehouse(tmp_path, {"ack_delay": 0.005})
    with running(d):
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        for n in range(DIALOGS):
            handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
            await shop.send(handle, ORDER, n.to_bytes(4, "big"))
        received = await drain(warehouse, "OrderQueue", DIALOGS)
        assert sorted(int.from_bytes(m.message_body, "big") for m in received) == list(
            range(DIALOGS)
        )
        sender = (await stats(shop))["route_decisions"]
        receiver = (await stats(warehouse))["route_decisions"]
        assert 1 <= sender < 5, sender  # not one per conversation
        assert 1 <= receiver < 5, receiver

        # A route change is seen by the next decision at once: a second route to the
        # warehouse makes two equal choices, dropping it leaves the first again.
        await shop.create_route(
            "shop", "Elsewhere", "tcp://127.0.0.9:4022", remote_service_name=WAREHOUSE_SERVICE
        )
        both = await shop.explain(WAREHOUSE_SERVICE, database="shop")
        assert both["note"].startswith("load balanced over 2"), both
        await shop.drop_route("shop", "Elsewhere")
        back = await shop.explain(WAREHOUSE_SERVICE, database="shop")
        assert back["route"] == "ToWarehouse" and not back["note"], back
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(handle, ORDER, b"after the change")
        (last,) = await drain(warehouse, "OrderQueue", 1)
        assert last.message_body == b"after the change"
        assert (await stats(shop))["route_decisions"] >= sender + 2
        await shop.close()
        await warehouse.close()
