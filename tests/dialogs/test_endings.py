"""How dialogs end, on real daemons (SPEC §6, R-DLG-10).

alpha (127.0.0.73, the shop) and beta (127.0.0.74, the warehouse). Only the
broker sends the system message types, and END CONVERSATION WITH ERROR takes a
code greater than 0 (§6). A side that has ended receives nothing more.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.tools.example import (
    CONFIRMATION,
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from protocol.dialog import DIALOG_TIMER, END_DIALOG, ERROR
from protocol.errors import ContractViolation, InvalidErrorCode, SystemMessageType
from tests.daemons import FAST_RETRY, drain, running, wait_until

HOSTS = ("127.0.0.73", "127.0.0.74")


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running(shop_and_warehouse(tmp_path, FAST_RETRY, hosts=HOSTS)) as d:
        yield d


async def test_an_application_cannot_send_a_system_message_type(deployment: Deployment) -> None:
    """SPEC §6: EndDialog, Error and DialogTimer are in no contract; SEND refuses them,
    alone, in send_many and in a transaction, and the peer receives nothing."""
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    for message_type in (END_DIALOG, ERROR, DIALOG_TIMER):
        with pytest.raises(SystemMessageType) as refused:
            await shop.send(handle, message_type, b"")
        assert isinstance(refused.value, ContractViolation)
        with pytest.raises(SystemMessageType):
            await shop.send_many([(handle, ORDER, b"fine"), (handle, message_type, b"")])
        with pytest.raises(SystemMessageType):
            async with shop.transaction() as tx:
                await tx.send(handle, message_type, b"")
    await shop.send(handle, ORDER, b"order 1")
    (order,) = await drain(warehouse, "OrderQueue", 1)
    assert order.message_sequence_number == 1 and order.message_body == b"order 1"
    assert await warehouse.receive("OrderQueue", timeout=0.5) == []
    (row,) = await warehouse.view("conversation_endpoints")
    assert row["state"] == "CO"
    await shop.close()
    await warehouse.close()


@pytest.mark.parametrize("code", [0, -8489])
async def test_end_with_error_takes_a_code_greater_than_zero(
    deployment: Deployment, code: int
) -> None:
    """SPEC §6: codes of 0 and below are the broker's own; the dialog stays as it was."""
    shop = await deployment.daemons["alpha"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    with pytest.raises(InvalidErrorCode):
        await shop.end_conversation(handle, error_code=code, description="made up")
    with pytest.raises(InvalidErrorCode):
        async with shop.transaction() as tx:
            await tx.end_conversation(handle, error_code=code, description="made up")
    await shop.send(handle, ORDER, b"still open")
    await shop.end_conversation(handle, error_code=1, description="a real one")
    (row,) = await shop.view("conversation_endpoints")
    assert row["state"] == "DO"
    await shop.close()


async def queued(client: BrokerClient, queue: str) -> int:
    (row,) = [q for q in await client.view("queues") if q["queue"] == queue]
    return int(row["ready_messages"])


GONE = "gone"
"""The state :func:`endpoint_state` gives once the endpoint has been removed: an
initiator's closed endpoint is, once it owes no acknowledgement (SPEC §5, R-PROTO-4), so a
look may find it ``CD`` or find it gone already."""


async def endpoint_state(client: BrokerClient) -> str:
    """The state of the daemon's one endpoint, or :data:`GONE`."""
    rows = await client.view("conversation_endpoints")
    if not rows:
        return GONE
    (row,) = rows
    return str(row["state"])


async def test_a_side_that_ended_receives_nothing_more(deployment: Deployment) -> None:
    """SPEC §6, R-DLG-10: a local END removes the conversation's waiting messages, also
    across a restart; the other side's EndDialog then only closes the endpoint (DO -> CD),
    which the initiator then removes (SPEC §5)."""
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    await shop.send(handle, ORDER, b"order")
    (order,) = await drain(warehouse, "OrderQueue", 1)
    for n in (1, 2):
        await warehouse.send(order.conversation_handle, CONFIRMATION, b"confirmation %d" % n)
    await wait_until(lambda: _equals(queued(shop, "ClientQueue"), 2))
    await shop.end_conversation(handle)
    assert await queued(shop, "ClientQueue") == 0
    assert await shop.receive("ClientQueue", timeout=0.3) == []
    await shop.close()
    deployment.stop("alpha")
    deployment.start("alpha")
    shop = await deployment.daemons["alpha"].client()
    assert await shop.receive("ClientQueue", timeout=0.3) == []
    assert await endpoint_state(shop) == "DO"

    (end,) = await drain(warehouse, "OrderQueue", 1)
    assert end.is_end_dialog
    await warehouse.end_conversation(order.conversation_handle)
    await wait_until(lambda: _equals(endpoint_state(shop), GONE))
    await wait_until(lambda: _equals(endpoint_state(warehouse), "CD"))
    assert await shop.receive("ClientQueue", timeout=0.5) == []
    assert (
        await shop.view("transmission_queue") == []
        and await warehouse.view("transmission_queue") == []
    )
    await shop.close()
    await warehouse.close()


async def _equals(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


def kinds(messages: list[ReceivedMessage]) -> list[str]:
    return [
        "timer"
        if m.is_timer
        else "error"
        if m.is_error
        else "end"
        if m.is_end_dialog
        else m.message_body.decode()
        for m in messages
    ]


async def test_a_timer_then_an_error_come_before_waiting_messages(
    deployment: Deployment,
) -> None:
    """R-DLG-10: a DialogTimer, then an Error, is received before the dialog's other
    waiting messages; an EndDialog in sequence order, after them. The order holds across
    a restart (recovery rebuilds it)."""
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    errored = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    ended = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    for handle in (errored, ended):
        await shop.send(handle, ORDER, b"order")
    targets = {m.conversation_handle for m in await drain(warehouse, "OrderQueue", 2)}
    for target in sorted(targets):
        for n in (1, 2):
            await warehouse.send(target, CONFIRMATION, b"c%d" % n)
    await wait_until(lambda: _equals(queued(shop, "ClientQueue"), 4))
    # One target ends with an error, the other plainly; then each shop side's timer fires.
    first, second = sorted(targets)
    await warehouse.end_conversation(first, error_code=5, description="out of stock")
    await warehouse.end_conversation(second)
    await wait_until(lambda: _equals(queued(shop, "ClientQueue"), 6))
    for handle in (errored, ended):
        await shop.begin_conversation_timer(handle, 0.1)
    await wait_until(lambda: _equals(queued(shop, "ClientQueue"), 8))
    expected = [["timer", "error", "c1", "c2"], ["timer", "c1", "c2", "end"]]

    async def ready_order(client: BrokerClient) -> list[list[str]]:
        """Each conversation's messages in RECEIVE order, looked at and put back."""
        seen = []
        async with client.transaction() as tx:
            for _ in (1, 2):
                seen.append(kinds(await tx.receive("ClientQueue", top=10, timeout=5)))
            await tx.rollback()
        return sorted(seen, key=lambda k: "end" in k)

    assert await ready_order(shop) == expected
    await shop.close()
    deployment.stop("alpha")
    deployment.start("alpha")
    shop = await deployment.daemons["alpha"].client()
    assert await ready_order(shop) == expected
    await shop.close()
    await warehouse.close()


async def test_an_error_ending_reaches_a_peer_that_was_away(deployment: Deployment) -> None:
    """R-DLG-10: END WITH ERROR drops the messages the target never acknowledged; the
    Error that follows them closes the gap they leave and is delivered on its own, so
    both sides can end and close (ER, then CD on both; the initiator's then removed, SPEC §5)."""
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    await shop.send(handle, ORDER, b"order 1")
    (first,) = await drain(warehouse, "OrderQueue", 1)
    await wait_until(lambda: _equals(shop.transmission_queue(), []))
    await warehouse.close()
    deployment.stop("beta")
    for n in (2, 3, 4):
        await shop.send(handle, ORDER, b"order %d" % n)
    await shop.end_conversation(handle, error_code=5, description="cancelled")
    (waiting,) = await shop.view("transmission_queue")
    assert waiting["is_conversation_error"] and waiting["message_sequence_number"] == 5
    deployment.start("beta")
    warehouse = await deployment.daemons["beta"].client()
    (error,) = await drain(warehouse, "OrderQueue", 1, timeout=30)
    assert error.is_error and error.conversation_handle == first.conversation_handle
    assert b"<Code>5</Code>" in error.message_body
    assert await endpoint_state(warehouse) == "ER"
    await warehouse.end_conversation(first.conversation_handle)
    await wait_until(lambda: _equals(endpoint_state(shop), GONE))
    await wait_until(lambda: _equals(endpoint_state(warehouse), "CD"))
    assert (
        await shop.view("transmission_queue") == []
        and await warehouse.view("transmission_queue") == []
    )
    assert await warehouse.receive("OrderQueue", timeout=0.3) == []
    await shop.close()
    await warehouse.close()
