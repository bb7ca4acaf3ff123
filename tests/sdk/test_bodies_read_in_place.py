"""Large bodies through the SDK and two daemons, read in place on both client wires.

SPEC R-DLG-1 (exactly once, in order) and §6 (SEND, RECEIVE TOP n). A body of
``LARGE_BODY`` bytes or more is read by the daemon's client listener (a SEND) and by the
SDK (a RECEIVE reply) straight into a buffer of its own (``ClientFrameReader.get_buffer``);
this checks, end to end, that every size around that threshold arrives whole and equal,
whether SENT alone, pipelined, in ``send_many`` or in a transaction, and that the
application gets ``bytes``.
"""

from __future__ import annotations

import asyncio

from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.tools.example import CONTRACT, ORDER, SHOP_SERVICE, WAREHOUSE_SERVICE
from brokerd.tools.launcher import Deployment
from protocol.client_wire import LARGE_BODY
from tests.daemons import assert_exactly_once_in_order
from tests.sdk.orders import wait_ready

SIZES = [LARGE_BODY - 1, LARGE_BODY, LARGE_BODY + 1, 1024 * 1024 + 3, 3 * 1024 * 1024]


def _body(n: int, size: int) -> bytes:
    """``size`` bytes that differ from every other body's at every position."""
    pattern = bytes((n * 7 + i) % 251 for i in range(251))
    return (pattern * (size // len(pattern) + 1))[:size]


async def test_large_bodies_arrive_whole_in_order_and_as_bytes(deployment: Deployment) -> None:
    shop: BrokerClient = await deployment.daemons["alpha"].client()
    warehouse: BrokerClient = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    bodies: list[bytes] = []

    def more() -> list[bytes]:
        new = [_body(len(bodies) + i, size) for i, size in enumerate(SIZES)]
        bodies.extend(new)
        return new

    for body in more():  # one at a time
        await shop.send(handle, ORDER, body)
    pipelined = more()  # written together, read back to back
    await asyncio.gather(*(shop.send(handle, ORDER, body) for body in pipelined))
    await shop.send_many([(handle, ORDER, body) for body in more()])
    async with shop.transaction() as tx:
        for body in more():
            await tx.send(handle, ORDER, body)

    await wait_ready(warehouse, len(bodies), timeout=120)
    got: list[ReceivedMessage] = []
    while len(got) < len(bodies):
        batch = await warehouse.receive("OrderQueue", top=7, timeout=5)
        assert batch, f"received {len(got)} of {len(bodies)}"
        got += batch
    assert [len(m.message_body) for m in got] == [len(b) for b in bodies]
    assert [m.message_body for m in got] == bodies
    assert all(type(m.message_body) is bytes for m in got)
    assert_exactly_once_in_order(got)
    assert await warehouse.receive("OrderQueue", top=10, timeout=0.3) == []
    await shop.close()
    await warehouse.close()
