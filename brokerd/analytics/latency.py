"""End-to-end latency: SEND to delivery and to RECEIVE, per service pair, route and hop.

Times are the instances' own clocks (docs/traces.md): brokers on one machine share
a clock; across machines the figures are as good as the clocks' agreement. All
figures are milliseconds. Percentiles are Spark's ``percentile_approx`` (rank error
below 1/10,000); counts, means and maxima are exact.

* :func:`by_service_pair` and :func:`by_route` read the message table;
* :func:`by_hop` follows each message link by link: from the sender to the first
  broker that received it, through every forwarder (whose own dwell time,
  received to forwarded, is given too) to the receiver (the message table's ``legs``
  and ``dwells``);
* :func:`latency_histogram` buckets SEND-to-delivery latencies on a log scale (ten
  buckets per decade) for the report's chart; :func:`histogram_by_route` does the
  same per sender, route and address, and :func:`by_hop` per leg of the path.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from brokerd.analytics.ordered import Ordered

PERCENTILES = [0.5, 0.9, 0.99]
ACCURACY = 10_000


def millis(later: str, earlier: str) -> Column:
    return (F.col(later) - F.col(earlier)) / 1000.0


def distribution(value: Column, prefix: str) -> list[Column]:
    """count, p50, p90, p99, max and mean of ``value`` (ms), names prefixed."""
    q = F.percentile_approx(value, PERCENTILES, ACCURACY)
    return [
        F.count(value).alias(f"{prefix}count"),
        F.round(q[0], 3).alias(f"{prefix}p50_ms"),
        F.round(q[1], 3).alias(f"{prefix}p90_ms"),
        F.round(q[2], 3).alias(f"{prefix}p99_ms"),
        F.round(F.max(value), 3).alias(f"{prefix}max_ms"),
        F.round(F.avg(value), 3).alias(f"{prefix}mean_ms"),
    ]


def _delivery_figures(messages: DataFrame, by: list[str]) -> Ordered:
    delivered = messages.where(F.col("delivered_t").isNotNull() & F.col("sent_t").isNotNull())
    figures = delivered.groupBy(*by).agg(
        *distribution(millis("delivered_t", "sent_t"), ""),
        *distribution(millis("received_t", "sent_t"), "receive_"),
    )
    return Ordered(figures, (F.col("count").desc(), *by))


def by_service_pair(messages: DataFrame) -> Ordered:
    """SEND to delivered and to received, per (service, far_service)."""
    return _delivery_figures(messages, ["service", "far_service"])


def by_route(messages: DataFrame) -> Ordered:
    """SEND to delivered and to received, per sender, route and first address."""
    return _delivery_figures(messages, ["sender", "route", "address"])


def by_hop(messages: DataFrame) -> tuple[Ordered, Ordered, Ordered]:
    """Per link of the path (leg 1 = sender to the first broker), and per forwarder dwell
    (the report's latency per leg of the path, R-REPORT-1), from the message table's
    ``legs`` and ``dwells`` (folded with the rest of each message's events: no job reads
    the events again for them).

    Returns (legs, dwell, histogram): legs has ``leg``, ``from_instance``,
    ``to_instance`` and the latency distribution; dwell has ``instance``, ``hop`` and
    the time each forwarder held a message (first fragment received to first fragment
    forwarded); histogram has the legs' latencies in log buckets (:func:`buckets`).

    A leg ends at a message's first arrival (fragment 0) on an instance; the
    receiving connection's peer (``instance@host:port``) names where it came from,
    and the leg starts at that instance's latest departure of the message before
    the arrival (a ``fragment_sent`` attempt or a ``forwarded``). So a retry over
    another path is its own leg, and a retransmission's wait is not a leg's
    latency (it is in the end-to-end figures). The leg number is the arrival's hop
    count plus one.
    """
    legs = messages.select(F.inline("legs"))
    leg = ["leg", "from_instance", "to_instance"]
    by_leg = legs.groupBy(*leg).agg(*distribution(millis("arrive", "left_at"), ""))
    dwell = (
        messages.select(F.inline("dwells"))
        .groupBy("instance", "hop")
        .agg(*distribution(millis("depart", "arrive"), ""))
    )
    return (
        Ordered(by_leg, tuple(leg)),
        Ordered(dwell, ("hop", "instance")),
        buckets(legs, millis("arrive", "left_at"), leg),
    )


def buckets(rows: DataFrame, ms: Column, by: list[str]) -> Ordered:
    """``ms`` in log buckets (ten per decade) per ``by``: ``low_ms``, ``high_ms``, ``messages``."""
    bucket = F.floor(F.log10(F.greatest(ms, F.lit(0.001))) * 10)
    counted = (
        rows.where(ms.isNotNull())
        .groupBy(*by, bucket.alias("b"))
        .agg(F.count(F.lit(1)).alias("messages"))
        .select(
            *by,
            F.round(F.pow(F.lit(10.0), F.col("b") / 10), 4).alias("low_ms"),
            F.round(F.pow(F.lit(10.0), (F.col("b") + 1) / 10), 4).alias("high_ms"),
            "messages",
        )
    )
    return Ordered(counted, (*by, "low_ms"))


def latency_histogram(messages: DataFrame) -> Ordered:
    """SEND-to-delivery latencies in log buckets: ``low_ms``, ``high_ms``, ``messages``."""
    return buckets(messages, millis("delivered_t", "sent_t"), [])


def histogram_by_route(messages: DataFrame) -> Ordered:
    """SEND-to-delivery latencies in log buckets per sender, route and address."""
    return buckets(messages, millis("delivered_t", "sent_t"), ["sender", "route", "address"])
