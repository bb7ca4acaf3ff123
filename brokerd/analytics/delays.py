"""DELAYED time per conversation (R-ROUTE-13) and the reasons messages waited.

A conversation endpoint is DELAYED from its first ``delayed`` event until the next
``released`` or ``route_chosen`` one on the same instance (a restarted daemon decides
afresh: it writes ``route_chosen`` and no ``released``), or until the endpoint closes
(``dialog_ended``: END CONVERSATION WITH CLEANUP, for example); one with none of them
is still DELAYED at the end of the trace set, and its time is counted to then.
:func:`delayed_periods` gives one row per period, :func:`by_conversation` sums them and
:func:`wait_reasons` says why messages waited: DELAYED reasons (routing),
connections refused (the peer could not be reached), and drops (the receiving
side would not take the message, so the sender retransmits).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from brokerd.analytics.messages import STREAM, is_event
from brokerd.analytics.ordered import Ordered

ENDPOINT = [*STREAM, "instance"]


def delayed_periods(events: DataFrame, last_t: int) -> DataFrame:
    """One row per DELAYED period: endpoint, database, service, start_t, end_t, seconds, reason."""
    ends = is_event("released") | is_event("route_chosen") | is_event("dialog_ended")
    marks = events.where(
        (is_event("delayed") | ends)
        & F.col("conversation_id").isNotNull()
        & F.col("initiator").isNotNull()
    )
    before = (
        Window.partitionBy(*ENDPOINT)
        .orderBy("t", "n", "event")  # one instance's: its numbers order one microsecond's
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    numbered = marks.withColumn(
        "period", F.coalesce(F.sum(ends.cast("int")).over(before), F.lit(0))
    )
    periods = numbered.groupBy(*ENDPOINT, "period").agg(
        F.min(F.when(is_event("delayed"), F.col("t"))).alias("start_t"),
        F.min(F.when(ends, F.col("t"))).alias("end_t"),
        F.min_by(
            F.when(is_event("delayed"), F.col("reason")), F.when(is_event("delayed"), F.col("t"))
        ).alias("reason"),
        F.first("database", ignorenulls=True).alias("database"),
        F.first(F.when(is_event("delayed"), F.col("service")), ignorenulls=True).alias("service"),
        F.count(F.when(is_event("delayed"), 1)).alias("delayed_events"),
    )
    return periods.where(F.col("start_t").isNotNull()).select(
        *ENDPOINT,
        "database",
        "service",
        "start_t",
        "end_t",
        F.col("end_t").isNull().alias("still_delayed"),
        F.round((F.coalesce("end_t", F.lit(last_t)) - F.col("start_t")) / 1e6, 6).alias("seconds"),
        "reason",
    )


def by_conversation(periods: DataFrame) -> Ordered:
    """Total DELAYED time per conversation endpoint, longest first."""
    per_endpoint = periods.groupBy(*ENDPOINT, "database", "service").agg(
        F.round(F.sum("seconds"), 6).alias("delayed_seconds"),
        F.count(F.lit(1)).alias("periods"),
        F.max("still_delayed").alias("still_delayed"),
        F.max_by("reason", "start_t").alias("last_reason"),
    )
    return Ordered(per_endpoint, (F.col("delayed_seconds").desc(), "conversation_id"))


def wait_reasons(events: DataFrame, periods: DataFrame) -> Ordered:
    """Why messages waited: kind, reason, where, how often and (for DELAYED) for how long."""
    delayed = periods.groupBy(F.lit("delayed").alias("kind"), "reason").agg(
        F.concat_ws(",", F.sort_array(F.collect_set("instance"))).alias("where"),
        F.count(F.lit(1)).alias("times"),
        F.count_distinct("conversation_id").alias("conversations"),
        F.round(F.sum("seconds"), 6).alias("total_seconds"),
        F.round(F.max("seconds"), 6).alias("max_seconds"),
        F.count(F.when(F.col("still_delayed"), 1)).alias("still_waiting"),
    )
    refused = (
        events.where(is_event("connection_refused"))
        .groupBy(F.lit("connection refused").alias("kind"), "reason")
        .agg(
            F.concat_ws(",", F.sort_array(F.collect_set("instance"))).alias("where"),
            F.count(F.lit(1)).alias("times"),
            F.lit(0).cast("long").alias("conversations"),
            F.lit(None).cast("double").alias("total_seconds"),
            F.lit(None).cast("double").alias("max_seconds"),
            F.lit(None).cast("long").alias("still_waiting"),
        )
    )
    dropped = (
        events.where(is_event("dropped"))
        .groupBy(F.lit("dropped").alias("kind"), "reason")
        .agg(
            F.concat_ws(",", F.sort_array(F.collect_set("instance"))).alias("where"),
            F.count(F.lit(1)).alias("times"),
            F.count_distinct("conversation_id").alias("conversations"),
            F.lit(None).cast("double").alias("total_seconds"),
            F.lit(None).cast("double").alias("max_seconds"),
            F.lit(None).cast("long").alias("still_waiting"),
        )
    )
    # ties in a fixed order, so the same traces always give the same table
    return Ordered(
        delayed.unionByName(refused).unionByName(dropped),
        (F.col("times").desc(), "kind", "reason", "where"),
    )
