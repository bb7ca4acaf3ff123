"""How dialogs end, on real daemons (SPEC §6, R-DLG-10).

alpha (127.0.0.73, the shop) and beta (127.0.0.74, the warehouse). Only the
broker sends the system message types, and END CONVERSATION WITH ERROR takes a
code greater than 0 (§6).
"""

from __future__ import annotations

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
from protocol.dialog import DIALOG_TIMER, END_DIALOG, ERROR
from protocol.errors import ContractViolation, InvalidErrorCode, SystemMessageType
from tests.daemons import FAST_RETRY, drain

HOSTS = ("127.0.0.73", "127.0.0.74")


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = shop_and_warehouse(tmp_path, FAST_RETRY, hosts=HOSTS)
    d.start("alpha")
    d.start("beta")
    try:
        yield d
    finally:
        d.stop_all()


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
    (row,) = await warehouse.conversation_endpoints()
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
    (row,) = await shop.conversation_endpoints()
    assert row["state"] == "DO"
    await shop.close()
