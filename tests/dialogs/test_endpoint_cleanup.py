"""Closed endpoints are removed (SPEC §5, Decision; ``brokerd.dialogs.lifetime.cleanup``):
an initiator's as soon as it is closed and its last acknowledgement has gone, a target's
``limits.closed_endpoint_keep`` seconds after its close, from memory and from its file;
a daemon killed mid-clean-up finishes it after a restart; a copy of an old message for a
removed target endpoint is not delivered again and begins no dialog.

alpha (127.0.0.101, the shop) and beta (127.0.0.102, the warehouse), real daemons.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.tools.example import (
    CONFIRMATION,
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from protocol.acks import Acknowledgement
from protocol.dialog import END_DIALOG, FLAG_END_DIALOG, FLAG_INITIATOR, DialogHeader
from tests.daemons import FAST_RETRY, drain, running, wait_until
from tests.hostile import HostileBroker, order_message

HOSTS = ("127.0.0.101", "127.0.0.102")
KEEP = 4.0
DIALOGS = 200
TABLES = ("conversation_endpoints", "queue_messages", "transmission_queue", "send_keys")


def deployment_with_keep(root: Path, keep: float = KEEP) -> Deployment:
    return shop_and_warehouse(
        root, FAST_RETRY, hosts=HOSTS, extra=f"[limits]\nclosed_endpoint_keep = {keep}\n"
    )


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running(deployment_with_keep(tmp_path)) as d:
        yield d


async def database_file(client: BrokerClient) -> Path:
    (row,) = [r for r in await client.view("databases") if r["database"] != "msdb"]
    return Path(row["file"])


def rows_in(path: Path) -> dict[str, int]:
    """Rows of a conversation's tables in a database file, read with sqlite3 itself."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in TABLES}


async def endpoints(client: BrokerClient) -> list[dict[str, object]]:
    return await client.view("conversation_endpoints")


async def converse_and_end(shop: BrokerClient, warehouse: BrokerClient, count: int) -> None:
    """``count`` dialogs begun, used both ways and ended by both sides (the target first)."""
    handles = [
        await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(count)
    ]
    for n, handle in enumerate(handles):
        await shop.send(handle, ORDER, f"<order id='{n}'/>".encode(), key=f"order-{n}")
    orders = await drain(warehouse, "OrderQueue", count)
    for order in orders:
        await warehouse.send(order.conversation_handle, CONFIRMATION, b"<confirmed/>")
        await warehouse.end_conversation(order.conversation_handle)
    replies = await drain(shop, "ClientQueue", 2 * count)
    kinds = sorted(m.message_type_name for m in replies)
    assert kinds == [CONFIRMATION] * count + [END_DIALOG] * count
    for handle in handles:
        await shop.end_conversation(handle)


async def test_closed_endpoints_are_removed_from_memory_and_file(deployment: Deployment) -> None:
    """200 dialogs ended by both sides: the initiator's endpoints go at once, the target's
    after the keep; no row of theirs stays in either file (idempotency keys included)."""
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    try:
        await converse_and_end(shop, warehouse, DIALOGS)
        ended = time.monotonic()
        shop_file, warehouse_file = await database_file(shop), await database_file(warehouse)

        async def initiators_gone() -> bool:
            return not await endpoints(shop) and rows_in(shop_file)["conversation_endpoints"] == 0

        await wait_until(initiators_gone, 15)
        assert time.monotonic() - ended < KEEP, "the initiator's endpoints waited for the keep"
        kept = await endpoints(warehouse)
        assert len(kept) == DIALOGS and {row["state"] for row in kept} == {"CD"}

        async def targets_gone() -> bool:  # from memory at once, from the file at its commit
            return not await endpoints(warehouse) and rows_in(warehouse_file) == dict.fromkeys(
                TABLES, 0
            )

        await wait_until(targets_gone, 20)
        assert time.monotonic() - ended >= KEEP - 0.5
        assert rows_in(shop_file) == dict.fromkeys(TABLES, 0)
        (stats,) = await warehouse.view("stats")
        assert stats["closed_endpoints_removed"] == DIALOGS
    finally:
        await shop.close()
        await warehouse.close()


async def test_a_daemon_killed_during_the_clean_up_finishes_it_after_a_restart(
    deployment: Deployment,
) -> None:
    """SIGKILL while the target's closed endpoints wait (and the initiator's are being
    removed): after a restart each side removes what its file still holds."""
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    await converse_and_end(shop, warehouse, DIALOGS)
    shop_file, warehouse_file = await database_file(shop), await database_file(warehouse)
    await shop.close()
    await warehouse.close()
    deployment.kill("alpha")  # the initiator's removal in flight, or not begun
    await wait_until(lambda: _is_closed_everywhere(warehouse_file), 15)
    deployment.kill("beta")  # every target endpoint closed, kept, not removed yet
    assert rows_in(warehouse_file)["conversation_endpoints"] == DIALOGS
    deployment.start("alpha")
    deployment.start("beta")
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    try:

        async def all_gone() -> bool:
            return rows_in(shop_file) == dict.fromkeys(TABLES, 0) and rows_in(
                warehouse_file
            ) == dict.fromkeys(TABLES, 0)

        await wait_until(all_gone, 30)
        assert not await endpoints(shop) and not await endpoints(warehouse)
    finally:
        await shop.close()
        await warehouse.close()


async def _is_closed_everywhere(path: Path) -> bool:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        states = {row[0] for row in conn.execute("SELECT state FROM conversation_endpoints")}
    return states == {"CD"}


async def test_a_copy_of_an_old_message_for_a_removed_target_is_not_delivered(
    tmp_path: Path,
) -> None:
    """A hostile broker plays the shop's: a dialog of three messages (the last an
    EndDialog), the warehouse ends it, the shop acknowledges its EndDialog: the target is
    closed. While it is kept, copies are acknowledged again and not delivered; once it is
    removed, copies of the later messages begin no dialog and are not delivered."""
    d = deployment_with_keep(tmp_path, keep=1.5)
    with running(d, "beta"):
        warehouse = await d.daemons["beta"].client()
        mallory = HostileBroker(d.cert_dir)
        await mallory.connect(HOSTS[1])
        try:
            shop_instance, cid = uuid.uuid4(), uuid.uuid4()
            dialog = [
                order_message(shop_instance, cid, 1, b"<order id='1'/>"),
                order_message(shop_instance, cid, 2, b"<order id='2'/>"),
                order_message(shop_instance, cid, 3, b"", END_DIALOG, FLAG_END_DIALOG),
            ]
            await mallory.send_fragments(dialog)
            got = await drain(warehouse, "OrderQueue", 3)
            assert [m.message_sequence_number for m in got] == [1, 2, 3]
            await warehouse.end_conversation(got[0].conversation_handle)
            # the shop's broker acknowledges the warehouse's EndDialog (its message 1)
            ack = DialogHeader(
                cid,
                SHOP_SERVICE,
                WAREHOUSE_SERVICE,
                shop_instance,
                None,
                CONTRACT,
                flags=FLAG_INITIATOR,
                ack=Acknowledgement(through=1),
            )
            await mallory.send_acks([ack])

            async def closed() -> bool:
                rows = await endpoints(warehouse)
                return [r["state"] for r in rows] == ["CD"]

            await wait_until(closed, 10)
            await mallory.send_fragments(dialog)  # kept: acknowledged again, not delivered
            assert await warehouse.receive("OrderQueue", timeout=0.5) == []

            async def removed() -> bool:
                return not await endpoints(warehouse)

            await wait_until(removed, 10)
            (before,) = await warehouse.view("stats")
            await mallory.send_fragments(dialog[1:])  # removed: no dialog, nothing delivered
            await asyncio.sleep(0.5)
            assert await warehouse.receive("OrderQueue", timeout=0.5) == []
            assert not await endpoints(warehouse)
            (after,) = await warehouse.view("stats")
            assert after["dropped"] >= before["dropped"] + 2
        finally:
            await mallory.close()
            await warehouse.close()


async def test_a_target_whose_initiator_endpoint_is_gone_is_told(deployment: Deployment) -> None:
    """A message of a target for an initiator endpoint that is gone (here ended WITH
    CLEANUP, which tells no one) is answered with a broker error (-8426): the target's
    side goes into error instead of retrying for ever, and once ended it closes."""
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    try:
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(handle, ORDER, b"<order id='1'/>")
        (order,) = await drain(warehouse, "OrderQueue", 1)
        await shop.end_conversation(handle, cleanup=True)
        await warehouse.send(order.conversation_handle, CONFIRMATION, b"<confirmed/>")
        (error,) = await drain(warehouse, "OrderQueue", 1)
        assert error.is_error and b"<Code>-8426</Code>" in error.message_body
        await warehouse.end_conversation(order.conversation_handle)

        async def closed_and_removed() -> bool:
            rows = await endpoints(warehouse)
            return rows == [] or [r["state"] for r in rows] == ["CD"]

        await wait_until(closed_and_removed, 10)
        assert not await endpoints(shop)
        assert await shop.receive("ClientQueue", timeout=0.3) == []
    finally:
        await shop.close()
        await warehouse.close()
