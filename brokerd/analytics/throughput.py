"""Throughput over time per instance and route, and the spread over load-balanced routes.

Time is cut into buckets of equal width, chosen so a trace set gives at most about
:data:`MAX_BUCKETS` of them (1 s, 5 s, 10 s, 30 s, 1 min, 5 min, 15 min, 1 h...).
:func:`by_instance` counts, per bucket and instance, messages sent, delivered and
received, fragments sent and retransmitted, and the faults (:data:`FAULTS`: duplicates,
corrupted messages, drops, refused connections, conversations DELAYED) the report's
timeline marks; :func:`by_route` counts messages
sent per route. :func:`route_spread` shows how dialogs spread over the addresses a
service's routes lead to (R-ROUTE-5 step 3): for every service that more than one
address served, the dialogs per address and their share.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from brokerd.analytics.messages import STREAM, count_of, is_event
from brokerd.analytics.ordered import Ordered

MAX_BUCKETS = 200
WIDTHS = (1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 86400)


def bucket_width(first_t: int, last_t: int) -> int:
    """Bucket width in seconds for a trace set spanning ``first_t``..``last_t`` (µs)."""
    span = max(0.0, (last_t - first_t) / 1e6)
    for width in WIDTHS:
        if span / width <= MAX_BUCKETS:
            return width
    return int(span / MAX_BUCKETS) + 1


def bucket_of(t: Column, width: int) -> Column:
    """The bucket's start, seconds since the epoch."""
    return (F.floor(t / 1e6 / width) * width).cast("long")


FAULTS = {
    "duplicate": "duplicates",
    "corrupted_message": "corrupted_messages",
    "dropped": "drops",
    "connection_refused": "connections_refused",
    "delayed": "delayed",
}
"""Fault events counted per bucket: event name -> column."""


def by_instance(events: DataFrame, width: int) -> Ordered:
    """Per bucket and instance: messages sent/delivered/received, fragments, retransmissions
    and the :data:`FAULTS`."""
    counted = {
        "message_sent": "sent",
        "delivered": "delivered",
        "received": "received",
        "fragment_sent": "fragments_sent",
        "retransmission": "retransmissions",
        **FAULTS,
    }
    per_bucket = (
        events.where(F.col("event").isin(*counted))
        .groupBy(bucket_of(F.col("t"), width).alias("bucket"), "instance")
        .agg(*(count_of(event).alias(column) for event, column in counted.items()))
        .withColumn("delivered_per_s", F.round(F.col("delivered") / width, 3))
        .withColumn("sent_per_s", F.round(F.col("sent") / width, 3))
    )
    return Ordered(per_bucket, ("bucket", "instance"))


def by_route(messages: DataFrame, width: int) -> Ordered:
    """Per bucket and route: messages sent (by SEND time) and delivered."""
    per_bucket = (
        messages.where(F.col("sent_t").isNotNull())
        .groupBy(bucket_of(F.col("sent_t"), width).alias("bucket"), "sender", "route", "address")
        .agg(
            F.count(F.lit(1)).alias("sent"),
            F.count("delivered_t").alias("delivered"),
        )
        .withColumn("sent_per_s", F.round(F.col("sent") / width, 3))
    )
    return Ordered(per_bucket, ("bucket", "sender", "route"))


def route_spread(events: DataFrame) -> Ordered:
    """Dialogs per address for services reached at more than one address."""
    # one instance's events: its numbers order those of one microsecond
    latest = Window.partitionBy(*STREAM, "instance").orderBy(
        F.col("t").desc(), F.col("n").desc_nulls_last()
    )
    chosen = (
        events.where(is_event("route_chosen") & (F.col("decision") == "network"))
        .withColumn("newest", F.row_number().over(latest))
        .where(F.col("newest") == 1)
    )
    per_address = chosen.groupBy(F.col("instance").alias("sender"), "service", "address").agg(
        F.count(F.lit(1)).alias("dialogs"),
        F.concat_ws(",", F.sort_array(F.collect_set("route"))).alias("routes"),
    )
    service = Window.partitionBy("sender", "service")
    spread = (
        per_address.withColumn("addresses", F.count(F.lit(1)).over(service))
        .withColumn("service_dialogs", F.sum("dialogs").over(service))
        .where(F.col("addresses") > 1)
        .withColumn("share_pct", F.round(100.0 * F.col("dialogs") / F.col("service_dialogs"), 2))
        .select("sender", "service", "address", "routes", "dialogs", "share_pct")
    )
    return Ordered(spread, ("sender", "service", "address"))
