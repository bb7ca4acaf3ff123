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

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from brokerd.analytics.messages import STREAM, is_event
from brokerd.analytics.ordered import Ordered

ENDPOINT = [*STREAM, "instance"]


def delayed_periods(events: DataFrame, last_t: int) -> DataFrame:
    """One row per DELAYED period: endpoint, database, service, start_t (and start_n, its
    ``delayed`` event's number), end_t, seconds, reason (its first ``delayed`` event's)."""
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
        # the first ``delayed`` of the period: of one microsecond, the first by its number
        F.min(F.when(is_event("delayed"), F.struct("t", "n", "reason"))).alias("first"),
        F.min(F.when(ends, F.col("t"))).alias("end_t"),
        F.first("database", ignorenulls=True).alias("database"),
        F.first(F.when(is_event("delayed"), F.col("service")), ignorenulls=True).alias("service"),
        F.count(F.when(is_event("delayed"), 1)).alias("delayed_events"),
    )
    return periods.where(F.col("first").isNotNull()).select(
        *ENDPOINT,
        "database",
        "service",
        F.col("first.t").alias("start_t"),
        F.col("first.n").alias("start_n"),
        "end_t",
        F.col("end_t").isNull().alias("still_delayed"),
        F.round((F.coalesce("end_t", F.lit(last_t)) - F.col("first.t")) / 1e6, 6).alias("seconds"),
        F.col("first.reason").alias("reason"),
    )


def by_conversation(periods: DataFrame) -> Ordered:
    """Total DELAYED time per conversation endpoint, longest first."""
    per_endpoint = periods.groupBy(*ENDPOINT, "database", "service").agg(
        F.round(F.sum("seconds"), 6).alias("delayed_seconds"),
        F.count(F.lit(1)).alias("periods"),
        F.max("still_delayed").alias("still_delayed"),
        F.max_by("reason", F.struct("start_t", "start_n")).alias("last_reason"),
    )
    return Ordered(per_endpoint, (F.col("delayed_seconds").desc(), "conversation_id"))


REFUSAL_VARIES = (
    # the attempt's number and the next attempt's delay (or that nothing waits any more)
    (r"\s*\(attempt \d+\)(;.*)?$", ""),
    # an address as Python's errors name it: ('host', port) or ('host', port, flow, scope)
    (r"\('[^']*', \d+(, \d+)*\)", "<address>"),
    # the system's wording after an errno (it names the address, or the locale words it)
    (r"(\[Errno -?\d+\])[^;]*", "$1"),
    # host:port, [v6]:port, each maybe as a link's URL (tcp://host:port)
    (r"(tcp://)?(\[[0-9A-Fa-f:.%]+\]:\d+|[0-9A-Za-z_.:%-]+:\d+)", "<address>"),
)
"""What differs between refusals of one cause, in their reasons (``connection_refused``:
``connection refused by 127.0.0.11:4022 (attempt 3); next attempt in 4 s``), as Java
regular expressions and what each match becomes (:func:`refusal_cause`)."""


def refusal_cause(reason: Column) -> Column:
    """A refused connection's cause: its ``reason`` without what varies from one attempt
    to the next (:data:`REFUSAL_VARIES`), ``connection refused by <address>``. The trace
    carries no code for it: the reason is the link's own wording of the error
    (``brokerd/server/peer_link.py``)."""
    for pattern, replacement in REFUSAL_VARIES:
        reason = F.regexp_replace(reason, pattern, replacement)
    return F.trim(reason)


def wait_reasons(events: DataFrame, periods: DataFrame) -> Ordered:
    """Why messages waited: kind, reason, example, where, how often and (for DELAYED) for
    how long. A refused connection's reason is its cause (:func:`refusal_cause`), and
    ``example`` the latest of the reasons it stands for (of one instance's microsecond, the
    later by its event number); a DELAYED period's or a drop's reason is its own, and its
    example the same."""
    delayed = periods.groupBy(F.lit("delayed").alias("kind"), "reason").agg(
        F.max_by("reason", F.struct("start_t", "instance", "start_n")).alias("example"),
        F.concat_ws(",", F.sort_array(F.collect_set("instance"))).alias("where"),
        F.count(F.lit(1)).alias("times"),
        F.count_distinct("conversation_id").alias("conversations"),
        F.round(F.sum("seconds"), 6).alias("total_seconds"),
        F.round(F.max("seconds"), 6).alias("max_seconds"),
        F.count(F.when(F.col("still_delayed"), 1)).alias("still_waiting"),
    )
    latest = F.struct("t", "instance", "n")
    refused = (
        events.where(is_event("connection_refused"))
        .select(
            "t",
            "instance",
            "n",
            F.col("reason").alias("text"),
            refusal_cause(F.col("reason")).alias("reason"),
        )
        .groupBy(F.lit("connection refused").alias("kind"), "reason")
        .agg(
            F.max_by("text", latest).alias("example"),
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
            F.max_by("reason", latest).alias("example"),
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
