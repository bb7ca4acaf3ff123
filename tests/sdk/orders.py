"""Orders from the shop to the warehouse, for the SDK tests."""

from __future__ import annotations

import uuid

from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.tools.example import CONTRACT, ORDER, SHOP_SERVICE, WAREHOUSE_SERVICE
from tests.daemons import wait_until

Sent = dict[uuid.UUID, list[bytes]]


async def ready_count(warehouse: BrokerClient) -> int:
    rows = await warehouse.view("queues")
    return sum(r["ready_messages"] for r in rows if r["queue"] == "OrderQueue")


async def wait_ready(warehouse: BrokerClient, count: int, timeout: float = 20) -> None:
    async def check() -> bool:
        return await ready_count(warehouse) >= count

    await wait_until(check, timeout)


async def order_dialogs(
    shop: BrokerClient, warehouse: BrokerClient, dialogs: int, per_dialog: int
) -> Sent:
    """``dialogs`` dialogs with ``per_dialog`` orders each, sent interleaved (one order of
    each dialog in turn); returns the bodies per shop handle once all are ready."""
    handles = [
        await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(dialogs)
    ]
    sent: Sent = {h: [] for h in handles}
    for n in range(per_dialog):
        for d, handle in enumerate(handles):
            body = f"<order dialog='{d}' n='{n}'/>".encode()
            await shop.send(handle, ORDER, body)
            sent[handle].append(body)
    await wait_ready(warehouse, dialogs * per_dialog)
    return sent


def seqs(messages: list[ReceivedMessage]) -> list[int]:
    return [m.message_sequence_number for m in messages]
