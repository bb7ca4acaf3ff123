"""A receiver that commits more slowly than a peer writes stops reading the peer's
connection until its backlog is committed (R-DLG-6, R-DLG-13): the peer's writes wait,
its retry clocks do not start, and nothing is resent or received twice."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.system import memory_mb
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
    shop_database,
    warehouse_database,
)
from brokerd.tools.launcher import Deployment
from tests.daemons import PROXY_HOST, drain, proxied, running, wait_until

MB = 1024 * 1024


async def test_a_slow_committer_holds_reading_and_nothing_is_resent(tmp_path: Path) -> None:
    d = Deployment(tmp_path, {"initial": 2.0, "maximum": 8.0})
    d.add("alpha", "127.0.0.1", shop_database("127.0.0.2"))
    d.add(
        "beta",
        "127.0.0.2",
        warehouse_database("127.0.0.1"),
        endpoint_extra="inbound_backlog_mb = 1\n",
    )
    try:
        d.start("alpha")
        d.start("beta")
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        handles = [
            await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(4)
        ]
        count = 40
        sends = [
            shop.send(handles[n % 4], ORDER, n.to_bytes(4, "big") * (MB // 4)) for n in range(count)
        ]
        await asyncio.gather(*sends)  # pipelined on one connection: 40 MiB at once
        received = await drain(warehouse, "OrderQueue", count, timeout=120)
        per_dialog: dict[object, list[int]] = {}
        for m in received:
            per_dialog.setdefault(m.conversation_handle, []).append(
                int.from_bytes(m.message_body[:4], "big")
            )
        assert sorted(n for ns in per_dialog.values() for n in ns) == list(range(count))
        assert all(ns == sorted(ns) for ns in per_dialog.values()), per_dialog
        (beta,) = await warehouse.view("stats")
        assert beta["inbound_holds"] >= 1, beta
        assert beta["duplicates"] == 0, beta
        await wait_until(lambda: _empty(shop), 30)
        (alpha,) = await shop.view("stats")
        assert alpha["retransmissions"] == 0, alpha
        await shop.close()
        await warehouse.close()
    finally:
        d.stop_all()


async def test_sends_to_a_congested_link_wait_for_it_and_all_arrive_in_order(
    tmp_path: Path,
) -> None:
    """Flow control: an application SENDs 6,000 messages, 1,000 at a time in flight, to a
    link that is up but does not drain (the proxy stops reading alpha). Once the link's
    send window is full and more wait for it, the broker stops reading the application's
    requests until the link drains (or a second has passed), so the transmission queue
    does not grow at the application's pace; every SEND still commits and every message
    arrives once, in order, when the link moves again (R-DLG-1, R-DLG-5)."""
    d = shop_and_warehouse(tmp_path, {"initial": 2.0, "maximum": 8.0}, beta_route_host=PROXY_HOST)
    await _held_by_a_stalled_link(d, 6_000, 1_000)


async def test_a_configured_send_window_holds_the_application_sooner(tmp_path: Path) -> None:
    """``limits.send_window`` reaches a running daemon's links: with 100, an application
    SENDing 400 messages, 50 at a time in flight, to a link that does not drain is held
    (the default 2,000 would take them all), and every message still arrives once, in
    order, when the link moves again (R-DLG-1, R-DLG-6)."""
    d = shop_and_warehouse(
        tmp_path,
        {"initial": 2.0, "maximum": 8.0},
        beta_route_host=PROXY_HOST,
        extra="[limits]\nsend_window = 100\nbacklog_send_window = 100\n",
    )
    await _held_by_a_stalled_link(d, 400, 50)  # the listener looks as SENDs are read


async def _held_by_a_stalled_link(d: Deployment, count: int, in_flight: int) -> None:
    """alpha's application SENDs ``count`` messages on one dialog, ``in_flight`` at a time
    awaiting their commits, while the proxy stops reading alpha: it must be held
    (``client_sends_held``); once the link moves again every SEND commits, every message
    arrives once, in order, and the transmission queue empties."""
    async with proxied(d) as proxy:
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(handle, ORDER, b"<opening/>")  # a link that is down never congests
        await drain(warehouse, "OrderQueue", 1, timeout=30)
        proxy.plan.stall = True
        sends = asyncio.Semaphore(in_flight)  # a producer that awaits its SENDs' commits

        async def send(n: int) -> int:
            async with sends:
                return await shop.send(handle, ORDER, n.to_bytes(4, "big") * 50)

        producer = asyncio.gather(*(send(n) for n in range(count)))
        await wait_until(lambda: _sends_held(shop), 30)
        proxy.plan.stall = False
        assert await producer == list(range(2, count + 2))
        received = await drain(warehouse, "OrderQueue", count, timeout=120)
        assert [m.message_body[:4] for m in received] == [
            n.to_bytes(4, "big") for n in range(count)
        ]
        await wait_until(lambda: _empty(shop), 30)
        await shop.close()
        await warehouse.close()


async def _sends_held(client: object) -> bool:
    (row,) = await client.view("stats")  # type: ignore[attr-defined]
    return bool(row["client_sends_held"])


async def _empty(client: object) -> bool:
    return not await client.view("transmission_queue")  # type: ignore[attr-defined]


async def test_a_client_pipelining_large_sends_is_read_only_as_its_sends_commit(
    tmp_path: Path,
) -> None:
    """An application with 200 MiB of SENDs in flight on one connection while the target's
    broker is down: the broker stops reading the connection past
    ``limits.client_pending_mb`` until commits catch up, and keeps no body beyond
    ``limits.held_bodies_mb`` while the link is down, so its memory stays bounded (it
    peaked at 457 MB before both), and every SEND still commits, in order (R-DLG-1)."""
    d = Deployment(tmp_path)
    limits = "[limits]\nclient_pending_mb = 8\nheld_bodies_mb = 8\n"
    d.add("alpha", "127.0.0.1", shop_database("127.0.0.2"), extra=limits)
    with running(d, "alpha"):
        shop = await d.daemons["alpha"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        count = 200
        sends = [shop.send(handle, ORDER, n.to_bytes(4, "big") * (MB // 4)) for n in range(count)]
        seqs = await asyncio.gather(*sends)
        assert seqs == list(range(1, count + 1))
        (alpha,) = await shop.view("stats")
        assert alpha["client_reads_held"] >= 1, alpha
        assert alpha["client_sends_held"] == 0, alpha  # a link that is down never congests
        process = d.daemons["alpha"].process
        assert process is not None
        assert memory_mb(process.pid, "VmHWM") < 160, memory_mb(process.pid, "VmHWM")
        assert len(await shop.view("transmission_queue")) == count
        await shop.close()
