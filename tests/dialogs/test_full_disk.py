"""A full disk in the middle of pipelined SENDs (R-DLG-1, R-DLG-13): every SEND of the
failed commit must be refused with a clear error and nothing of them stored, and once
there is room the dialog must go on with the next number, through the transmission
queue and directly alike. A SEND numbered after a failed one is refused too, even when
it would fit (``brokerd.storage.chains``): stored alone, it would leave the numbers
before it missing for ever.

The broker runs in this process (``Broker``, as ``brokerd run`` builds it) so that the
test can fill its database: SQLite's ``max_page_count`` on the committer's own
connection makes every write that needs a new page fail with SQLITE_FULL ("database or
disk is full"), as a full disk does.
"""

from __future__ import annotations

import asyncio
import errno
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.sdk.messages import ReceivedMessage
from brokerd.server.daemon import Broker
from brokerd.storage.body_files import STORED_FROM
from brokerd.tools import example
from brokerd.tools.launcher import Deployment
from protocol.errors import RemoteError
from tests.daemons import (
    FAST_RETRY,
    assert_exactly_once_in_order,
    client_of,
    drain,
    in_process,
    running,
)
from tests.disks import limit_pages

HOST = "127.0.0.246"
BIG = 30_000
"""Bytes of a body: more than a page, so that every message needs new pages, and less
than ``body_files.STORED_FROM``, so that it stays in its row (a full segment file is
``tests/storage/test_body_files.py``'s)."""


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    daemon = Deployment(tmp_path).add("solo", HOST, example.two_services_database("shop"))
    async with in_process(daemon.config_path) as broker:
        yield broker


async def _limit(broker: Broker, pages: int | None, database: str = "shop") -> None:
    await limit_pages(broker.databases[database].store, pages)


async def _stored_send_sequence(broker: Broker, handle: uuid.UUID) -> int:
    rows = await broker.databases["shop"].store.query(
        "SELECT send_sequence FROM conversation_endpoints WHERE conversation_handle = ?",
        (str(handle),),
    )
    return int(rows[0][0])


async def _first_message(
    broker: Broker,
) -> tuple[BrokerClient, uuid.UUID, list[ReceivedMessage]]:
    """A client, a dialog from the shop to the warehouse, and its first message, received."""
    client = await client_of(broker)
    handle = await client.begin_dialog(
        example.SHOP_SERVICE, example.WAREHOUSE_SERVICE, example.CONTRACT
    )
    await client.send(handle, example.ORDER, b"1")
    return client, handle, await drain(client, "OrderQueue", 1)


@pytest.mark.parametrize("direct", [True, False])
async def test_pipelined_sends_failing_together_leave_no_gap(broker: Broker, direct: bool) -> None:
    await _fail_then_resume(broker, direct, [BIG] * 5)


@pytest.mark.parametrize("direct", [True, False])
async def test_a_send_after_a_failed_one_is_refused_even_if_it_fits(
    broker: Broker, direct: bool
) -> None:
    """The first SEND needs new pages and fails; the small ones after it would fit in the
    file's free room, and are refused because they follow it."""
    await _fail_then_resume(broker, direct, [BIG, 1, 1, 1, 1])


async def _fail_then_resume(broker: Broker, direct: bool, sizes: list[int]) -> None:
    client, handle, received = await _first_message(broker)
    try:
        if not direct:
            await client.alter_queue("OrderQueue", False)  # through the transmission queue
        await _limit(broker, 0)
        futures = [
            client.send_nowait(handle, example.ORDER, bytes([n]) * size)
            for n, size in zip(range(2, 7), sizes, strict=True)
        ]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(o, RemoteError) for o in outcomes), outcomes
        assert "full" in str(outcomes[0]), outcomes
        assert all("full" in str(o) or "earlier write" in str(o) for o in outcomes), outcomes
        await _limit(broker, None)
        assert await _stored_send_sequence(broker, handle) == 1  # no number given back
        await asyncio.sleep(1.5)  # what the database received is reloaded from its file
        for n in range(2, 7):
            await client.send(handle, example.ORDER, str(n).encode())
        if not direct:
            await client.alter_queue("OrderQueue", True)
        received += await drain(client, "OrderQueue", 5, timeout=10)
        assert [m.message_body for m in received] == [str(n).encode() for n in range(1, 7)]
        assert_exactly_once_in_order(received)
        assert await client.receive("OrderQueue", timeout=0.5) == []
    finally:
        await client.close()


async def test_a_transaction_of_sends_failing_on_a_full_disk_leaves_no_gap(
    broker: Broker,
) -> None:
    """A transaction's SENDs are undone last-first: the numbering goes back to the number
    before the first of them, and the SENDs that follow take it (R-DLG-1)."""
    client, handle, received = await _first_message(broker)
    try:
        await _limit(broker, 0)
        with pytest.raises(RemoteError, match="full"):
            async with client.transaction() as tx:
                for n in range(2, 5):
                    await tx.send(handle, example.ORDER, bytes([n]) * BIG)
        await _limit(broker, None)
        await asyncio.sleep(1.5)
        assert [await client.send(handle, example.ORDER, str(n).encode()) for n in (2, 3)] == [2, 3]
        received += await drain(client, "OrderQueue", 2, timeout=10)
        assert [m.message_body for m in received] == [b"1", b"2", b"3"]
        assert_exactly_once_in_order(received)
    finally:
        await client.close()


async def test_messages_arriving_on_a_full_disk_wait_at_the_sender_and_lose_nothing(
    tmp_path: Path,
) -> None:
    """A receiver whose disk is full stores nothing of what arrives and acknowledges
    nothing; the sender keeps every message and retransmits, and once there is room all
    of them arrive, exactly once and in order (R-DLG-1, R-DLG-6)."""
    deployment = example.shop_and_warehouse(
        tmp_path, retry=FAST_RETRY, hosts=("127.0.0.244", "127.0.0.245")
    )
    with running(deployment, "alpha"):
        async with in_process(deployment.daemons["beta"].config_path) as beta:
            shop = await deployment.daemons["alpha"].client()
            warehouse = await client_of(beta)
            try:
                handle = await shop.begin_dialog(
                    example.SHOP_SERVICE, example.WAREHOUSE_SERVICE, example.CONTRACT
                )
                await shop.send(handle, example.ORDER, b"first")
                received = await drain(warehouse, "OrderQueue", 1, timeout=20)
                await _limit(beta, 0, "warehouse")
                bodies = [bytes([n]) * BIG for n in range(2, 12)]
                for body in bodies:
                    await shop.send(handle, example.ORDER, body)  # committed at the sender
                await asyncio.sleep(2.0)
                assert await warehouse.receive("OrderQueue", timeout=0.5) == []
                assert beta.engine.stats.dropped > 0  # refused while the file is full
                await _limit(beta, None, "warehouse")
                received += await drain(warehouse, "OrderQueue", len(bodies), timeout=30)
                assert [m.message_body for m in received] == [b"first", *bodies]
                assert_exactly_once_in_order(received)
                assert await warehouse.receive("OrderQueue", timeout=0.5) == []
            finally:
                await shop.close()
                await warehouse.close()


async def test_a_reply_committed_after_a_failed_direct_send_does_not_claim_it(
    broker: Broker,
) -> None:
    """A SEND into the far endpoint's queue fails on a full disk, and the far side's own
    reply, which fits, commits after it: the reply's endpoint row must not count the
    failed message as received, or the message sent again with that number would be
    taken for a duplicate and lost (R-DLG-1). (A reply whose job follows the failed one
    in the store counts the same way: only what has committed.)"""
    client, handle, received = await _first_message(broker)
    try:
        far = received[0].conversation_handle
        await _limit(broker, 0)
        with pytest.raises(RemoteError, match="full"):
            await client.send(handle, example.ORDER, b"\x02" * BIG)
        # Before the database reloads what it received, which still counts message 2:
        assert await client.send(far, example.CONFIRMATION, b"r") == 1  # it fits
        await _limit(broker, None)
        rows = await broker.databases["shop"].store.query(
            "SELECT receive_sequence FROM conversation_endpoints WHERE conversation_handle = ?",
            (str(far),),
        )
        assert rows[0][0] == 1  # only what is stored
        await asyncio.sleep(1.5)  # what the database received is reloaded from its file
        assert await client.send(handle, example.ORDER, b"2") == 2
        received += await drain(client, "OrderQueue", 1, timeout=10)
        assert [m.message_body for m in received] == [b"1", b"2"]
    finally:
        await client.close()


async def test_a_full_disk_under_the_segment_files_leaves_no_gap(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large bodies go to segment files beside the database (``storage.body_files``);
    when those writes fail for want of room, pipelined SENDs through the transmission
    queue are refused as a full disk, nothing of them is stored or sent, and the dialog
    goes on with the next number once there is room (R-DLG-1, R-DLG-5)."""
    client, handle, received = await _first_message(broker)

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    try:
        await client.alter_queue("OrderQueue", False)  # through the transmission queue
        monkeypatch.setattr(os, "pwrite", full)
        futures = [
            client.send_nowait(handle, example.ORDER, bytes([n]) * STORED_FROM) for n in range(2, 7)
        ]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(o, RemoteError) for o in outcomes), outcomes
        assert "disk is full" in str(outcomes[0]), outcomes
        monkeypatch.undo()  # room again
        assert await _stored_send_sequence(broker, handle) == 1  # no number given back
        await asyncio.sleep(1.5)  # as after any store error, let what was received reload
        bodies = [bytes([n]) * STORED_FROM for n in range(2, 7)]
        for body in bodies:
            await client.send(handle, example.ORDER, body)
        await client.alter_queue("OrderQueue", True)
        received += await drain(client, "OrderQueue", 5, timeout=10)
        assert [m.message_body for m in received] == [b"1", *bodies]
        assert_exactly_once_in_order(received)
        assert await client.receive("OrderQueue", timeout=0.5) == []
    finally:
        await client.close()
