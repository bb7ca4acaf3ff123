"""Client transactions and batched SENDs with real daemons (SPEC §6, R-DLG-1):
RECEIVE, SEND and END CONVERSATION committed together, rollback restoring order, a
refusal at COMMIT rolling everything back, send_many, MOVE CONVERSATION, and the
bounds on what a connection and a transaction may hold."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from brokerd.dialogs.verbs.transactions import MAX_VERBS, SEND_BUDGET_MESSAGES
from brokerd.sdk.client import ReceivedMessage
from brokerd.server.client_requests import MAX_OPEN_TRANSACTIONS, MAX_SEND_MANY
from brokerd.tools.example import (
    CONFIRMATION,
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from protocol.errors import (
    ConversationEnded,
    InvalidRequest,
    TransactionError,
    TransactionRolledBack,
)
from tests.daemons import FAST_RETRY, assert_exactly_once_in_order, drain
from tests.sdk.orders import order_dialogs, ready_count, seqs, wait_ready

END_DIALOG = "http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog"


async def test_receive_send_and_end_commit_together(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    await order_dialogs(shop, warehouse, dialogs=1, per_dialog=3)
    async with warehouse.transaction() as tx:
        got = await tx.receive("OrderQueue", top=10, timeout=10)
        handle = got[0].conversation_handle
        await tx.send(handle, CONFIRMATION, b"<ok/>")
        await tx.end_conversation(handle)
    assert tx.sequence_numbers == [1]
    assert seqs(got) == [1, 2, 3]
    replies = await drain(shop, "ClientQueue", 2, timeout=30)
    assert [m.message_type_name for m in replies] == [CONFIRMATION, END_DIALOG]
    assert await warehouse.receive("OrderQueue", timeout=0.3) == []


async def test_rollback_puts_messages_back_in_order(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    await order_dialogs(shop, warehouse, dialogs=1, per_dialog=5)
    other = await deployment.daemons["beta"].client()
    with pytest.raises(RuntimeError):
        async with warehouse.transaction() as tx:
            assert seqs(await tx.receive("OrderQueue", top=3, timeout=10)) == [1, 2, 3]
            # the group is locked: another reader gets nothing of it
            assert await other.receive("OrderQueue", top=10, timeout=0.3) == []
            raise RuntimeError("application failed")
    again = await drain(warehouse, "OrderQueue", 5, timeout=30)
    assert seqs(again) == [1, 2, 3, 4, 5]


async def test_a_refused_verb_rolls_back_the_whole_transaction(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    await order_dialogs(shop, warehouse, dialogs=1, per_dialog=2)
    tx = await warehouse.begin_transaction()
    got = await tx.receive("OrderQueue", top=10, timeout=10)
    handle = got[0].conversation_handle
    await tx.end_conversation(handle)
    await tx.send(handle, CONFIRMATION, b"<late/>")  # checked now: still allowed
    with pytest.raises(TransactionRolledBack, match="ConversationEnded"):
        await tx.commit()
    again = await drain(warehouse, "OrderQueue", len(got), timeout=30)
    assert seqs(again) == seqs(got)
    assert await warehouse.view("transmission_queue") == []  # neither the reply nor the end
    ended = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    await shop.send(ended, ORDER, b"<first/>")  # ended before any SEND, it would go at once
    await shop.end_conversation(ended)
    with pytest.raises(ConversationEnded):  # a typed error outside a transaction too
        await shop.send(ended, ORDER, b"<x/>")


async def test_send_many_queues_a_batch_in_order(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handles = [await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in "ab"]
    batch = [(h, ORDER, f"<order n='{n}'/>".encode()) for n in range(5) for h in handles]
    assert await shop.send_many(batch) == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    received = await drain(warehouse, "OrderQueue", 10, timeout=30)
    assert_exactly_once_in_order(received)
    bodies = sorted(m.message_body for m in received)
    assert bodies == sorted(body for _, _, body in batch)


async def test_send_many_in_a_transaction_is_queued_at_commit(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    async with shop.transaction() as tx:
        handle = await tx.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await tx.send_many([(handle, ORDER, b"<order n='0'/>"), (handle, ORDER, b"<n1/>")])
        assert await shop.view("transmission_queue") == []  # nothing exists before COMMIT
    assert tx.sequence_numbers == [1, 2]
    received = await drain(warehouse, "OrderQueue", 2, timeout=30)
    assert [m.message_body for m in received] == [b"<order n='0'/>", b"<n1/>"]


async def test_a_malformed_send_many_is_refused_and_queues_nothing(
    deployment: Deployment,
) -> None:
    shop = await deployment.daemons["alpha"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    message = {"conversation_handle": str(handle), "message_type": ORDER, "body_length": 9}
    for messages, body in [
        ([message], b"<x/>"),  # lengths beyond the body
        ([{**message, "body_length": 2}], b"<x/>"),  # body left over
        ([{**message, "body_length": -1}], b""),
        ([], b""),
        ("not a list", b""),
    ]:
        with pytest.raises(InvalidRequest):
            await shop._call({"op": "send_many", "messages": messages}, body)
    with pytest.raises(InvalidRequest, match="at most"):
        await shop.send_many([(handle, ORDER, b"")] * (MAX_SEND_MANY + 1))
    with pytest.raises(ConversationEnded):  # one refusal refuses the whole batch
        ended = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        # sent on (ended before any SEND, it would go at once), and ended WITH ERROR:
        # the Error drops that ORDER from the transmission queue
        await shop.send(ended, ORDER, b"<first/>")
        await shop.end_conversation(ended, error_code=1, description="given up")
        await shop.send_many([(handle, ORDER, b"<a/>"), (ended, ORDER, b"<b/>")])
    assert [r for r in await shop.view("transmission_queue") if r["message_type"] == ORDER] == []


async def test_move_conversation_takes_waiting_messages_along(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    await order_dialogs(shop, warehouse, dialogs=2, per_dialog=2)
    first = await warehouse.receive("OrderQueue", top=1, timeout=5)
    target = first[0].conversation_handle
    group = uuid.uuid4()
    await warehouse.move_conversation(target, group)
    rest: list[ReceivedMessage] = await drain(warehouse, "OrderQueue", 3, timeout=30)
    moved = [m for m in rest if m.conversation_handle == target]
    assert seqs(moved) == [2] and moved[0].conversation_group_id == group
    endpoint = next(
        r
        for r in await warehouse.view("conversation_endpoints")
        if r["conversation_handle"] == str(target)
    )
    assert endpoint["unacknowledged"] == 0


async def test_a_connection_holds_a_bounded_number_of_transactions(
    deployment: Deployment,
) -> None:
    warehouse = await deployment.daemons["beta"].client()
    opened = [await warehouse.begin_transaction() for _ in range(MAX_OPEN_TRANSACTIONS)]
    with pytest.raises(TransactionError, match="open transactions"):
        await warehouse.begin_transaction()
    await opened[0].rollback()
    await (await warehouse.begin_transaction()).commit()


async def test_a_transaction_holds_a_bounded_number_of_verbs(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    tx = await shop.begin_transaction()
    for _ in range(MAX_VERBS // MAX_SEND_MANY):
        await tx.send_many([(handle, ORDER, b"")] * MAX_SEND_MANY)
    with pytest.raises(TransactionError, match="verbs"):
        await tx.send(handle, ORDER, b"")
    assert len(await tx.commit()) == MAX_VERBS  # still open: it commits what it holds


async def test_a_transaction_holds_a_bounded_amount_of_sent_bytes(tmp_path: Path) -> None:
    size = 64 * 1024
    d = shop_and_warehouse(tmp_path, FAST_RETRY, extra=f"[limits]\nmax_message_size = {size}\n")
    try:
        d.start("alpha")
        d.start("beta")
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        async with shop.transaction() as tx:
            for _ in range(SEND_BUDGET_MESSAGES):
                await tx.send(handle, ORDER, b"x" * size)
            with pytest.raises(TransactionError, match="budget"):
                await tx.send(handle, ORDER, b"x")
        assert tx.sequence_numbers == list(range(1, SEND_BUDGET_MESSAGES + 1))
        await wait_ready(warehouse, SEND_BUDGET_MESSAGES)
        assert await ready_count(warehouse) == SEND_BUDGET_MESSAGES
    finally:
        d.stop_all()
