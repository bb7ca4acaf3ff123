"""Admin views of any size reach the SDK; a reply that cannot be sent is an error, not silence."""

from __future__ import annotations

import asyncio

from brokerd.tools.example import CONTRACT, SHOP_SERVICE, WAREHOUSE_SERVICE
from brokerd.tools.launcher import Deployment

ENDPOINTS = 4_000
"""About 1.4 MB of conversation_endpoints rows: more than a reply's 1 MiB meta limit."""


async def test_a_view_larger_than_the_meta_limit_arrives_whole(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    async with shop.transaction() as tx:  # one commit for all of them
        for _ in range(ENDPOINTS):
            await tx.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    rows = await asyncio.wait_for(shop.conversation_endpoints(), 30)
    assert len(rows) == ENDPOINTS
    assert {r.state for r in rows} == {"SO"}
    assert len({r.conversation_handle for r in rows}) == ENDPOINTS
    await shop.close()
