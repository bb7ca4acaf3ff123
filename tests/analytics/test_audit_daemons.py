"""The exactly-once-in-order audit over real daemons' traces says exactly what happened
(R-DLG-1, R-DLG-4, R-DLG-5; docs/traces.md "Durability" and "The audit").

Real daemons (alpha on 127.0.0.71, beta on 127.0.0.72: the shop sends orders to the
warehouse):

* after a clean run, one violation of every kind is planted into a copy of the trace
  files (an event deleted, doubled or moved in time): the audit finds exactly those,
  each naming its conversation, seq, brokers and the ids of its events. A crash window
  planted around one deleted delivery turns that gap into "unknown: trace missing";
* beta, then alpha, is SIGKILLed while orders flow and restarted: the application
  (which receives in transactions) got every order exactly once and in order, and the
  audit of the traces finds no violation. What it cannot see is "unknown", named by
  the crash window of the daemon killed, never "lost"; with the daemons' database
  files as witnesses (``brokerd analyze --database``) nothing is left unknown.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from brokerd.analytics.audit import Audit, audit, violation_line
from brokerd.analytics.load import load_traces
from brokerd.analytics.messages import message_table
from brokerd.analytics.report import witnesses
from brokerd.sdk.client import BrokerClient
from brokerd.storage.witness import endpoint_sequences
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from brokerd.traces.segments import segment_lines
from brokerd.traces.writer import segment_files
from protocol.errors import ClientError
from tests.daemons import FAST_RETRY, drain, running, wait_until

ALPHA, BETA = "127.0.0.71", "127.0.0.72"
DIALOGS, ORDERS = 6, 8

Line = dict[str, Any]


def trace_dirs(d: Deployment) -> list[Path]:
    return [d.daemons[name].directory / "data" / "traces" for name in ("alpha", "beta")]


def run_audit(spark: SparkSession, roots: list[Path], databases: list[Path] | None = None) -> Audit:
    """The audit of the traces under ``roots``, with ``databases`` as witnesses."""
    loaded = load_traces(spark, roots)
    rows = [row for path in databases or [] for row in endpoint_sequences(path)]
    try:
        return audit(message_table(loaded.events), loaded.events, witnesses(spark, rows))
    finally:
        loaded.release()


class TraceCopy:
    """A copy of a trace set, as lines that can be deleted, doubled or changed, then
    written back (one file per instance, in the order read)."""

    def __init__(self, sources: list[Path], root: Path) -> None:
        self.root = root
        self.lines: dict[str, list[Line]] = {}
        for source in sources:
            for segment in segment_files([source]):
                for text in segment_lines(segment):
                    line = json.loads(text)
                    self.lines.setdefault(line["instance"], []).append(line)

    def find(self, event: str, conversation: str, seq: int, initiator: bool = True) -> Line:
        (line,) = (
            line
            for lines in self.lines.values()
            for line in lines
            if line["event"] == event
            and line.get("conversation_id") == conversation
            and line.get("seq") == seq
            and line.get("initiator") is initiator
        )
        return line

    def remove(self, line: Line) -> None:
        self.lines[line["instance"]].remove(line)

    def add(self, line: Line) -> Line:
        lines = self.lines[line["instance"]]
        line = {**line, "n": max(other["n"] for other in lines) + 1}
        lines.append(line)
        return line

    def write(self) -> Path:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        for instance, lines in self.lines.items():
            text = "".join(json.dumps(line) + "\n" for line in lines)
            (self.root / f"{instance}-copy.jsonl").write_text(text)
        return self.root


def eid(line: Line) -> str:
    return f"{line['instance']}#{line['n']}"


def later(ts: str, micros: int = 1) -> str:
    """``ts`` moved ``micros`` later (same format)."""
    whole, fraction = ts[:-1].split(".")
    value = int(fraction) + micros
    assert value < 1_000_000
    return f"{whole}.{value:06d}Z"


def findings(result: Audit) -> set[tuple[str, str, int]]:
    return {
        (v["kind"], v["conversation_id"], v["seq"]) for v in [*result.violations, *result.unknowns]
    }


async def orders_and_drain(d: Deployment) -> None:
    shop = await d.daemons["alpha"].client()
    warehouse = await d.daemons["beta"].client()
    handles = [
        await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(DIALOGS)
    ]
    for n in range(ORDERS):
        for h in handles:
            await shop.send(h, ORDER, f"order {n}".encode())
    await drain(warehouse, "OrderQueue", DIALOGS * ORDERS)

    async def settled() -> bool:
        return not await shop.transmission_queue()

    await wait_until(settled, 20)
    await shop.close()
    await warehouse.close()


async def test_every_planted_violation_is_found_exactly_with_its_evidence(
    tmp_path: Path, spark: SparkSession
) -> None:
    d = shop_and_warehouse(tmp_path / "run", FAST_RETRY, hosts=(ALPHA, BETA))
    with running(d):
        await orders_and_drain(d)
    assert run_audit(spark, trace_dirs(d)).passed

    copy = TraceCopy(trace_dirs(d), tmp_path / "copy")
    conversations = sorted(
        {
            line["conversation_id"]
            for line in copy.lines["beta"]
            if line["event"] == "delivered" and line["initiator"]
        }
    )
    assert len(conversations) == DIALOGS
    lost, gap, doubled, late, late_read, unsent = conversations

    def delivery(conversation: str, seq: int) -> tuple[Line, Line]:
        return copy.find("delivered", conversation, seq), copy.find("received", conversation, seq)

    # lost: the last order, acknowledged to the shop, never delivered nor received
    for line in delivery(lost, ORDERS):
        copy.remove(line)
    acked = next(
        line
        for line in copy.lines["alpha"]
        if line["event"] == "ack_received"
        and line["conversation_id"] == lost
        and str(ORDERS) in line["seqs"].split(",")
    )
    # gap: order 4 never delivered nor received, though 5 was
    gap_before, gap_after = copy.find("delivered", gap, 3), copy.find("delivered", gap, 5)
    for line in delivery(gap, 4):
        copy.remove(line)
    # duplicate: order 3 delivered a second time
    first = copy.find("delivered", doubled, 3)
    second = copy.add({**first, "ts": later(first["ts"])})
    # out of order: order 5 delivered after the last one
    moved = copy.find("delivered", late, 5)
    moved["ts"] = later(copy.find("delivered", late, ORDERS)["ts"])
    # out of order as the application received: order 5 received after the last one
    read = copy.find("received", late_read, 5)
    read["ts"] = later(copy.find("received", late_read, ORDERS)["ts"])
    # unsent: the shop's trace never sent order 6, which was delivered
    copy.remove(copy.find("message_sent", unsent, 6))
    result = run_audit(spark, [copy.write()])

    assert findings(result) == {
        ("lost", lost, ORDERS),
        ("gap", gap, 4),
        ("duplicate", doubled, 3),
        ("out_of_order", late, 5),
        ("out_of_order", late_read, 5),
        ("unsent", unsent, 6),
    }
    assert result.total == 6 and result.unknown == 0
    by = {(v["kind"], v["conversation_id"]): v for v in result.violations}
    for v in result.violations:
        assert (v["sender"], v["receiver"], v["direction"]) == (
            "alpha",
            "beta",
            "initiator->target",
        )
        text = violation_line(v)
        assert f"conversation {v['conversation_id']}" in text and f"seq {v['seq']}:" in text
        assert v["evidence"] and f"evidence {v['evidence'][0]}" in text
    assert by[("lost", lost)]["evidence"][0] == eid(acked)
    assert by[("gap", gap)]["evidence"] == [eid(gap_before), eid(gap_after)]
    assert by[("duplicate", doubled)]["evidence"] == sorted([eid(first), eid(second)])
    assert by[("out_of_order", late)]["detail"] == f"delivered after seq {ORDERS}"
    assert by[("out_of_order", late_read)]["detail"] == (
        f"received by the application after seq {ORDERS}"
    )

    # beta crashed around the missing delivery of the gap: its trace is missing, not lost.
    copy.add(
        {
            "v": 1,
            "instance": "beta",
            "ts": later(gap_after["ts"]),
            "event": "started",
            "last_n": gap_before["n"],
            "last_ts": gap_before["ts"],
            "last_event": "delivered",
            "clean": False,
        }
    )
    windowed = run_audit(spark, [copy.write()])
    assert findings(windowed) == findings(result) - {("gap", gap, 4)} | {("unknown", gap, 4)}
    (unknown,) = windowed.unknowns
    assert unknown["missing"] == "gap" and unknown["detail"].startswith("trace missing: ")
    assert unknown["evidence"][-2] == eid(gap_before)  # the last event on disk, then the marker
    assert windowed.total == 5 and windowed.unknown == 1


# -- a crash in the middle of a run ---------------------------------------------------------


class Producer:
    """Sends ``ORDERS_KILLED`` orders on each dialog, in order, each with its own key: a
    SEND cut by a crash is sent again with the same key once the daemon is back."""

    def __init__(self, d: Deployment, handles: list[uuid.UUID]) -> None:
        self.d = d
        self.handles = handles
        self.sent = 0

    async def run(self, total: int) -> None:
        shop: BrokerClient | None = None
        while self.sent < total:
            handle = self.handles[self.sent % len(self.handles)]
            try:
                if shop is None:
                    shop = await self.d.daemons["alpha"].client()
                body = f"{self.sent}".encode()
                await shop.send(handle, ORDER, body, key=f"order-{self.sent}")
            except ClientError:  # killed: the outcome is unknown, send it again
                if shop is not None:
                    await shop.close()
                shop = None
                await asyncio.sleep(0.1)
                continue
            self.sent += 1
            await asyncio.sleep(0.002)
        if shop is not None:
            await shop.close()


class Consumer:
    """Receives in transactions and keeps the first copy of each message: what the
    application got, by conversation, in the order it got them."""

    def __init__(self, d: Deployment) -> None:
        self.d = d
        self.got: dict[uuid.UUID, list[int]] = {}
        self.seen: set[tuple[uuid.UUID, int]] = set()

    @property
    def count(self) -> int:
        return len(self.seen)

    async def run(self, total: int) -> None:
        warehouse: BrokerClient | None = None
        while self.count < total:
            try:
                if warehouse is None:
                    warehouse = await self.d.daemons["beta"].client()
                async with warehouse.transaction() as tx:
                    batch = await tx.receive("OrderQueue", top=20, timeout=0.5)
                    for m in batch:
                        key = (m.conversation_handle, int(m.message_body))
                        if key not in self.seen:  # again after an unknown COMMIT outcome
                            self.seen.add(key)
                            self.got.setdefault(m.conversation_handle, []).append(key[1])
            except ClientError:
                if warehouse is not None:
                    await warehouse.close()
                warehouse = None
                await asyncio.sleep(0.1)
        if warehouse is not None:
            await warehouse.close()


async def test_a_run_with_daemons_killed_has_no_violation_and_no_lost(
    tmp_path: Path, spark: SparkSession
) -> None:
    total = 600
    d = shop_and_warehouse(tmp_path / "run", FAST_RETRY, hosts=(ALPHA, BETA))
    with running(d):
        shop = await d.daemons["alpha"].client()
        dialogs = [
            await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(3)
        ]
        handles = [dialog.handle for dialog in dialogs]
        await shop.close()
        producer, consumer = Producer(d, handles), Consumer(d)
        flows = asyncio.gather(producer.run(total), consumer.run(total))

        for name, at in (("beta", total // 3), ("alpha", 2 * total // 3)):

            async def past(at: int = at) -> bool:
                return consumer.count >= at

            await wait_until(past, 60)
            d.kill(name)  # SIGKILL: what its trace writer held is lost
            await asyncio.sleep(0.3)
            d.start(name)
        await asyncio.wait_for(flows, 120)

    # What the application received: every order once, in order on each dialog.
    assert len(consumer.got) == len(handles)
    for got in consumer.got.values():
        assert got == sorted(got) and len(got) == total // len(handles)
    assert sorted(n for got in consumer.got.values() for n in got) == list(range(total))

    result = run_audit(spark, trace_dirs(d))
    assert result.passed, [violation_line(v) for v in result.violations]
    assert result.counts["lost"] == result.counts["gap"] == 0
    # A trace the kill took is unknown, never a violation: only alpha's sends can be (a
    # SEND committed and sent on while its message_sent was still buffered).
    for v in result.unknowns:
        assert (v["missing"], v["sender"]) == ("unsent", "alpha"), violation_line(v)
        assert v["evidence"][-1].startswith("alpha#")
    starts = [
        line
        for directory in trace_dirs(d)
        for segment in segment_files([directory])
        for line in map(json.loads, segment_lines(segment))
        if line["event"] == "started"
    ]
    crashed = {line["instance"] for line in starts if line.get("clean") is False}
    assert crashed == {"alpha", "beta"}

    # The daemons' database files settle what the windows hid: no finding at all.
    files = [f for name in ("alpha", "beta") for f in d.daemons[name].directory.rglob("*.sqlite")]
    witnessed = run_audit(spark, trace_dirs(d), files)
    assert witnessed.passed and witnessed.unknown == 0
    assert witnessed.counts["witnessed"] == result.unknown
