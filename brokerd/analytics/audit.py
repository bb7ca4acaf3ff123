"""The exactly-once-in-order audit (R-DLG-4, R-DLG-5): every violation, one per line.

For every stream (one direction of one conversation, named by ``conversation_id``
and the sender's ``initiator`` role) the delivered sequence numbers must be
1..n with no gap and no duplicate, delivered in order, and every sent message must
be delivered, discarded (by its own side: END CONVERSATION WITH ERROR or CLEANUP, a
broker error; or by a receiver that had ended, R-DLG-10) or still waiting in a
transmission queue. Violations:

* ``duplicate``: a message delivered more than once;
* ``gap``: sequence numbers never delivered (nor discarded) although a later one
  was; one line per missing range, named by its first seq;
* ``out_of_order``: a message delivered after a later one of its stream;
* ``lost``: acknowledged to its sender but never delivered, while no earlier
  message of its stream is missing (an acknowledgement range lets the receiver
  acknowledge a message it holds until an earlier one arrives: that is ``held``,
  not lost);
* ``unsent``: delivered, but its sender's traces (present for the stream from a
  lower seq on) never sent it.

What the set cannot show is not reported:

* a trace set may begin in the middle of a conversation (segments deleted,
  tracing switched on late): sequence numbers below the lowest one the set saw
  sent, delivered or discarded are not gaps, and delivered messages below the
  lowest one sent are not ``unsent``;
* when the receiver's traces are not in the set (no ``delivered`` or
  ``ack_sent`` for the stream), acknowledged messages are not ``lost``.

Unsequenced broker errors (seq 0) are not audited. Events lost by a crashed
daemon's trace writer (at most ``trace.flush_interval`` seconds of them) show
here as violations: the audit says what the traces show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from brokerd.analytics.messages import STREAM

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


def _violation(kind: str, detail: Column) -> list[Column]:
    columns = [*STREAM, "seq", "sender", "receiver"]
    return [F.lit(kind).alias("kind"), *map(F.col, columns), detail.alias("detail")]


def violations(messages: DataFrame) -> DataFrame:
    """Every violation: kind, conversation_id, initiator, seq, sender, receiver, detail."""
    stream = Window.partitionBy(*STREAM)
    sent = F.col("sent_t").isNotNull()
    delivered = F.col("deliveries") > 0
    discarded = F.col("status") == "discarded"
    m = (
        messages.withColumn(  # a lost message names its stream's receiver
            "receiver",
            F.coalesce("receiver", F.first("receiver", ignorenulls=True).over(stream)),
        )
        .withColumn(
            "sender", F.coalesce("sender", F.first("sender", ignorenulls=True).over(stream))
        )
        # the lowest seq the set saw sent, delivered or discarded: lower ones are
        # before the traces began (a late duplicate or RECEIVE does not count)
        .withColumn(
            "lowest", F.min(F.when(sent | delivered | discarded, F.col("seq"))).over(stream)
        )
        .withColumn("lowest_sent", F.min(F.when(sent, F.col("seq"))).over(stream))
        .withColumn("highest", F.max(F.when(delivered, F.col("seq"))).over(stream))
    )
    duplicates = m.where(F.col("deliveries") > 1).select(
        *_violation("duplicate", F.format_string("delivered %d times", "deliveries"))
    )
    lost = m.where(F.col("status") == "lost").select(
        *_violation("lost", F.lit("acknowledged to the sender but never delivered"))
    )
    unsent = m.where(delivered & ~sent & (F.col("seq") >= F.col("lowest_sent"))).select(
        *_violation("unsent", F.lit("delivered but never sent by its sender"))
    )
    in_time = Window.partitionBy(*STREAM).orderBy("delivered_t", "seq")
    out_of_order = (
        m.where(delivered)
        .withColumn("before", F.max("seq").over(in_time.rowsBetween(Window.unboundedPreceding, -1)))
        .where(F.col("before") > F.col("seq"))
        .select(*_violation("out_of_order", F.format_string("delivered after seq %d", "before")))
    )
    # Gaps: seqs from the stream's lowest to its highest delivered one that were neither
    # delivered nor discarded (END CONVERSATION WITH ERROR drops what is pending and
    # sends the error after it). One row per missing range, found between neighbours.
    accounted = m.where(
        (delivered | discarded)
        & (F.col("seq") >= F.col("lowest"))
        & (F.col("seq") <= F.col("highest"))
    )
    in_seq = Window.partitionBy(*STREAM).orderBy("seq")
    gaps = (
        accounted.withColumn("previous", F.coalesce(F.lag("seq").over(in_seq), F.col("lowest") - 1))
        .where(F.col("seq") - F.col("previous") > 1)
        .select(
            F.lit("gap").alias("kind"),
            *STREAM,
            (F.col("previous") + 1).alias("seq"),
            "sender",
            "receiver",
            F.when(
                F.col("seq") - F.col("previous") == 2,
                F.format_string("never delivered, though seq %d was", "highest"),
            )
            .otherwise(
                F.format_string(
                    "never delivered, nor the %d after it (to seq %d), though seq %d was",
                    F.col("seq") - F.col("previous") - 2,
                    F.col("seq") - 1,
                    "highest",
                )
            )
            .alias("detail"),
        )
    )
    return (
        duplicates.unionByName(gaps)
        .unionByName(out_of_order)
        .unionByName(lost)
        .unionByName(unsent)
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
