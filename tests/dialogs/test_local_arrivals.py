"""Runs between two databases of one instance (``brokerd.dialogs.arrivals.local_arrivals``): the
messages after a run's first go straight to the target endpoint, and the dialog stays
exactly once and in order (R-DLG-1), every message is checked by the receiver (R-OBJ-1)
and traced once. Real daemons, pipelined SENDs, so whole runs reach the local link in
one turn."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.tools import example
from brokerd.tools.launcher import Deployment
from brokerd.traces.writer import read_events, segment_files
from tests.daemons import assert_exactly_once_in_order, drain, running, wait_until
from tests.dialogs.run_checks import body, pipelined, refused_inside_a_run, validating_warehouse

HOST = "127.0.0.246"
SHOP, WAREHOUSE = example.SHOP_SERVICE, example.WAREHOUSE_SERVICE


def _solo(tmp_path: Path, warehouse: str | None = None) -> Deployment:
    d = Deployment(tmp_path)
    d.add(
        "solo",
        HOST,
        example.shop_database(None) + (warehouse or example.warehouse_database(None)),
    )
    return d


def _traced(d: Deployment) -> list[dict[str, Any]]:
    return list(read_events(segment_files([d.daemons["solo"].directory / "data" / "traces"])))


async def _orders_arrive(client: BrokerClient, bodies: list[bytes]) -> list[ReceivedMessage]:
    """A dialog begun and ``bodies`` SENT on it pipelined: they arrive once, in order."""
    handle = await client.begin_dialog(SHOP, WAREHOUSE, example.CONTRACT)
    sent = await pipelined(client, handle, example.ORDER, bodies)
    assert sent == list(range(1, len(bodies) + 1))
    got = await drain(client, "OrderQueue", len(bodies))
    assert [m.message_body for m in got] == bodies
    assert_exactly_once_in_order(got)
    return got


async def test_runs_both_ways_arrive_once_in_order_and_are_traced_once(tmp_path: Path) -> None:
    d = _solo(tmp_path)
    orders = [body(n, "order") for n in range(1, 601)]
    confirmations = [body(n, "confirmed") for n in range(1, 201)]
    with running(d):
        client = await d.daemons["solo"].client()
        try:
            got = await _orders_arrive(client, orders)
            target = got[0].conversation_handle
            sent = await pipelined(client, target, example.CONFIRMATION, confirmations)
            assert sent == list(range(1, 201))
            replies = await drain(client, "ClientQueue", 200)
            assert [m.message_body for m in replies] == confirmations
            assert_exactly_once_in_order(replies)

            async def acknowledged() -> bool:
                return await client.view("transmission_queue") == []

            await wait_until(acknowledged, 30)
        finally:
            await client.close()
    traced = _traced(d)
    arrivals = Counter(
        (e["initiator"], e["seq"]) for e in traced if e["event"] == "fragment_received"
    )
    assert set(arrivals) == {(True, s) for s in range(1, 601)} | {(False, s) for s in range(1, 201)}
    assert set(arrivals.values()) == {1}
    sizes = {
        e["seq"]: e["size"] for e in traced if e["event"] == "fragment_received" and e["initiator"]
    }
    assert sizes == {n: len(orders[n - 1]) for n in range(1, 601)}
    assert sum(e["event"] == "delivered" for e in traced) == 800


async def test_fragment_sent_lines_follow_the_order_of_a_run_mixing_large_messages(
    tmp_path: Path,
) -> None:
    """A run's messages of one fragment are traced together; a message of several
    fragments among them is traced after the ones queued before it."""
    d = _solo(tmp_path)
    bodies = [b"x" * (200_000 if n % 25 == 0 else 100) for n in range(1, 101)]
    with running(d):
        client = await d.daemons["solo"].client()
        try:
            await _orders_arrive(client, bodies)
        finally:
            await client.close()
    traced = _traced(d)
    sent = [e["seq"] for e in traced if e["event"] == "fragment_sent" and e["initiator"]]
    assert sorted(set(sent)) == list(range(1, 101))
    assert sent == sorted(sent)


async def test_a_message_refused_inside_a_run_is_never_queued_nor_what_follows(
    tmp_path: Path,
) -> None:
    """R-OBJ-1: the warehouse validates orders as XML; order 150 of a pipelined run is
    not, between two databases of one daemon (``run_checks.refused_inside_a_run``)."""
    d = _solo(tmp_path, validating_warehouse(None))
    with running(d):
        client = await d.daemons["solo"].client()
        try:
            await refused_inside_a_run(client, client)
        finally:
            await client.close()
