"""Retransmission against real daemons behind the fault proxy (R-DLG-4, R-DLG-6).

* A backlog handed to a connection that does not drain is not resent before its
  first copy is written: the retry clock starts when the link writes a message.
* On a link slower than ``retry.initial``, the timeout learns the acknowledgement
  delay, so later messages are sent once.
* A message that is never acknowledged is resent after ``retry.initial``, then after
  twice that, and so on, doubling up to ``retry.maximum``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from datetime import datetime
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
from brokerd.tools.faultproxy import FaultProxy
from brokerd.tools.launcher import Deployment
from brokerd.traces.writer import read_events, segment_files
from tests.daemons import PROXY_HOST, drain, proxied, wait_until


@pytest.fixture
async def behind_proxy(tmp_path: Path) -> AsyncIterator[tuple[Deployment, FaultProxy]]:
    """alpha -> proxy (127.0.0.3:4022) -> beta, with short retry timings."""
    d = shop_and_warehouse(
        tmp_path,
        {"initial": 0.3, "maximum": 1.2, "ack_delay": 0.005, "delayed_retry": 0.5},
        beta_route_host=PROXY_HOST,
    )
    async with proxied(d) as proxy:
        yield d, proxy


async def stats(client: BrokerClient) -> dict[str, Any]:
    (row,) = await client.view("stats")
    return row


async def test_a_backlog_is_not_resent_before_it_is_written(
    behind_proxy: tuple[Deployment, FaultProxy],
) -> None:
    """R-DLG-6: the retry clock of a message starts when its connection writes it.

    The proxy stops reading from alpha: alpha's socket buffers fill, and the rest
    of 200 messages of 64 KiB waits in alpha's outbox for the connection. Over
    several retry periods, only messages actually written are resent (each
    once, since its copy then waits behind the others), and the messages are
    shown as waiting to be written. Then the connection drains and every message
    arrives exactly once, in order.
    """
    d, proxy = behind_proxy
    shop = await d.daemons["alpha"].client()
    warehouse = await d.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    await shop.send(handle, ORDER, b"open the connection")
    await drain(warehouse, "OrderQueue", 1)
    proxy.plan.stall = True
    count = 200
    for n in range(count):
        await shop.send(handle, ORDER, n.to_bytes(4, "big") * (16 * 1024))
    before = (await stats(shop))["retransmissions"]
    await asyncio.sleep(4 * 1.2)  # several retry periods
    resent = (await stats(shop))["retransmissions"]
    # Handing every message to the connection again at each retry period would have made
    # several hundred retransmissions here. Only a message that was written can be resent,
    # and its copy then waits to be written behind the others: at most once each.
    assert resent - before <= count, (before, resent)
    rows = await shop.view("transmission_queue")
    unwritten = [r for r in rows if "waiting to be written" in r["transmission_status"]]
    assert len(rows) == count
    assert len(unwritten) > count // 2, rows[-1]
    proxy.plan.stall = False
    received = await drain(warehouse, "OrderQueue", count, timeout=60)
    assert [m.message_body[:4] for m in received] == [n.to_bytes(4, "big") for n in range(count)]
    assert [m.message_sequence_number for m in received] == list(range(2, count + 2))
    assert await warehouse.receive("OrderQueue", timeout=0.5) == []
    await shop.close()
    await warehouse.close()


async def test_large_messages_resent_on_a_stalling_link_with_no_body_in_memory(
    tmp_path: Path,
) -> None:
    """R-DLG-6, R-DLG-7: with no body held in memory (``held_bodies_mb = 0``), large
    messages on a link that stalls and resumes are resent with their bodies read back
    from the file, and a copy still queued after an earlier copy was written (and its
    body dropped) is skipped, not built (the daemons log no traceback; the short soak
    hit that case). Every message arrives once, in order."""
    d = shop_and_warehouse(
        tmp_path,
        {"initial": 0.3, "maximum": 1.2, "ack_delay": 0.005, "delayed_retry": 0.5},
        beta_route_host=PROXY_HOST,
        extra="[limits]\nheld_bodies_mb = 0\n",
    )
    async with proxied(d) as proxy:
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(handle, ORDER, b"open the connection")
        await drain(warehouse, "OrderQueue", 1)
        count = 60
        for round_ in range(2):
            proxy.plan.stall = True
            for n in range(count // 2):
                body = (round_ * count // 2 + n).to_bytes(4, "big") * (50 * 1024)
                await shop.send(handle, ORDER, body)  # 200 KiB: four fragments
            await asyncio.sleep(2.5)  # several retry periods while the link is stalled
            proxy.plan.stall = False
            await asyncio.sleep(1.0)
        received = await drain(warehouse, "OrderQueue", count, timeout=90)
        assert [m.message_body[:4] for m in received] == [
            n.to_bytes(4, "big") for n in range(count)
        ]
        assert (await stats(shop))["retransmissions"] > 0
        await shop.close()
        await warehouse.close()


async def test_a_slow_link_teaches_the_timeout_and_later_messages_go_once(
    behind_proxy: tuple[Deployment, FaultProxy],
) -> None:
    """R-DLG-6: every chunk through the proxy waits 0.25 s each way, so acknowledgements
    come ~0.5 s after a message is written while ``retry.initial`` is 0.3 s. The first
    messages are resent (and the link's timeout backs off); once a message sent once is
    acknowledged, the timeout follows the observed delay and later messages are sent once
    (but for the odd acknowledgement a loaded machine delays)."""
    d, proxy = behind_proxy
    shop = await d.daemons["alpha"].client()
    warehouse = await d.daemons["beta"].client()
    proxy.plan.delay = 0.25
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    for n in range(10):
        await shop.send(handle, ORDER, f"early {n}".encode())
        await asyncio.sleep(0.15)
    await drain(warehouse, "OrderQueue", 10, timeout=30)
    await wait_until(lambda: _empty(shop), 10)
    await asyncio.sleep(1.5)  # the early messages' last retransmissions, if any, are done
    before = (await stats(shop))["retransmissions"]
    for n in range(20):
        await shop.send(handle, ORDER, f"late {n}".encode())
        await asyncio.sleep(0.1)
    received = await drain(warehouse, "OrderQueue", 20, timeout=30)
    assert [m.message_body for m in received] == [f"late {n}".encode() for n in range(20)]
    await wait_until(lambda: _empty(shop), 10)
    # With the floor's 0.3 s each of the 20 would be resent at least once; a loaded machine
    # may still delay some acknowledgements past the learnt timeout.
    assert (await stats(shop))["retransmissions"] - before < 10
    (link,) = [r for r in await shop.view("broker_connections") if r["direction"] == "outbound"]
    assert link["retransmit_timeout"] > 0.5, link
    await shop.close()
    await warehouse.close()


async def _empty(client: BrokerClient) -> bool:
    return not await client.view("transmission_queue")


async def test_a_lost_message_waits_twice_as_long_before_each_retry(tmp_path: Path) -> None:
    """R-DLG-6: every copy of one message is lost on a real link (the proxy drops every
    fragment frame). Its copies go out after 0.3, 0.6, 1.2 and 1.2 s (``retry.initial``
    0.3 s, doubling, ``retry.maximum`` 1.2 s), as ``fragment_sent`` traces them; the link's
    own back-off on a timeout does not double a message's wait a second time. The redial
    rule is set far off, so that no reconnection resends the message early."""
    d = shop_and_warehouse(
        tmp_path,
        {"initial": 0.3, "maximum": 1.2, "ack_delay": 0.005, "redial_after": 100},
        beta_route_host=PROXY_HOST,
    )
    async with proxied(d) as proxy:
        proxy.plan.drop_fragments = set(range(1, 10_000))
        shop = await d.daemons["alpha"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(handle, ORDER, b"lost every time")
        await wait_until(lambda: _resent(shop, 4), 15)
        await shop.close()
        d.stop_all()  # the traces are flushed
        traced = read_events(segment_files([d.daemons["alpha"].directory / "data" / "traces"]))
        sent = sorted(
            (e["ts"], e["attempt"])
            for e in traced
            if e["event"] == "fragment_sent" and e.get("seq") == 1
        )
    attempts = [attempt for _, attempt in sent][:5]
    assert attempts == [1, 2, 3, 4, 5], sent
    times = [datetime.fromisoformat(ts).timestamp() for ts, _ in sent][:5]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # The engine's tick (a quarter of retry.initial) and a busy machine make each gap late
    # by a little; a wait doubled twice would make the second gap 1.2 s.
    assert 0.28 <= gaps[0] < 0.5, gaps
    assert 0.58 <= gaps[1] < 0.85, gaps
    assert 1.18 <= gaps[2] < 1.45, gaps
    assert 1.18 <= gaps[3] < 1.45, gaps


async def _resent(client: BrokerClient, times: int) -> bool:
    (row,) = await client.view("stats")
    return bool(row["retransmissions"] >= times)
