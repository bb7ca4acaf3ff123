"""The conversation_endpoints and transmission_queue views as the SDK returns them, on real
daemons (R-PROTO-4, R-DLG-9, R-DLG-11, SPEC §6): each endpoint's conversation group, when
its lifetime passes and when its timer fires; each waiting message's EndDialog and Error
flags."""

from __future__ import annotations

import time
import uuid
from datetime import datetime

from brokerd.tools.example import CONTRACT, ORDER, SHOP_SERVICE
from brokerd.tools.launcher import Deployment

NOWHERE = "//nowhere/Service"
"""No route leads there: what is sent stays in the transmission queue."""


async def test_views_show_group_lifetime_timer_and_ending_flags(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    began = time.time()
    errored = await shop.begin_dialog(SHOP_SERVICE, NOWHERE, CONTRACT, lifetime=600)
    ended = await shop.begin_dialog(SHOP_SERVICE, NOWHERE, CONTRACT)
    await shop.begin_conversation_timer(errored, 300)
    await shop.send(errored, ORDER, b"dropped by the error")
    await shop.end_conversation(errored, error_code=7, description="out of stock")
    await shop.send(ended, ORDER, b"waits")
    await shop.end_conversation(ended)

    rows = {r["conversation_handle"]: r for r in await shop.conversation_endpoints()}
    first, second = rows[str(errored)], rows[str(ended)]
    assert uuid.UUID(first["conversation_group_id"]) != uuid.UUID(second["conversation_group_id"])
    assert abs(datetime.fromisoformat(first["lifetime"]).timestamp() - (began + 600)) < 5
    assert abs(datetime.fromisoformat(first["dialog_timer"]).timestamp() - (began + 300)) < 5
    assert second["lifetime"] == "" and second["dialog_timer"] == ""

    flags = {
        (r["conversation_handle"], r["message_sequence_number"]): (
            r["is_conversation_error"],
            r["is_end_of_dialog"],
        )
        for r in await shop.transmission_queue()
    }
    assert flags == {
        (str(errored), 2): (True, False),  # the order was dropped by END WITH ERROR
        (str(ended), 1): (False, False),
        (str(ended), 2): (False, True),
    }
    await shop.close()
