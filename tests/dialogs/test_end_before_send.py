"""END CONVERSATION of a dialog that has sent nothing (state SO): nothing crosses the
network before the first SEND (SPEC §6), so the far service never hears of the dialog
(R-DLG-9: its endpoint comes into being with the first message), and this side's
endpoint closes at once and is removed, owing nothing to anyone (SPEC §5).

Real daemons in processes of their own: alpha (127.0.54.4, the shop) and beta
(127.0.54.5, the warehouse).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.tools import example
from tests.daemons import FAST_RETRY, drain, running, wait_until

HOSTS = ("127.0.54.4", "127.0.54.5")
SHOP, WAREHOUSE = example.SHOP_SERVICE, example.WAREHOUSE_SERVICE


@pytest.mark.parametrize("with_error", [False, True])
async def test_an_end_before_any_send_tells_no_one_and_closes_at_once(
    tmp_path: Path, with_error: bool
) -> None:
    """SPEC §6, §5, R-DLG-9, R-DLG-10: the shop begins a dialog and ends it (plainly, or
    WITH ERROR) without a SEND. No EndDialog or Error goes to the warehouse, which has
    no endpoint of the dialog; the shop's endpoint is removed without waiting for an
    answer that could never come. A dialog begun and sent on afterwards arrives alone."""
    d = example.shop_and_warehouse(tmp_path, FAST_RETRY, hosts=HOSTS)
    with running(d):
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        try:
            unused = await shop.begin_dialog(SHOP, WAREHOUSE, example.CONTRACT)
            if with_error:
                await shop.end_conversation(unused, error_code=7, description="never mind")
            else:
                await shop.end_conversation(unused)
            assert await _rows_of(shop, "transmission_queue", unused.handle) == []
            used = await shop.begin_dialog(SHOP, WAREHOUSE, example.CONTRACT)
            await shop.send(used, example.ORDER, b"<order id='1'/>")
            (got,) = await drain(warehouse, "OrderQueue", 1, timeout=10)
            assert (got.message_type_name, got.message_body) == (example.ORDER, b"<order id='1'/>")

            async def removed() -> bool:
                return await _rows_of(shop, "conversation_endpoints", unused.handle) == []

            await wait_until(removed, 10.0)
            (sent,) = await _rows_of(shop, "conversation_endpoints", used.handle)
            far = await warehouse.view("conversation_endpoints")
            assert [e["conversation_id"] for e in far] == [sent["conversation_id"]]
        finally:
            await warehouse.close()
            await shop.close()


async def _rows_of(client: BrokerClient, view: str, handle: uuid.UUID) -> list[dict[str, Any]]:
    """The rows of ``view`` that belong to the conversation handle ``handle``."""
    rows = await client.view(view)
    return [r for r in rows if r.get("conversation_handle") == str(handle)]
