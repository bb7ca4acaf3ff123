"""Several fragments under one seal between two real daemons: the fragments of one pump
round go as FRAGMENTS frames (protocol version 2), or one frame each with
``fragments_per_frame = 1``; either way every message arrives exactly once and in
order (R-PROTO-1, R-DLG-1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from tests.daemons import FAST_RETRY, PROXY_HOST, drain, proxied


@pytest.mark.parametrize(("per_frame", "coalesced"), [(4096, True), (1, False)])
async def test_the_messages_of_a_round_share_frames_unless_told_not_to(
    tmp_path: Path, per_frame: int, coalesced: bool
) -> None:
    d = shop_and_warehouse(
        tmp_path,
        FAST_RETRY,
        beta_route_host=PROXY_HOST,
        endpoint_extra=f"fragments_per_frame = {per_frame}",
    )
    async with proxied(d) as proxy:
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        bodies = [f"<order n='{n}'/>".encode() for n in range(200)]
        await shop.send_many([(handle, ORDER, body) for body in bodies])
        received = await drain(warehouse, "OrderQueue", 200, timeout=30)
        assert [m.message_body for m in received] == bodies
        assert [m.message_sequence_number for m in received] == list(range(1, 201))
        frames = proxy.stats.fragments_seen
        if coalesced:
            assert frames < 20, frames  # 200 fragments in a few frames
        else:
            assert frames == 200
        (stats,) = await shop.view("stats")
        assert stats["retransmissions"] == 0
        await shop.close()
        await warehouse.close()
