"""The conversation_endpoints and transmission_queue views as the SDK returns them, on real
daemons (R-PROTO-4, R-DLG-9, R-DLG-11, SPEC §6): each endpoint's conversation group, when
its lifetime passes and when its timer fires; each waiting message's EndDialog and Error
flags."""

from __future__ import annotations

import time

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

    endpoints = {e.conversation_handle: e for e in await shop.conversation_endpoints()}
    first, second = endpoints[errored.handle], endpoints[ended.handle]
    assert first.conversation_group_id != second.conversation_group_id
    assert first.lifetime is not None and first.dialog_timer is not None
    assert abs(first.lifetime.timestamp() - (began + 600)) < 5
    assert abs(first.dialog_timer.timestamp() - (began + 300)) < 5
    assert second.lifetime is None and second.dialog_timer is None
    assert first.state == "DO" and first.is_initiator and first.far_service == NOWHERE

    flags = {
        (r.conversation_handle, r.message_sequence_number): (
            r.is_conversation_error,
            r.is_end_of_dialog,
        )
        for r in await shop.transmission_queue()
    }
    assert flags == {
        (errored.handle, 2): (True, False),  # the order was dropped by END WITH ERROR
        (ended.handle, 1): (False, False),
        (ended.handle, 2): (False, True),
    }
    (queued,) = [r for r in await shop.transmission_queue() if r.message_sequence_number == 1]
    assert queued.enqueued_at is not None and "route" in queued.transmission_status.lower()
    await shop.close()


async def test_every_named_view_comes_typed_from_a_real_daemon(deployment: Deployment) -> None:
    """Each view the SDK names returns dataclass rows whose every column the daemon sent
    (a missing column would raise RemoteProtocolError), with handles as UUIDs."""
    shop = await deployment.daemons["alpha"].client()
    dialog = await shop.begin_dialog(SHOP_SERVICE, NOWHERE, CONTRACT)
    await dialog.send(ORDER, b"waits")
    (queue,) = await shop.queues()
    assert (queue.queue, queue.status, queue.poison_rollbacks) == ("ClientQueue", "on", 5)
    routes = await shop.routes()
    assert {r.name for r in routes} >= {"ToWarehouse", "AutoCreatedLocal"}
    assert all(r.lifetime is None or r.lifetime.year > 2000 for r in routes)
    assert await shop.queue_messages("ClientQueue") == []
    ages = await shop.endpoint_ages()
    assert sum(a.endpoints for a in ages if a.state == "CO") == 1
    (waiting,) = await shop.oldest_waiting()
    assert waiting.conversation_handle == dialog.handle and waiting.waiting == 1
    assert await shop.quarantined() == []
    links = await shop.broker_connections()
    assert all(link.frames_sent >= 0 for link in links)
    await shop.close()
