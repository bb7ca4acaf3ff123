"""The Spark jobs over real daemons' traces agree with what the test itself did.

Two real daemons (alpha on 127.0.0.61, beta on 127.0.0.62) with a fault proxy on
127.0.0.63 in alpha's route to beta. The test loses one fragment (a forced
retransmission) and one acknowledgement (a forced retransmission the receiver sees
as a duplicate, R-DLG-4), runs the analysis in local mode and checks its figures
against the messages it sent, the messages it received and the daemons' own
counters. The exactly-once-in-order audit (R-DLG-5) passes; after the delivered and
received events of one message are deleted from a copy of the traces it names that
conversation and seq.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pyspark.sql import SparkSession

from brokerd.analytics.audit import audit, violation_line
from brokerd.analytics.load import load_traces
from brokerd.analytics.messages import message_table
from brokerd.analytics.report import analyze, write_report
from brokerd.sdk.client import BrokerClient
from brokerd.tools.example import (
    CONFIRMATION,
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.faultproxy import FaultPlan, FaultProxy
from brokerd.tools.launcher import Deployment
from brokerd.traces.segments import segment_lines
from tests.daemons import drain, wait_until

ALPHA, BETA, PROXY = "127.0.0.61", "127.0.0.62", "127.0.0.63"
RETRY = {"initial": 0.5, "maximum": 2.0, "ack_delay": 0.005, "delayed_retry": 0.5}


async def settled(client: BrokerClient) -> None:
    async def empty() -> bool:
        return not await client.view("transmission_queue")

    await wait_until(empty, 20)


async def run_workload(d: Deployment, proxy: FaultProxy) -> dict[str, int]:
    """Dialogs with a lost fragment and a lost acknowledgement; returns what the test knows."""
    shop = await d.daemons["alpha"].client()
    warehouse = await d.daemons["beta"].client()
    handles = [await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(3)]
    orders = 0
    for n in range(10):
        for h in handles:
            await shop.send(h, ORDER, f"order {n}".encode())
            orders += 1
    received = await drain(warehouse, "OrderQueue", orders)
    await settled(shop)

    # A lost fragment: alpha retransmits the message after retry.initial.
    proxy.plan.drop_fragments = {proxy.stats.fragments_seen + 1}
    await shop.send(handles[0], ORDER, b"order after a lost fragment")
    orders += 1
    received += await drain(warehouse, "OrderQueue", 1)
    await settled(shop)

    # A lost acknowledgement: alpha retransmits, beta sees a duplicate and acks again.
    proxy.plan.drop_acks = {proxy.stats.acks_seen + 1}
    await shop.send(handles[1], ORDER, b"order whose ack is lost")
    orders += 1
    received += await drain(warehouse, "OrderQueue", 1)
    await settled(shop)
    assert proxy.stats.fragments_dropped == 1 and proxy.stats.acks_dropped == 1

    for n in range(5):
        await shop.send(handles[n % 3], ORDER, f"late order {n}".encode())
        orders += 1
    received += await drain(warehouse, "OrderQueue", 5)
    conversations = {m.conversation_handle for m in received}
    for handle in conversations:  # one reply on each dialog
        await warehouse.send(handle, CONFIRMATION, b"<ok/>")
    replies = len(conversations)
    await drain(shop, "ClientQueue", replies)
    # Two dialogs end on both sides (an EndDialog each way); the third stays open.
    for h in handles[:2]:
        await shop.end_conversation(h)
    ended = await drain(warehouse, "OrderQueue", 2)
    assert all(m.is_end_dialog for m in ended)
    for m in ended:  # their EndDialogs close the shop's ended endpoints (R-DLG-10)
        await warehouse.end_conversation(m.conversation_handle)
    await settled(shop)
    await settled(warehouse)
    (alpha_stats,) = await shop.view("stats")
    (beta_stats,) = await warehouse.view("stats")
    await shop.close()
    await warehouse.close()
    return {
        "orders": orders,
        "replies": replies,
        "end_dialogs": 4,
        "fenced": 2,  # the warehouse's EndDialogs reach a shop that has ended (R-DLG-10)
        "retransmissions": alpha_stats["retransmissions"] + beta_stats["retransmissions"],
        "duplicates": alpha_stats["duplicates"] + beta_stats["duplicates"],
        "open_conversation_handles": 1,
    }


async def test_analysis_of_real_daemons_matches_the_workload(
    tmp_path: Path, spark: SparkSession
) -> None:
    d = shop_and_warehouse(tmp_path, RETRY, hosts=(ALPHA, BETA), beta_route_host=PROXY)
    proxy = FaultProxy(PROXY, 4022, BETA, 4022, FaultPlan())
    await proxy.start()
    try:
        d.start("alpha")
        d.start("beta")
        known = await run_workload(d, proxy)
    finally:
        d.stop_all()  # flushes and closes the trace segments
        await proxy.stop()
    assert known["retransmissions"] == 2 and known["duplicates"] == 1

    traces = [d.daemons[name].directory / "data" / "traces" for name in ("alpha", "beta")]
    result = analyze(traces, spark=spark, progress=None)
    sent = known["orders"] + known["replies"] + known["end_dialogs"]
    delivered = sent - known["fenced"]
    t = result.totals
    assert t["messages_sent"] == sent
    assert t["messages_delivered"] == delivered
    assert t["messages_received"] == delivered
    assert t["messages_discarded"] == known["fenced"]
    assert t["messages_waiting"] == 0 and t["messages_lost"] == 0
    assert t["retransmissions"] == known["retransmissions"]
    assert t["messages_retransmitted"] == 2
    assert t["duplicates"] == known["duplicates"]
    assert t["corrupted_messages"] == 0
    assert result.inputs["instances"] == ["alpha", "beta"]
    assert result.inputs["lines_skipped"] == 0

    assert result.audit.passed, result.audit.violations
    assert result.audit.delivered == delivered and result.audit.streams == 6

    pairs = {
        (r["service"], r["far_service"]): r
        for r in result.tables["latency_by_service_pair"].records()
    }
    forward = pairs[(SHOP_SERVICE, WAREHOUSE_SERVICE)]
    assert forward["count"] == known["orders"] + 2
    assert 0 < forward["p50_ms"] <= forward["p99_ms"] <= forward["max_ms"]
    assert forward["max_ms"] >= 500  # the retransmitted messages waited retry.initial
    assert pairs[(WAREHOUSE_SERVICE, SHOP_SERVICE)]["count"] == known["replies"]

    routes = {r["sender"]: r for r in result.tables["faults_by_route"].records()}
    assert routes["alpha"]["retransmissions"] == 2
    assert routes["alpha"]["duplicates"] == 1
    assert routes["alpha"]["address"] == f"tcp://{PROXY}:4022"
    connections = result.tables["faults_by_connection"].records()
    assert sum(r["retransmissions"] for r in connections if r["instance"] == "alpha") == 2
    assert sum(r["duplicates"] for r in connections if r["instance"] == "beta") == 1

    open_endpoints = result.tables["open_endpoints"].records()
    assert {(r["instance"], r["initiator"]) for r in open_endpoints} == {
        ("alpha", True),
        ("beta", False),
    }
    assert not result.tables["waiting_messages"].rows

    summary, html = write_report(result, tmp_path / "report")
    assert json.loads(summary.read_text())["audit"]["passed"] is True
    assert html.read_text().count('class="view"') == 3  # the charts' places

    # Delete the delivered and received events of one message from a copy: the audit
    # names that conversation and seq, a gap (seq 6 was delivered), with its evidence.
    copy = tmp_path / "copy"
    for n, directory in enumerate(traces):
        shutil.copytree(directory, copy / str(n))
    victim = _delete_event(copy, "delivered", seq=5)
    _delete_event(copy, "received", seq=5, conversation=str(victim["conversation_id"]))
    loaded = load_traces(spark, [copy])
    try:
        found = audit(message_table(loaded.events), loaded.events)
    finally:
        loaded.release()
    assert not found.passed
    assert [
        (v["kind"], v["conversation_id"], v["initiator"], v["seq"]) for v in found.violations
    ] == [("gap", victim["conversation_id"], True, 5)]
    (gap,) = found.violations
    line = violation_line(gap)
    assert f"conversation {victim['conversation_id']}" in line and "seq 5:" in line
    assert gap["receiver"] == "beta" and gap["evidence"][0].startswith("beta#")


def _delete_event(
    root: Path, event: str, seq: int, conversation: str | None = None
) -> dict[str, object]:
    """Delete the first ``event`` of the initiator's ``seq`` (of ``conversation``) under
    ``root``; return it."""
    for compacted in sorted(root.rglob("*.parquet")):  # edited as plain JSON Lines
        plain = compacted.with_name(compacted.name.removesuffix(".parquet") + ".jsonl")
        plain.write_bytes(b"".join(segment_lines(compacted)))
        compacted.unlink()
    for segment in sorted(root.rglob("*.jsonl")):
        lines = segment.read_text().splitlines(keepends=True)
        for n, text in enumerate(lines):
            line = json.loads(text)
            if (
                line["event"] == event
                and line["seq"] == seq
                and line["initiator"]
                and conversation in (None, line["conversation_id"])
            ):
                segment.write_text("".join(lines[:n] + lines[n + 1 :]))
                return dict(line)
    raise AssertionError(f"no {event} event of seq {seq}")
