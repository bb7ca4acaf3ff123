"""What the tests of runs (the local link's and a connection's) share: bodies whose sizes
change every 40 messages, pipelined SENDs, and a message refused inside a run."""

from __future__ import annotations

import asyncio
import uuid

from brokerd.sdk.client import BrokerClient
from brokerd.tools import example
from tests.daemons import assert_exactly_once_in_order, drain


def body(n: int, what: str) -> bytes:
    """Sizes change every 40 messages: runs of alike messages are traced together."""
    return f"<{what}>{n}</{what}>".encode() + b" " * (n // 40 % 3 * 50)


async def pipelined(
    client: BrokerClient, handle: uuid.UUID, message_type: str, bodies: list[bytes]
) -> list[int | BaseException]:
    futures = [client.send_nowait(handle, message_type, b) for b in bodies]
    return await asyncio.gather(*futures, return_exceptions=True)


def validating_warehouse(shop_host: str | None) -> str:
    """The warehouse database, validating orders as well-formed XML (R-OBJ-1)."""
    plain = f'name = "{example.ORDER}"\nvalidation = "none"'
    warehouse = example.warehouse_database(shop_host)
    assert plain in warehouse
    return warehouse.replace(plain, f'name = "{example.ORDER}"\nvalidation = "well_formed_xml"')


async def refused_inside_a_run(shop: BrokerClient, warehouse: BrokerClient) -> None:
    """Order 150 of 300 pipelined on one dialog is not XML: the orders before it are
    queued in order, it and the ones after it never are, and the shop gets the Error
    (R-OBJ-1, R-DLG-2). ``shop`` and ``warehouse`` may be one client."""
    orders = [body(n, "order") for n in range(1, 301)]
    orders[149] = b"not XML"
    handle = await shop.begin_dialog(
        example.SHOP_SERVICE, example.WAREHOUSE_SERVICE, example.CONTRACT
    )
    sent = await pipelined(shop, handle, example.ORDER, orders)
    assert [s for s in sent if isinstance(s, int)][:149] == list(range(1, 150))
    (error,) = await drain(shop, "ClientQueue", 1, timeout=30)
    assert error.conversation_handle == handle and error.is_error
    assert b"<Code>-9615</Code>" in error.message_body
    got = await drain(warehouse, "OrderQueue", 149)
    assert [m.message_body for m in got] == orders[:149]
    assert_exactly_once_in_order(got)
    await asyncio.sleep(0.5)
    assert await warehouse.receive("OrderQueue", timeout=0.2) == []
