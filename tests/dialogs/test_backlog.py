"""A transmission queue recovered as numbers, paged in from the file (R-DLG-5, R-DLG-13).

Recovery makes no object per unacknowledged message: a daemon SIGKILLed with a backlog
on many dialogs restarts holding only each endpoint's numbers, and once its peer
appears delivers every message exactly once and in order, with the messages in memory
bounded by the page (``limits.backlog_page``) rather than by the backlog. While an
endpoint's link is down, SENDs beyond twice the page join its backlog too. An
acknowledgement whose ranges (messages received out of order) fall in a backlog removes
exactly those numbers, which are then never paged in or sent again.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
from brokerd.traces.writer import read_events, segment_files
from tests.daemons import FAST_RETRY, PROXY_HOST, drain, proxied, stats_with, wait_until

PAGE = 256  # limits.backlog_page, its default
DIALOGS, PER_DIALOG = 12, 1200  # 14,400 messages: more than two pages per dialog
ROUNDS = 10  # rounds of messages (one per dialog) per SEND request


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    try:
        yield d
    finally:
        d.stop_all()


async def outbound(client: BrokerClient) -> dict[str, Any]:
    return await stats_with(client, "outbound_", "backlog_")


async def test_a_backlog_on_many_dialogs_is_recovered_as_numbers_and_paged_in(
    deployment: Deployment,
) -> None:
    """R-DLG-13: SIGKILL with 14,400 messages waiting on 12 dialogs (the peer down). After
    the restart no message object is in memory; once the peer appears every message
    arrives exactly once and in order, while at most two pages per dialog are in memory."""
    deployment.start("alpha")
    shop = await deployment.daemons["alpha"].client()
    handles = [
        await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(DIALOGS)
    ]
    for first in range(0, PER_DIALOG, ROUNDS):
        await shop.send_many(
            [
                (handle, ORDER, f"{d}:{n}:".encode().ljust(64, b"."))
                for n in range(first, first + ROUNDS)
                for d, handle in enumerate(handles)
            ]
        )
    before = await outbound(shop)
    # The link is down: beyond twice the page, SENDs wait as numbers too.
    assert before["outbound_in_memory"] <= DIALOGS * 2 * PAGE, before
    assert before["outbound_in_memory"] + before["outbound_in_file_only"] == DIALOGS * PER_DIALOG
    await shop.close()

    deployment.kill("alpha")
    deployment.start("alpha")
    shop = await deployment.daemons["alpha"].client()
    recovered = await outbound(shop)
    assert recovered["outbound_in_memory"] == 0, recovered  # recovery made no message object
    assert recovered["outbound_in_file_only"] == DIALOGS * PER_DIALOG, recovered
    endpoints = await shop.view("conversation_endpoints")
    assert sum(e["unacknowledged"] for e in endpoints) == DIALOGS * PER_DIALOG
    queued = await shop.view("transmission_queue")
    assert len(queued) == DIALOGS * PER_DIALOG
    assert {(r["conversation_handle"], r["message_sequence_number"]) for r in queued} == {
        (str(h), n) for h in handles for n in range(1, PER_DIALOG + 1)
    }

    deployment.start("beta")
    warehouse = await deployment.daemons["beta"].client()
    peaks: list[int] = []

    async def watch() -> None:
        while True:
            peaks.append((await outbound(shop))["outbound_in_memory"])
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    try:
        received = await drain(warehouse, "OrderQueue", DIALOGS * PER_DIALOG, timeout=120)
    finally:
        watcher.cancel()
    per_dialog: dict[str, list[int]] = {}
    seqs: dict[uuid.UUID, list[int]] = {}
    for m in received:
        dialog, index, _ = m.message_body.split(b":", 2)
        per_dialog.setdefault(dialog.decode(), []).append(int(index))
        seqs.setdefault(m.conversation_handle, []).append(m.message_sequence_number)
    assert per_dialog == {str(d): list(range(PER_DIALOG)) for d in range(DIALOGS)}
    assert all(s == list(range(1, PER_DIALOG + 1)) for s in seqs.values()), seqs
    assert await warehouse.receive("OrderQueue", timeout=0.5) == []
    assert peaks and max(peaks) <= DIALOGS * 2 * PAGE, max(peaks)
    await wait_until(lambda: _empty(shop), 30)
    final = await outbound(shop)
    assert final["outbound_in_memory"] == final["outbound_in_file_only"] == 0, final
    assert final["outbound_paged_in"] == 0, final
    assert final["backlog_pages_read"] >= DIALOGS * PER_DIALOG // PAGE, final
    # Small bodies come with their page: a window's refill waits for no read.
    read = await stats_with(shop, "bodies_read", "bodies_ahead", "retransmissions")
    assert read["bodies_read_ahead"] == DIALOGS * PER_DIALOG, read
    assert read["bodies_ahead_bytes"] == 0, read  # every one was taken by the link
    assert read["bodies_read_back"] <= read["retransmissions"], read
    await shop.close()
    await warehouse.close()
    # Every message left after the restart, a page at a time: each has its fragment_sent
    # line, traced together with the others of its page (Transmission.transmit).
    deployment.stop("alpha")
    traces = deployment.daemons["alpha"].directory / "data" / "traces"
    sent: dict[str, set[int]] = {}
    for e in read_events(segment_files([traces])):
        if e["event"] == "fragment_sent":
            assert e["fragments"] == 1 and e["peer"], e
            sent.setdefault(str(e["conversation_id"]), set()).add(int(e["seq"]))
    assert len(sent) == DIALOGS
    assert all(seqs == set(range(1, PER_DIALOG + 1)) for seqs in sent.values())


async def _empty(client: BrokerClient) -> bool:
    return not await client.view("transmission_queue")


async def test_an_ending_with_error_discards_a_backlog(deployment: Deployment) -> None:
    """END CONVERSATION WITH ERROR drops the unacknowledged messages, in memory and only
    in the file alike (SPEC §6): the Error alone is left to send, also after a restart."""
    deployment.start("alpha")
    shop = await deployment.daemons["alpha"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    for first in range(0, 3 * PAGE, 64):
        await shop.send_many([(handle, ORDER, b"%d" % n) for n in range(first, first + 64)])
    split = await outbound(shop)
    assert split["outbound_in_file_only"] == PAGE, split  # beyond two pages, numbers only
    await shop.end_conversation(handle, error_code=7, description="given up")
    queued = await shop.view("transmission_queue")
    assert [r["message_sequence_number"] for r in queued] == [3 * PAGE + 1]
    assert queued[0]["is_conversation_error"]
    await shop.close()
    deployment.kill("alpha")
    deployment.start("alpha")
    shop = await deployment.daemons["alpha"].client()
    assert (await outbound(shop))["outbound_in_file_only"] == 1
    assert [r["message_sequence_number"] for r in await shop.view("transmission_queue")] == [
        3 * PAGE + 1
    ]
    await shop.close()


async def test_an_acknowledgement_with_ranges_removes_numbers_of_a_backlog(
    tmp_path: Path,
) -> None:
    """R-DLG-5, R-DLG-13: the receiver holds messages 3..6 and 8..12 beyond gaps (the proxy
    drops the fragments of 2 and 7, and every acknowledgement), and the sender is
    SIGKILLed: it restarts with 2..12 as numbers and pages in 2 and 3 (a page of 2). The
    proxy drops message 2 again; message 3 is a duplicate, and its acknowledgement
    (through 1, ranges 3..6 and 8..12) removes 3 from memory and 4..6 and 8..12 from the
    backlog by number, leaving 7 alone there, which is paged in and sent. What the ranges
    removed is never read or sent again; message 2, resent once, releases them all, and
    every message is received exactly once and in order."""
    d = shop_and_warehouse(
        tmp_path,
        {"initial": 2.0, "maximum": 4.0, "ack_delay": 0.005, "delayed_retry": 0.5},
        beta_route_host=PROXY_HOST,
        extra="[limits]\nbacklog_page = 2\n",
        endpoint_extra="fragments_per_frame = 1",  # the plan's ordinals are messages
    )
    count = 12
    bodies = [f"<order n='{n}'/>".encode() for n in range(1, count + 1)]
    async with proxied(d) as proxy:
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(handle, ORDER, bodies[0])
        received = await drain(warehouse, "OrderQueue", 1)
        await wait_until(lambda: _empty(shop), 10)

        seen = proxy.stats.fragments_seen
        proxy.plan.drop_fragments = {seen + 1, seen + 6}  # messages 2 and 7
        proxy.plan.drop_acks = set(range(proxy.stats.acks_seen + 1, proxy.stats.acks_seen + 10**6))
        await shop.send_many([(handle, ORDER, body) for body in bodies[1:]])

        async def held_beyond_the_gap() -> bool:
            got = await stats_with(warehouse, "fragments_received")
            return int(got["fragments_received"]) >= count - 2

        await wait_until(held_beyond_the_gap, 10)
        assert await warehouse.receive("OrderQueue", timeout=0.2) == []  # 2 is missing
        queued = await shop.view("transmission_queue")
        assert [r["message_sequence_number"] for r in queued] == list(range(2, count + 1))
        await shop.close()
        d.kill("alpha")

        beta_before = await stats_with(warehouse, "duplicates")
        proxy.plan.drop_acks = set()
        proxy.plan.drop_fragments = {proxy.stats.fragments_seen + 1}  # message 2 again
        await asyncio.to_thread(d.start, "alpha")
        shop = await d.daemons["alpha"].client()
        received += await drain(warehouse, "OrderQueue", count - 1, timeout=30)
        assert [m.message_sequence_number for m in received] == list(range(1, count + 1))
        assert [m.message_body for m in received] == bodies
        await wait_until(lambda: _empty(shop), 10)
        assert await warehouse.receive("OrderQueue", timeout=0.5) == []

        sender = await stats_with(
            shop, "fragments_sent", "retransmissions", "backlog_", "outbound_", "acks_received"
        )
        # After the restart: 2 (dropped), 3 and 7 once each, then 2 again. 4..6 and 8..12
        # left the backlog by number: never paged in, never sent.
        assert sender["fragments_sent"] == 4, sender
        assert sender["retransmissions"] == 1, sender
        assert sender["backlog_pages_read"] == 2, sender
        assert sender["outbound_in_memory"] == sender["outbound_in_file_only"] == 0, sender
        beta_after = await stats_with(warehouse, "duplicates")
        assert beta_after["duplicates"] - beta_before["duplicates"] == 1, beta_after
        assert proxy.stats.fragments_dropped == 3
        await shop.close()
        await warehouse.close()
