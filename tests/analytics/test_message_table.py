"""The message table (brokerd.analytics.messages) on handcrafted events whose rows are
known, and the report's tables cut at their limit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from brokerd.analytics.load import load_traces
from brokerd.analytics.messages import message_table
from brokerd.analytics.ordered import Ordered
from brokerd.analytics.report import collect
from brokerd.analytics.session import CLASS_ARCHIVE_SWITCH, JVM_HUGE_METHOD
from tests.analytics.handwritten import T0, Writer


def test_a_messages_first_and_last_events_of_a_kind_are_chosen_the_same_on_every_run(
    tmp_path: Path, spark: SparkSession
) -> None:
    """The message table takes each kind of event's earliest (its latest drop): of two
    deliveries at the same microsecond, the one of the least instance, whichever was
    written first; the drop's reason is the later drop's."""
    w = Writer(tmp_path)
    c = uuid.uuid4()
    common = {"initiator": True, "seq": 1}
    w.emit("a", T0 + 1, "message_sent", c, database="db", service="//a", size=10, **common)
    w.emit("f", T0 + 1.5, "dropped", c, reason="first", **common)
    w.emit("f", T0 + 1.8, "dropped", c, reason="later", **common)
    w.emit("b2", T0 + 2, "delivered", c, database="db", queue="q2", **common)
    w.emit("b1", T0 + 2, "delivered", c, database="db", queue="q1", **common)
    w.emit("b1", T0 + 3, "delivered", c, database="db", queue="q0", **common)
    w.close()
    loaded = load_traces(spark, [tmp_path])
    try:
        (row,) = message_table(loaded.events).collect()
    finally:
        loaded.release()
    micros = round((T0 + 2) * 1_000_000)
    assert (row["sender"], row["sent_t"]) == ("a", round((T0 + 1) * 1_000_000))
    assert (row["receiver"], row["queue"], row["delivered_t"]) == ("b1", "q1", micros)
    assert row["deliveries"] == 3 and row["status"] == "delivered"
    assert (row["drops"], row["drop_reason"]) == (2, "later")


def _ms(later: int, earlier: int) -> int:
    """Milliseconds between two trace times (microseconds), rounded."""
    return round((later - earlier) / 1000)


@pytest.mark.parametrize("straight_legs", [True, False])
def test_each_messages_legs_are_the_same_whether_it_went_straight_or_not(
    tmp_path: Path, spark: SparkSession, straight_legs: bool
) -> None:
    """The legs of a message that went straight from one instance to another come from the
    fold's aggregates (where expressions are compiled); every other way is worked out from
    the whole path. Each case here has its legs written out (R-REPORT-1), with the shortcut
    and without it: a retransmission after the first arrival, a duplicate, a forwarder, an
    arrival whose sender's departures are not in the set, one from an instance the message
    did not leave from."""
    w = Writer(tmp_path)
    c = {
        name: uuid.uuid4()
        for name in ("straight", "late_retry", "duplicate", "forwarded", "gone", "elsewhere")
    }
    a = {"database": "db", "initiator": True, "seq": 1}
    first = {"initiator": True, "seq": 1, "fragment": 0}

    def sent(conversation: uuid.UUID, at: float, attempt: int = 1) -> None:
        w.emit("a", T0 + at, "fragment_sent", conversation, fragment=0, attempt=attempt, **a)

    def arrived(conversation: uuid.UUID, instance: str, at: float, peer: str, hop: int = 0) -> None:
        w.emit(instance, T0 + at, "fragment_received", conversation, peer=peer, hop=hop, **first)

    for conversation in c.values():
        w.emit("a", T0, "message_sent", conversation, **a)
    sent(c["straight"], 0.001)
    arrived(c["straight"], "b", 0.004, "a@x")
    # the acknowledgement was late: a second attempt after the message had arrived
    sent(c["late_retry"], 0.001)
    arrived(c["late_retry"], "b", 0.003, "a@x")
    sent(c["late_retry"], 4.0, attempt=2)
    arrived(c["late_retry"], "b", 4.002, "a@x")
    # a retransmission before the first arrival, which came twice
    sent(c["duplicate"], 0.001)
    sent(c["duplicate"], 0.010, attempt=2)
    arrived(c["duplicate"], "b", 0.015, "a@x")
    arrived(c["duplicate"], "b", 0.020, "a@x")
    sent(c["forwarded"], 0.001)
    arrived(c["forwarded"], "f", 0.002, "a@x")
    w.emit("f", T0 + 0.005, "forwarded", c["forwarded"], hop=1, **first)
    arrived(c["forwarded"], "b", 0.009, "f@y", hop=1)
    # arrived, its departure's line not in the set
    arrived(c["gone"], "b", 0.002, "a@x")
    # arrived from an instance it did not leave from (its departure from there not in the set)
    sent(c["elsewhere"], 0.001)
    arrived(c["elsewhere"], "b", 0.002, "c@z")
    w.close()
    loaded = load_traces(spark, [tmp_path])
    try:
        table = message_table(loaded.events, straight_legs=straight_legs)
        rows = table.select("conversation_id", "legs", "dwells").collect()
    finally:
        loaded.release()
    legs = {
        row["conversation_id"]: sorted(
            (
                leg["leg"],
                leg["from_instance"],
                leg["to_instance"],
                _ms(leg["arrive"], leg["left_at"]),
            )
            for leg in row["legs"]
        )
        for row in rows
    }
    dwells = {
        row["conversation_id"]: [
            (d["instance"], d["hop"], _ms(d["depart"], d["arrive"])) for d in row["dwells"]
        ]
        for row in rows
    }
    assert legs[str(c["straight"])] == [(1, "a", "b", 3)]
    assert legs[str(c["late_retry"])] == [(1, "a", "b", 2)]
    assert legs[str(c["duplicate"])] == [(1, "a", "b", 5)]
    assert legs[str(c["forwarded"])] == [(1, "a", "f", 1), (2, "f", "b", 4)]
    assert legs[str(c["gone"])] == legs[str(c["elsewhere"])] == []
    assert dwells[str(c["forwarded"])] == [("f", 1, 3)]
    assert all(dwells[str(c[name])] == [] for name in c if name != "forwarded")


def test_a_table_longer_than_its_limit_keeps_its_order_and_counts_every_row_in_one_pass(
    spark: SparkSession,
) -> None:
    """The report's tables are cut at ``top`` rows and say how many there were: the rows
    are the first of the table's order, whether or not it is cut, and the count is the
    whole table's, taken in the job that sorts it (one job: the table's plan runs once)."""
    table = spark.range(0, 5000, numPartitions=3).selectExpr("id", "(id * 7919) % 1009 AS k")
    order = ("k", "id")
    expected = [list(row) for row in table.orderBy(*order).collect()]
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("cut-table", "a cut table")
    try:
        cut = collect(Ordered(table, order), "cut", 40)
    finally:
        spark.sparkContext.setJobGroup("", "")
    assert (cut.rows, cut.total_rows) == (expected[:40], 5000)
    assert len(tracker.getJobIdsForGroup("cut-table")) == 1
    whole = collect(Ordered(table.where("k < 3"), order), "whole", 40)
    assert (whole.rows, whole.total_rows) == ([r for r in expected if r[1] < 3], 15)
    every = collect(Ordered(table.where("k < 3"), order), "every", None)
    assert (every.rows, every.total_rows) == (whole.rows, 15)


def test_a_table_already_in_its_order_is_counted_whole(spark: SparkSession) -> None:
    """Rows that come in the table's order already (a range by its id, an aggregate
    sorted on its key) are read only ``limit + 1`` into each partition: the count is
    still the whole table's."""
    numbers = spark.range(0, 5000, numPartitions=3)
    assert collect(Ordered(numbers, ("id",)), "in order", 40).total_rows == 5000
    grouped = (
        numbers.selectExpr("id % 500 AS k", "cast(id AS string) AS s")
        .groupBy("k")
        .agg(F.max("s").alias("m"))  # a string's max: a sort-based aggregate on k
    )
    table = collect(Ordered(grouped, ("k",)), "sorted aggregate", 40)
    assert table.total_rows == 500
    assert [row[0] for row in table.rows] == list(range(40))


def test_an_acknowledgement_or_discard_without_its_stream_names_no_message(
    tmp_path: Path, spark: SparkSession
) -> None:
    """Events that list seqs (acknowledgements, discards) and lack their conversation or
    role name no stream: the table has no row for what they list, as it has none for a
    message event without them, and the acknowledgement with its stream still counts."""
    w = Writer(tmp_path)
    c = uuid.uuid4()
    w.emit("a", T0, "message_sent", c, database="db", initiator=True, seq=1)
    w.emit("a", T0 + 1, "ack_received", c, initiator=True, seqs="1")
    w.emit("a", T0 + 2, "ack_received", None, initiator=True, seqs="1,2")
    w.emit("a", T0 + 3, "discarded", c, seqs="1,3", reason="no role")
    w.close()
    loaded = load_traces(spark, [tmp_path])
    try:
        rows = message_table(loaded.events).collect()
    finally:
        loaded.release()
    assert [(r["conversation_id"], r["initiator"], r["seq"]) for r in rows] == [(str(c), True, 1)]
    assert rows[0]["acked_t"] == round((T0 + 1) * 1_000_000)
    assert rows[0]["discarded_t"] is None


CODEGEN = """
import sys
from pathlib import Path
from brokerd.analytics.load import load_traces
from brokerd.analytics.messages import message_table
from brokerd.analytics.session import spark_session
spark = spark_session("local[2]", driver_memory="1g", input_bytes=None)
# the stages' code is the same; only a plan that is not adaptive shows it before it runs
spark.conf.set("spark.sql.adaptive.enabled", "false")
print(spark.conf.get("spark.sql.codegen.hugeMethodLimit"))
table = message_table(load_traces(spark, [Path(sys.argv[1])]).events)
assert table.count() == 1
print(spark.sql("EXPLAIN CODEGEN SELECT * FROM {t}", t=table).collect()[0][0])
spark.stop()
"""


def test_the_rows_a_large_sets_sorts_take_in_are_made_by_code_the_jvm_compiles(
    tmp_path: Path,
) -> None:
    """With a large set's settings every stage of generated code that feeds a sort (the
    fold's rows before the stream's window, the routes' before theirs) has no method above
    the size HotSpot compiles: such a method runs interpreted on every row. The message
    table works out what it reads of the fold's lists after its window for that reason,
    and a stage that still has one runs as its operators (``JVM_HUGE_METHOD``). In a JVM
    of its own, with both compilers, as a large set's (the tests' shared JVM has the quick
    compiler's smaller code cache)."""
    w = Writer(tmp_path)
    c = uuid.uuid4()
    w.emit("a", T0, "message_sent", c, database="db", initiator=True, seq=1)
    w.emit("b", T0 + 1, "delivered", c, database="db", queue="q", initiator=True, seq=1)
    w.close()
    done = subprocess.run(
        [sys.executable, "-c", CODEGEN, str(tmp_path)],
        env={**os.environ, CLASS_ARCHIVE_SWITCH: "off"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    limit, plan = done.stdout.split("\n", 1)
    assert limit == str(JVM_HUGE_METHOD)
    stages = re.findall(r"^== Subtree .*?maxMethodCodeSize:(\d+);.*\n(.*)$", plan, re.M)
    sorts = [int(size) for size, root in stages if re.match(r"\*\(\d+\) Sort \[", root)]
    assert len(sorts) >= 2
    assert max(sorts) < JVM_HUGE_METHOD
