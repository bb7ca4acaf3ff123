"""Client transactions with real daemons (SPEC §6): RECEIVE, SEND and END CONVERSATION
committed together, rollback restoring order, group locks held until the end."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.tools.example import (
    CONFIRMATION,
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from protocol.errors import ConversationEnded, TransactionRolledBack
from tests.daemons import drain, wait_until

FAST_RETRY = {"initial": 0.5, "maximum": 2.0, "ack_delay": 0.005, "delayed_retry": 0.5}


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    d.start("alpha")
    d.start("beta")
    try:
        yield d
    finally:
        d.stop_all()


async def orders(shop: BrokerClient, warehouse: BrokerClient, count: int) -> uuid.UUID:
    """``count`` orders on a new dialog, returned once all are ready at the warehouse."""
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    for i in range(count):
        await shop.send(handle, ORDER, f"<order n='{i}'/>".encode())

    async def ready() -> bool:
        rows = await warehouse.queues()
        return any(r["queue"] == "OrderQueue" and r["ready_messages"] >= count for r in rows)

    await wait_until(ready, 30)
    return handle


async def test_receive_send_and_end_commit_together(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    await orders(shop, warehouse, 3)
    got = await drain_in_tx_and_reply(warehouse)
    assert [m.message_sequence_number for m in got] == [1, 2, 3]
    replies = await drain(shop, "ClientQueue", 2, timeout=30)
    assert [m.message_type_name for m in replies] == [
        CONFIRMATION,
        "http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog",
    ]
    assert await warehouse.receive("OrderQueue", timeout=0.3) == []


async def drain_in_tx_and_reply(warehouse: BrokerClient) -> list:
    async with warehouse.transaction() as tx:
        got = await tx.receive("OrderQueue", top=10, timeout=10)
        handle = got[0].conversation_handle
        await tx.send(handle, CONFIRMATION, b"<ok/>")
        await tx.end_conversation(handle)
    assert tx.sequence_numbers == [1]
    return got


async def test_rollback_puts_messages_back_in_order(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    await orders(shop, warehouse, 5)
    with pytest.raises(RuntimeError):
        async with warehouse.transaction() as tx:
            got = await tx.receive("OrderQueue", top=3, timeout=10)
            assert got
            other = await deployment.daemons["beta"].client()
            # the group is locked: another reader gets nothing of it
            assert await other.receive("OrderQueue", top=10, timeout=0.3) == []
            raise RuntimeError("application failed")
    again = await drain(warehouse, "OrderQueue", 5, timeout=30)
    assert [m.message_sequence_number for m in again] == [1, 2, 3, 4, 5]


async def test_a_refused_verb_rolls_back_the_whole_transaction(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    await orders(shop, warehouse, 2)
    tx = await warehouse.begin_transaction()
    got = await tx.receive("OrderQueue", top=10, timeout=10)
    handle = got[0].conversation_handle
    await tx.end_conversation(handle)
    await tx.send(handle, CONFIRMATION, b"<late/>")  # checked now: still allowed
    with pytest.raises(TransactionRolledBack, match="ConversationEnded"):
        await tx.commit()
    again = await drain(warehouse, "OrderQueue", len(got), timeout=30)
    assert [m.message_sequence_number for m in again] == [m.message_sequence_number for m in got]
    ended = await orders(shop, warehouse, 0)
    await shop.end_conversation(ended)
    with pytest.raises(ConversationEnded):  # a typed error outside a transaction too
        await shop.send(ended, ORDER, b"<x/>")
