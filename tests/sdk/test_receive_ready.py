"""RECEIVE outside a transaction when messages are ready: the client listener runs it
at once (no task), and its reply is written from the callback of the commit that
removed the messages. SPEC R-DLG-1 (every message to the application exactly once, in
sequence order) and §6 (a RECEIVE outside a transaction commits its removal before it
returns; a RECEIVE returns the messages of one conversation group)."""

from __future__ import annotations

import asyncio

from brokerd.tools.launcher import Deployment
from tests.daemons import assert_exactly_once_in_order
from tests.sdk.orders import order_dialogs, ready_count


async def test_pipelined_receives_with_messages_ready_each_get_their_own_messages(
    deployment: Deployment,
) -> None:
    """Twenty RECEIVEs pipelined on one connection while 120 orders of six dialogs wait:
    each returns one group's messages in order, no message is returned twice, every
    one is returned, and after the daemon restarts none comes back (each removal was
    committed before its reply)."""
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    sent = await order_dialogs(shop, warehouse, dialogs=6, per_dialog=20)
    batches = await asyncio.gather(
        *(warehouse.receive("OrderQueue", top=7, timeout=0) for _ in range(20))
    )
    for batch in batches:
        assert len({m.conversation_group_id for m in batch}) <= 1
    received = [m for batch in batches for m in batch]
    while len(received) < 120:
        more = await warehouse.receive("OrderQueue", top=50, timeout=1.0)
        assert more, f"only {len(received)} of 120 received"
        received += more
    assert_exactly_once_in_order(received, sent)
    await warehouse.close()
    deployment.kill("beta")
    deployment.start("beta")
    warehouse = await deployment.daemons["beta"].client()
    assert await ready_count(warehouse) == 0
    assert await warehouse.receive("OrderQueue", top=100, timeout=0.5) == []
