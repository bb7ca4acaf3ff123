"""R-OBJ-1 with real daemons: the receiver validates a message's whole body, also when it
arrives in several fragments (R-DLG-7), and refuses it with a broker error (R-DLG-2).

alpha (the shop) declares the order type without validation, so its SENDs are not
checked; beta (the warehouse) declares it ``well_formed_xml``. A refused message
never reaches the warehouse's queue; the shop gets the Error (-9615) in its own
queue and its endpoint goes to ER (§5).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from tests.daemons import FAST_RETRY, drain, running, wait_until

FRAGMENT = 64 * 1024
"""The default fragment size: the bodies below span several fragments."""


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    beta = d.daemons["beta"].config_path
    text = beta.read_text()
    order_type = f'name = "{ORDER}"\nvalidation = "none"'
    assert order_type in text
    beta.write_text(text.replace(order_type, f'name = "{ORDER}"\nvalidation = "well_formed_xml"'))
    with running(d):
        yield d


async def _refused(shop: BrokerClient, warehouse: BrokerClient, body: bytes) -> None:
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    await shop.send(handle, ORDER, body)
    (error,) = await drain(shop, "ClientQueue", 1, timeout=30)
    assert error.conversation_handle == handle and error.is_error
    assert b"<Code>-9615</Code>" in error.message_body and b"well-formed XML" in error.message_body

    async def in_error() -> bool:
        rows = await shop.view("conversation_endpoints")
        return any(r["conversation_handle"] == str(handle) and r["state"] == "ER" for r in rows)

    await wait_until(in_error, 10)
    assert await shop.view("transmission_queue") == []


async def test_a_fragmented_body_that_is_not_xml_is_refused(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    # Every fragment but the last looks fine on its own; the whole is not XML.
    await _refused(shop, warehouse, b"<order>" + b"x" * (3 * FRAGMENT) + b"</ord")
    await _refused(shop, warehouse, b"<order>")  # one fragment, for comparison
    await _refused(shop, warehouse, b"<a>" + b"y" * (2 * FRAGMENT) + b"</a><b/>")
    assert await warehouse.receive("OrderQueue", top=10, timeout=0.5) == []

    # A well-formed body of several fragments is delivered whole.
    good = b"<order>" + b"z" * (3 * FRAGMENT) + b"</order>"
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    await shop.send(handle, ORDER, good)
    (received,) = await drain(warehouse, "OrderQueue", 1, timeout=30)
    assert received.message_body == good
    (beta_stats,) = await warehouse.view("stats")
    assert beta_stats["broker_errors_sent"] == 3
    await shop.close()
    await warehouse.close()
