"""The exactly-once-in-order audit (R-DLG-4, R-DLG-5): every violation, one per line.

For every stream (one direction of one conversation, named by ``conversation_id``
and the sender's ``initiator`` role) the delivered sequence numbers must be
1..n with no gap and no duplicate, delivered in order, and every sent message must
be delivered, discarded by its own side (END CONVERSATION WITH ERROR or CLEANUP, a
broker error) or still waiting in a transmission queue. Violations:

* ``duplicate``: a message delivered more than once;
* ``gap``: a sequence number never delivered although a later one was;
* ``out_of_order``: a message delivered after a later one of its stream;
* ``lost``: acknowledged to its sender but never delivered;
* ``unsent``: delivered, but its sender's traces (present for the stream) never
  sent it.

A trace set may begin in the middle of a conversation (segments deleted, tracing
switched on late): sequence numbers below the lowest one the set mentions for a
stream are not reported as gaps. Unsequenced broker errors (seq 0) are not
audited. Events lost by a crashed daemon's trace writer (at most
``trace.flush_interval`` seconds of them) show here as violations: the audit
says what the traces show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.messages import STREAM

KINDS = ("duplicate", "gap", "out_of_order", "lost", "unsent")
MAX_LISTED = 10_000
"""Violations listed in full (all are counted)."""


@dataclass
class Audit:
    streams: int
    messages: int
    delivered: int
    waiting: int
    discarded: int
    counts: dict[str, int]
    violations: list[dict[str, Any]]
    """The first :data:`MAX_LISTED` violations, ordered by conversation and seq."""

    @property
    def passed(self) -> bool:
        return not any(self.counts.values())

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def view(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "streams": self.streams,
            "messages": self.messages,
            "delivered": self.delivered,
            "waiting": self.waiting,
            "discarded": self.discarded,
            "violations": self.total,
            "by_kind": self.counts,
            "listed": self.violations,
        }


def _direction(initiator: Column) -> Column:
    return F.when(initiator, "initiator->target").otherwise("target->initiator")


def violations(messages: DataFrame) -> DataFrame:
    """Every violation: kind, conversation_id, initiator, seq, sender, receiver, detail."""
    columns = ["kind", *STREAM, "seq", "sender", "receiver", "detail"]
    stream = Window.partitionBy(*STREAM)
    messages = messages.withColumn(  # a lost message names its stream's receiver
        "receiver",
        F.coalesce("receiver", F.first("receiver", ignorenulls=True).over(stream)),
    )
    duplicates = messages.where(F.col("deliveries") > 1).select(
        F.lit("duplicate").alias("kind"),
        *STREAM,
        "seq",
        "sender",
        "receiver",
        F.format_string("delivered %d times", "deliveries").alias("detail"),
    )
    lost = messages.where(F.col("status") == "lost").select(
        F.lit("lost").alias("kind"),
        *STREAM,
        "seq",
        "sender",
        "receiver",
        F.lit("acknowledged to the sender but never delivered").alias("detail"),
    )
    sent_streams = messages.withColumn(
        "stream_sent", F.count("sent_t").over(stream)
    )  # streams whose sender is in the trace set
    unsent = sent_streams.where(
        (F.col("deliveries") > 0) & F.col("sent_t").isNull() & (F.col("stream_sent") > 0)
    ).select(
        F.lit("unsent").alias("kind"),
        *STREAM,
        "seq",
        "sender",
        "receiver",
        F.lit("delivered but never sent by its sender").alias("detail"),
    )
    delivered = messages.where(F.col("deliveries") > 0)
    in_time = Window.partitionBy(*STREAM).orderBy("delivered_t", "seq")
    out_of_order = (
        delivered.withColumn(
            "before", F.max("seq").over(in_time.rowsBetween(Window.unboundedPreceding, -1))
        )
        .where(F.col("before") > F.col("seq"))
        .select(
            F.lit("out_of_order").alias("kind"),
            *STREAM,
            "seq",
            "sender",
            "receiver",
            F.format_string("delivered after seq %d", "before").alias("detail"),
        )
    )
    # Gaps: between the lowest seq the set mentions for the stream and the highest
    # delivered one, every seq must have been delivered (or discarded by its sender:
    # END CONVERSATION WITH ERROR drops what is pending and sends the error after it).
    bounds = messages.groupBy(*STREAM).agg(
        F.min("seq").alias("lowest"),
        F.max(F.when(F.col("deliveries") > 0, F.col("seq"))).alias("highest"),
        F.first("receiver", ignorenulls=True).alias("stream_receiver"),
        F.first("sender", ignorenulls=True).alias("stream_sender"),
    )
    expected = bounds.where(F.col("highest").isNotNull()).select(
        *STREAM,
        F.explode(F.sequence("lowest", "highest")).alias("seq"),
        "highest",
        "stream_sender",
        "stream_receiver",
    )
    accounted = messages.where((F.col("deliveries") > 0) | (F.col("status") == "discarded"))
    gaps = expected.join(
        accounted.select(*STREAM, "seq"), on=[*STREAM, "seq"], how="left_anti"
    ).select(
        F.lit("gap").alias("kind"),
        *STREAM,
        "seq",
        F.col("stream_sender").alias("sender"),
        F.col("stream_receiver").alias("receiver"),
        F.format_string("never delivered, though seq %d was", "highest").alias("detail"),
    )
    return (
        duplicates.unionByName(gaps)
        .unionByName(out_of_order)
        .unionByName(lost)
        .unionByName(unsent)
        .select(*columns)
        .withColumn("direction", _direction(F.col("initiator")))
    )


def audit(messages: DataFrame) -> Audit:
    found = violations(messages).cache()
    try:
        counts = {k: 0 for k in KINDS}
        for row in found.groupBy("kind").count().collect():
            counts[row["kind"]] = int(row["count"])
        listed = [
            r.asDict()
            for r in found.orderBy("conversation_id", "initiator", "seq", "kind")
            .limit(MAX_LISTED)
            .collect()
        ]
    finally:
        found.unpersist()
    totals = messages.agg(
        F.count_distinct(*STREAM).alias("streams"),
        F.count(F.lit(1)).alias("messages"),
        F.count(F.when(F.col("deliveries") > 0, 1)).alias("delivered"),
        F.count(F.when(F.col("status") == "waiting", 1)).alias("waiting"),
        F.count(F.when(F.col("status") == "discarded", 1)).alias("discarded"),
    ).first()
    assert totals is not None
    return Audit(
        streams=int(totals["streams"]),
        messages=int(totals["messages"]),
        delivered=int(totals["delivered"]),
        waiting=int(totals["waiting"]),
        discarded=int(totals["discarded"]),
        counts=counts,
        violations=listed,
    )


def violation_line(v: dict[str, Any]) -> str:
    """One violation as one line: ``GAP conversation C (initiator->target) seq 7: ...``."""
    return (
        f"{v['kind'].upper()} conversation {v['conversation_id']} ({v['direction']}) "
        f"seq {v['seq']}: {v['detail']} (sender {v['sender'] or '?'}, "
        f"receiver {v['receiver'] or '?'})"
    )
