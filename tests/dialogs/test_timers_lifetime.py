"""Conversation timers (R-DLG-11) and dialog lifetimes (R-DLG-9) on real daemons.

alpha (127.0.0.71, the shop) and beta (127.0.0.72, the warehouse). A timer puts a
DialogTimer message in its own side's queue only, survives a restart and is
replaced by a new one. A lifetime that passes while the dialog is active puts a
timeout Error (code -8489) in each side's queue; the broker then refuses new
messages for the dialog and drops what it had not delivered; both sides count it
from BEGIN DIALOG. Both show in the traces as ``timer_fired`` and ``lifetime_expired``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from brokerd.dialogs.endpoints.broker_errors import CODE_LIFETIME_EXPIRED
from brokerd.errors import RemoteError
from brokerd.tools.example import (
    CONFIRMATION,
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from brokerd.traces.writer import read_events, segment_files
from tests.daemons import drain

HOSTS = ("127.0.0.71", "127.0.0.72")
RETRY = {"initial": 0.5, "maximum": 2.0, "ack_delay": 0.005, "delayed_retry": 0.5}


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = shop_and_warehouse(tmp_path, RETRY, hosts=HOSTS)
    try:
        yield d
    finally:
        d.stop_all()


def events(d: Deployment, name: str) -> list[dict[str, object]]:
    return list(read_events(segment_files([d.daemons[name].directory / "data" / "traces"])))


def error_code(body: bytes) -> int:
    found = re.search(rb"<Code>(-?\d+)</Code>", body)
    assert found is not None, body
    return int(found.group(1))


async def test_a_timer_puts_a_dialog_timer_message_in_its_own_queue_only(
    deployment: Deployment,
) -> None:
    deployment.start("alpha")
    deployment.start("beta")
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    await shop.send(handle, ORDER, b"order 1")
    began = time.monotonic()
    await shop.begin_conversation_timer(handle, 0.5)
    (timer,) = await drain(shop, "ClientQueue", 1, timeout=10)
    assert time.monotonic() - began >= 0.45
    assert timer.is_timer and timer.conversation_handle == handle
    assert timer.message_body == b""
    (order,) = await drain(warehouse, "OrderQueue", 1)
    assert not order.is_timer
    assert await warehouse.receive("OrderQueue", timeout=0.5) == []  # not shared
    # the conversation goes on: the timer does not change it
    await shop.send(handle, ORDER, b"order 2")
    (second,) = await drain(warehouse, "OrderQueue", 1)
    assert second.message_sequence_number == 2
    # a new timer replaces the current one: it fires once, at the new time
    await shop.begin_conversation_timer(handle, 30)
    await shop.begin_conversation_timer(handle, 0.2)
    (again,) = await drain(shop, "ClientQueue", 1, timeout=10)
    assert again.is_timer
    assert await shop.receive("ClientQueue", timeout=1.0) == []
    with pytest.raises(RemoteError, match="timeout must be"):
        await shop.begin_conversation_timer(handle, -1)
    await shop.close()
    await warehouse.close()
    deployment.stop_all()
    fired = [e for e in events(deployment, "alpha") if e["event"] == "timer_fired"]
    assert len(fired) == 2 and all(e["initiator"] is True for e in fired)


async def test_a_timer_survives_a_restart(deployment: Deployment) -> None:
    deployment.start("alpha")
    shop = await deployment.daemons["alpha"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    await shop.begin_conversation_timer(handle, 2.0)
    await shop.close()
    deployment.stop("alpha")
    deployment.start("alpha")
    shop = await deployment.daemons["alpha"].client()
    (timer,) = await drain(shop, "ClientQueue", 1, timeout=15)
    assert timer.is_timer and timer.conversation_handle == handle
    await shop.close()


async def test_a_lifetime_passing_with_the_target_unreachable_errors_the_initiator(
    deployment: Deployment,
) -> None:
    deployment.start("alpha")  # beta never starts: the message cannot be delivered
    shop = await deployment.daemons["alpha"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT, lifetime=1)
    await shop.send(handle, ORDER, b"never delivered")
    assert len(await shop.view("transmission_queue")) == 1
    (error,) = await drain(shop, "ClientQueue", 1, timeout=10)
    assert error.is_error and error.conversation_handle == handle
    assert error_code(error.message_body) == CODE_LIFETIME_EXPIRED
    assert await shop.view("transmission_queue") == []  # R-DLG-9: nothing more is sent
    (row,) = [
        r
        for r in await shop.view("conversation_endpoints")
        if r["conversation_handle"] == str(handle)
    ]
    assert row["state"] == "ER"
    with pytest.raises(RemoteError, match="in error"):
        await shop.send(handle, ORDER, b"too late")
    await shop.end_conversation(handle)  # the application still ends it
    await shop.close()
    deployment.stop_all()
    traced = events(deployment, "alpha")
    (expired,) = [e for e in traced if e["event"] == "lifetime_expired"]
    begun = next(e for e in traced if e["event"] == "dialog_begun")
    assert expired["conversation_id"] == begun["conversation_id"]
    (discarded,) = [e for e in traced if e["event"] == "discarded"]
    assert discarded["seqs"] == "1"


async def test_a_lifetime_passing_errors_both_sides_and_refuses_new_messages(
    deployment: Deployment,
) -> None:
    deployment.start("alpha")
    deployment.start("beta")
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT, lifetime=2)
    await shop.send(handle, ORDER, b"in time")
    (order,) = await drain(warehouse, "OrderQueue", 1)
    errors = await drain(shop, "ClientQueue", 1, timeout=10)
    errors += await drain(warehouse, "OrderQueue", 1, timeout=10)
    assert [error_code(m.message_body) for m in errors] == [CODE_LIFETIME_EXPIRED] * 2
    assert errors[1].conversation_handle == order.conversation_handle
    with pytest.raises(RemoteError, match="in error"):
        await warehouse.send(order.conversation_handle, ORDER, b"reply too late")
    await shop.close()
    await warehouse.close()
    deployment.stop_all()
    for name in ("alpha", "beta"):
        assert [e["event"] for e in events(deployment, name)].count("lifetime_expired") == 1


async def test_both_sides_count_the_lifetime_from_begin_dialog(deployment: Deployment) -> None:
    """R-DLG-9: the first message carries what is left of the lifetime, so the target's
    deadline is the initiator's (within the rounding to whole seconds and the transit),
    not the first arrival plus the whole lifetime; both sides expire together."""
    deployment.start("alpha")
    deployment.start("beta")
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT, lifetime=5)
    await asyncio.sleep(3)
    await shop.send(handle, ORDER, b"late in the dialog's life")
    (order,) = await drain(warehouse, "OrderQueue", 1)

    def deadline(rows: list[dict[str, Any]]) -> float:
        (row,) = rows
        return datetime.fromisoformat(row["lifetime"]).timestamp()

    initiator = deadline(await shop.view("conversation_endpoints"))
    target = deadline(await warehouse.view("conversation_endpoints"))
    assert initiator - 0.5 <= target <= initiator + 1.5

    (error,) = await drain(warehouse, "OrderQueue", 1, timeout=10)
    expired = time.time()
    assert error.is_error and error_code(error.message_body) == CODE_LIFETIME_EXPIRED
    assert expired <= initiator + 2.5
    (own,) = await drain(shop, "ClientQueue", 1, timeout=10)
    assert own.is_error
    with pytest.raises(RemoteError, match="in error"):
        await warehouse.send(order.conversation_handle, CONFIRMATION, b"too late")
    await shop.close()
    await warehouse.close()
