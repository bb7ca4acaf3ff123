"""A RECEIVE batch is cut to what one reply frame can carry before anything is removed.

SPEC R-DLG-1 (every message reaches the application exactly once, in order) and §6
(RECEIVE TOP n). A reply's meta is at most 1 MiB and its body at most the SDK
reader's frame limit; a batch beyond either used to be removed from the queue and
then fail to encode, so its messages were lost. Now the daemon removes (or, in a
transaction, holds) only the leading messages that fit, and the rest stay first in
their group.
"""

from __future__ import annotations

from typing import Any

from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.server.receive_reply import RECEIVE_BODY_LIMIT, ReceiveReply
from brokerd.tools.example import CONTRACT, ORDER, SHOP_SERVICE, WAREHOUSE_SERVICE
from brokerd.tools.launcher import Deployment
from tests.daemons import assert_exactly_once_in_order
from tests.sdk.orders import wait_ready

MESSAGES = 4000
"""Each RECEIVE row takes about 330 bytes of meta: 4,000 of them exceed 1 MiB."""


async def _fill(shop: BrokerClient, warehouse: BrokerClient) -> list[bytes]:
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    bodies = [f"<o n='{n}'/>".encode() for n in range(MESSAGES)]
    for start in range(0, MESSAGES, 500):
        await shop.send_many([(handle, ORDER, b) for b in bodies[start : start + 500]])
    await wait_ready(warehouse, MESSAGES, timeout=120)
    return bodies


async def test_a_receive_too_big_for_one_reply_loses_nothing(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    bodies = await _fill(shop, warehouse)

    # In a transaction: the batch is cut; a rollback gives it back, a commit takes it.
    tx = await warehouse.begin_transaction()
    held = await tx.receive("OrderQueue", top=MESSAGES + 1000, timeout=5)
    assert 1000 < len(held) < MESSAGES
    await tx.rollback()
    got: list[ReceivedMessage] = []
    async with warehouse.transaction() as tx:
        got += await tx.receive("OrderQueue", top=MESSAGES + 1000, timeout=5)
    assert [m.message_body for m in got] == [m.message_body for m in held]

    # Autocommit: the same cut, and what is left is received next, in order.
    batches = [len(got)]
    while len(got) < MESSAGES:
        batch = await warehouse.receive("OrderQueue", top=MESSAGES + 1000, timeout=5)
        assert batch, f"received {len(got)} of {MESSAGES}"
        batches.append(len(batch))
        got += batch
    assert len(batches) >= 2
    assert [m.message_body for m in got] == bodies
    assert_exactly_once_in_order(got)
    assert await warehouse.receive("OrderQueue", top=10, timeout=0.3) == []
    await shop.close()
    await warehouse.close()


def _row(body: bytes) -> dict[str, Any]:
    return {
        "conversation_handle": "8c2f4a1e-0b7d-4c3a-9e55-0a1f0e3b7c11",
        "message_sequence_number": 1,
        "message_type_name": ORDER,
        "message_body": body,
    }


def test_the_budget_counts_bodies_against_the_sdk_frame_limit() -> None:
    big = bytes(RECEIVE_BODY_LIMIT // 3 + 1)  # one object, listed several times
    assert ReceiveReply()([_row(big)] * 5) == 2
    assert ReceiveReply()([_row(b"x")] * 5) == 5
    assert ReceiveReply()([]) == 0
