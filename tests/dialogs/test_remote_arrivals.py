"""Runs over a connection (``brokerd.dialogs.arrivals.remote_arrivals``): the messages after a
run's first go straight to the target endpoint, and the dialog stays exactly once and
in order (R-DLG-1) through lost frames and lost acknowledgements, every message is
checked by the receiver (R-OBJ-1) and traced once. Two real daemons over TCP,
pipelined SENDs, so a frame carries runs of one dialog."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, cast

from brokerd.config import DatabaseConfig, QueueConfig
from brokerd.dialogs.arrivals.in_order import InOrderRun, Receiver
from brokerd.dialogs.endpoints.database import Database
from brokerd.tools import example
from brokerd.tools.launcher import Deployment
from brokerd.traces.writer import read_events, segment_files
from protocol.dialog import (
    END_DIALOG,
    FLAG_END_DIALOG,
    DialogHeader,
)
from protocol.fragments import MIN_FRAGMENT_SIZE
from tests.daemons import (
    FAST_RETRY,
    PROXY_HOST,
    assert_exactly_once_in_order,
    drain,
    proxied,
    running,
    wait_until,
)
from tests.dialogs.endpoints import conversing_endpoint
from tests.dialogs.run_checks import body, pipelined, refused_inside_a_run, validating_warehouse
from tests.hostile import HostileBroker, order_message

SHOP, WAREHOUSE = example.SHOP_SERVICE, example.WAREHOUSE_SERVICE


def _traced(d: Deployment, name: str) -> list[dict[str, Any]]:
    return list(read_events(segment_files([d.daemons[name].directory / "data" / "traces"])))


async def test_runs_both_ways_arrive_once_in_order_and_are_traced_once(tmp_path: Path) -> None:
    d = example.shop_and_warehouse(tmp_path)
    orders = [body(n, "order") for n in range(1, 1201)]
    confirmations = [body(n, "confirmed") for n in range(1, 401)]
    with running(d):
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        try:
            handle = await shop.begin_dialog(SHOP, WAREHOUSE, example.CONTRACT)
            assert await pipelined(shop, handle, example.ORDER, orders) == list(range(1, 1201))
            got = await drain(warehouse, "OrderQueue", len(orders))
            assert [m.message_body for m in got] == orders
            assert_exactly_once_in_order(got)
            target = got[0].conversation_handle
            sent = await pipelined(warehouse, target, example.CONFIRMATION, confirmations)
            assert sent == list(range(1, 401))
            replies = await drain(shop, "ClientQueue", len(confirmations))
            assert [m.message_body for m in replies] == confirmations
            assert_exactly_once_in_order(replies)
            (beta,) = await warehouse.view("stats")
            assert beta["fragments_received"] == len(orders), beta
            assert beta["fragments_in_runs"] > 0, beta  # runs happened
        finally:
            await shop.close()
            await warehouse.close()
    for name, initiator, bodies in (("beta", True, orders), ("alpha", False, confirmations)):
        arrivals = [e for e in _traced(d, name) if e["event"] == "fragment_received" and e["seq"]]
        counted = Counter((e["initiator"], e["seq"]) for e in arrivals)
        assert set(counted) == {(initiator, s) for s in range(1, len(bodies) + 1)}, name
        assert set(counted.values()) == {1}, name
        assert {e["seq"]: e["size"] for e in arrivals} == {
            n: len(bodies[n - 1]) for n in range(1, len(bodies) + 1)
        }, name
        assert {e["peer"] for e in arrivals} != {None}, name


async def test_a_message_refused_inside_a_run_is_never_queued_nor_what_follows(
    tmp_path: Path,
) -> None:
    """R-OBJ-1: the warehouse validates orders as XML; order 150 of a pipelined run is
    not, across a connection (``run_checks.refused_inside_a_run``)."""
    d = Deployment(tmp_path)
    d.add("alpha", "127.0.0.1", example.shop_database("127.0.0.2"))
    d.add("beta", "127.0.0.2", validating_warehouse("127.0.0.1"))
    with running(d):
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        try:
            await refused_inside_a_run(shop, warehouse)
        finally:
            await shop.close()
            await warehouse.close()


async def test_lost_frames_and_lost_acknowledgements_break_runs_and_lose_nothing(
    tmp_path: Path,
) -> None:
    """Frames lost on the way leave gaps (the messages after them are held, R-DLG-7) and
    lost acknowledgements bring retransmissions (duplicates, R-DLG-4): neither may go
    straight into a run. Every order arrives once, in order, on each of four dialogs."""
    d = example.shop_and_warehouse(
        tmp_path, {"initial": 0.5, "maximum": 2.0}, beta_route_host=PROXY_HOST
    )
    async with proxied(d) as proxy:
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        handles = [await shop.begin_dialog(SHOP, WAREHOUSE, example.CONTRACT) for _ in range(4)]
        sent: dict[uuid.UUID, list[bytes]] = {h: [] for h in handles}
        for wave in range(10):  # each wave is pipelined: frames carry runs of each dialog
            if wave in (2, 5, 8):
                proxy.plan.drop_fragments = {proxy.stats.fragments_seen + 1}
            if wave in (3, 6):
                proxy.plan.drop_acks = {proxy.stats.acks_seen + 1}
            futures = []
            for n in range(wave * 40, wave * 40 + 40):
                for h in handles:
                    order = body(n, "order")
                    sent[h].append(order)
                    futures.append(shop.send_nowait(h, example.ORDER, order))
            await asyncio.gather(*futures)
        got = await drain(warehouse, "OrderQueue", 400 * len(handles), timeout=120)
        assert_exactly_once_in_order(got)
        per_dialog: dict[uuid.UUID, list[bytes]] = {}
        for m in got:
            per_dialog.setdefault(m.conversation_handle, []).append(m.message_body)
        assert sorted(per_dialog.values()) == sorted(sent.values())
        assert proxy.stats.fragments_dropped >= 2 and proxy.stats.acks_dropped >= 1
        (alpha,) = await shop.view("stats")
        assert alpha["retransmissions"] > 0, alpha
        await asyncio.sleep(0.5)
        assert await warehouse.receive("OrderQueue", timeout=0.2) == []
        await shop.close()
        await warehouse.close()


async def test_turns_with_gaps_and_duplicates_queue_each_message_once_in_order(
    tmp_path: Path,
) -> None:
    """One read brings a broker's frames with a dialog's messages out of order and
    twice: 1 2 3 2 3 4 6 7 5 8. A run goes straight on only while the next message is
    the next in order: the duplicates are counted and acknowledged again (R-DLG-4), 6
    and 7 wait for 5 (R-DLG-7), and the queue gets 1 to 8 once, in order (R-DLG-1).
    On a second dialog, 1 2 5 come in one read and 3 4 6 in the next: 3 starts a run
    while 5 is held, so 4, which releases 5 too, must take the whole way."""
    d = example.shop_and_warehouse(tmp_path, FAST_RETRY)
    d.start("beta")
    peer = HostileBroker(d.cert_dir, "alpha")
    try:
        warehouse = await d.daemons["beta"].client()
        await peer.connect(d.daemons["beta"].host)
        instance = uuid.uuid4()

        def order(
            cid: uuid.UUID, seq: int, sender: uuid.UUID | None = None
        ) -> tuple[DialogHeader, bytes]:
            return order_message(sender or instance, cid, seq, f"<order>{seq}</order>".encode())

        def padded(seq: int) -> bytes:
            """Message ``seq`` long enough to be cut in two at the least fragment size."""
            return f"<order>{seq}</order>".encode().ljust(2 * MIN_FRAGMENT_SIZE)

        def half(cid: uuid.UUID, seq: int, index: int) -> tuple[DialogHeader, bytes]:
            """Fragment ``index`` of 2 of the :func:`padded` message ``seq``."""
            whole = padded(seq)
            header, _ = order(cid, seq)
            size = MIN_FRAGMENT_SIZE
            part = whole[index * size : (index + 1) * size]
            return header._replace(
                fragment_index=index,
                fragment_count=2,
                fragment_offset=index * size,
                message_length=len(whole),
            ), part

        async def counted(duplicates: int, fragments: int) -> None:
            async def check() -> bool:
                (stats,) = await warehouse.view("stats")
                return bool(
                    stats["duplicates"] == duplicates and stats["fragments_received"] == fragments
                )

            await wait_until(check, 10)

        def bodies(n: int) -> list[bytes]:
            return [f"<order>{seq}</order>".encode() for seq in range(1, n + 1)]

        first, second = uuid.uuid4(), uuid.uuid4()
        await peer.send_fragments([order(first, seq) for seq in (1, 2, 3, 2, 3, 4, 6, 7, 5, 8)])
        got = await drain(warehouse, "OrderQueue", 8, timeout=30)
        assert [m.message_body for m in got] == bodies(8)
        assert_exactly_once_in_order(got)
        await counted(2, 10)
        await peer.send_fragments([order(second, seq) for seq in (1, 2, 5)])
        await counted(2, 13)
        await peer.send_fragments([order(second, seq) for seq in (3, 4, 6)])
        got = await drain(warehouse, "OrderQueue", 6, timeout=30)
        assert [m.message_body for m in got] == bodies(6)
        assert_exactly_once_in_order(got)
        # A third dialog: the first half of message 4 is held when 3 starts a run, so a
        # whole 4 in that run takes the whole way, which finds it is 4 cut again (R-DLG-7):
        # the held half goes, the whole 4 is queued, and the second half that comes later
        # is a duplicate. A 6 from another broker instance inside a run is refused by the
        # binding (R-DLG-14); the genuine 6 comes later.
        third, forger = uuid.uuid4(), uuid.uuid4()
        await peer.send_fragments([order(third, 1), order(third, 2), half(third, 4, 0)])
        await counted(2, 19)
        await peer.send_fragments([order(third, 3), order_message(instance, third, 4, padded(4))])
        await counted(2, 21)
        await peer.send_fragments(
            [half(third, 4, 1), order(third, 5), order(third, 6, forger), order(third, 7)]
        )
        await peer.send_fragments([order(third, 6)])
        got = await drain(warehouse, "OrderQueue", 7, timeout=30)
        assert [m.message_body for m in got] == [*bodies(3), padded(4), *bodies(7)[4:]]
        assert_exactly_once_in_order(got)
        await counted(3, 26)
        (stats,) = await warehouse.view("stats")
        assert stats["binding_refusals"] == 1, stats
        assert stats["recut_messages"] == 1, stats
        assert await warehouse.receive("OrderQueue", timeout=0.3) == []
        await warehouse.close()
    finally:
        await peer.close()
        d.stop_all()


async def test_interleaved_dialogs_and_an_ending_in_one_read(tmp_path: Path) -> None:
    """One read carries two dialogs' messages interleaved (each message breaks the other
    dialog's run), then a run on one dialog that ends with END CONVERSATION: an ending
    takes the whole way (R-DLG-10), is queued after the messages before it, and the
    messages of both dialogs are queued once, in order (R-DLG-1)."""
    d = example.shop_and_warehouse(tmp_path, FAST_RETRY)
    d.start("beta")
    peer = HostileBroker(d.cert_dir, "alpha")
    try:
        warehouse = await d.daemons["beta"].client()
        await peer.connect(d.daemons["beta"].host)
        instance = uuid.uuid4()

        def message(cid: uuid.UUID, seq: int, end: bool = False) -> tuple[DialogHeader, bytes]:
            if end:
                return order_message(instance, cid, seq, b"", END_DIALOG, FLAG_END_DIALOG)
            return order_message(instance, cid, seq, f"<order>{cid.hex[:4]}-{seq}</order>".encode())

        first, second = uuid.uuid4(), uuid.uuid4()
        read = [m for seq in range(1, 6) for m in (message(first, seq), message(second, seq))]
        read += [message(first, seq) for seq in range(6, 10)] + [message(first, 10, end=True)]
        await peer.send_fragments(read)
        got = await drain(warehouse, "OrderQueue", 15, timeout=30)
        per: dict[uuid.UUID, list[bytes]] = {}
        for m in got:
            per.setdefault(m.conversation_handle, []).append(m.message_body)
        assert_exactly_once_in_order(got)
        assert sorted(len(bodies) for bodies in per.values()) == [5, 10]
        (ended,) = [m for m in got if m.is_end_dialog]
        ten = per[ended.conversation_handle]  # the ending comes last, after its nine
        assert ten[:9] == [f"<order>{first.hex[:4]}-{seq}</order>".encode() for seq in range(1, 10)]
        assert ten[9] == b"" and len(ten) == 10
        states = {r["state"] for r in await warehouse.view("conversation_endpoints")}
        assert states == {"CO", "DI"}, states
        (stats,) = await warehouse.view("stats")
        assert stats["fragments_in_runs"] == 3, stats  # 7, 8 and 9: after 6, before the END
        assert await warehouse.receive("OrderQueue", timeout=0.3) == []
        await warehouse.close()
    finally:
        await peer.close()
        d.stop_all()


def test_an_in_order_run_is_freed_by_reference_counting(tmp_path: Path) -> None:
    """A run of messages received in order is its own commit callback: nothing it holds
    refers back to it, so it is freed once its commit's callbacks ran, not by the cyclic
    garbage collector (with many dialogs a run a message, docs/performance.md)."""
    db = Database(DatabaseConfig(name="warehouse", queues=(QueueConfig("OrderQueue"),)), tmp_path)
    run = InOrderRun(cast(Receiver, None), db, conversing_endpoint(), "OrderQueue", [1])
    assert callable(run)
    assert sys.getrefcount(run) == 2  # the name, and getrefcount's own argument
