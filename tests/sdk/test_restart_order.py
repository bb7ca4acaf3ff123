"""Exactly once, in order, across a restart of the receiving daemon (R-DLG-1, R-DLG-7, R-DLG-13).

A large message's fragments go out after the small messages queued with it (small
messages never wait behind a large one), so the target stores the later, small
messages first, held until the large one is complete. Their rows are older than the
large message's row. After a restart the ready messages must still come out in
sequence order, not in the order their rows were written.
"""

from __future__ import annotations

import asyncio

from brokerd.tools.example import CONTRACT, ORDER, SHOP_SERVICE, WAREHOUSE_SERVICE
from brokerd.tools.launcher import Deployment
from tests.daemons import drain
from tests.sdk.orders import seqs, wait_ready

FRAGMENT = 64 * 1024


async def test_messages_that_overtook_a_large_one_come_after_it_after_a_restart(
    deployment: Deployment,
) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handles = [await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(3)]
    large = b"<order n='0' pad='" + b"x" * (3 * FRAGMENT) + b"'/>"
    async with shop.transaction() as tx:  # one commit: all go to the link together
        for handle in handles:
            await tx.send(handle, ORDER, large)
            for n in range(1, 4):
                await tx.send(handle, ORDER, f"<order n='{n}'/>".encode())
    await wait_ready(warehouse, 12)
    await warehouse.close()

    deployment.kill("beta")  # SIGKILL: the ready index is rebuilt from the file
    await asyncio.to_thread(deployment.start, "beta")
    fresh = await deployment.daemons["beta"].client()
    got = await drain(fresh, "OrderQueue", 12, timeout=20)
    per_conversation: dict[object, list[int]] = {}
    for message in got:
        per_conversation.setdefault(message.conversation_handle, []).append(
            message.message_sequence_number
        )
    assert sorted(per_conversation.values()) == [[1, 2, 3, 4]] * 3, seqs(got)
    for message in got:
        if message.message_sequence_number == 1:
            assert message.message_body == large
    for client in (shop, fresh):
        await client.close()
