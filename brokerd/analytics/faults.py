"""Retransmissions, corrupted messages, duplicates and drops, per connection and per route.

A *connection* is one instance's view of one peer: ``(instance, peer)``, where the
peer is ``tcp://host:port`` for the sender's outgoing link and
``instance@host:port`` for a connection a broker accepted. Retransmissions are
counted on the sender's link, duplicates and corrupted messages on the receiving
side's connection. A *route* is the sender's route name and the address it led to;
duplicates and drops are joined to it through the message they concern.
Corrupted messages concern a frame, not a message, so they are counted per
connection only. Duplicates and drops are counted per fragment, as the events
are. :func:`drops_by_reason` says why messages were dropped, where.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from brokerd.analytics.messages import count_of, is_event
from brokerd.analytics.ordered import Ordered


def by_connection(events: DataFrame) -> Ordered:
    """Fragments, retransmissions, duplicates, corrupted messages per (instance, peer)."""
    per_connection = (
        events.where(
            F.col("peer").isNotNull()
            & F.col("event").isin(
                "fragment_sent",
                "retransmission",
                "fragment_received",
                "duplicate",
                "corrupted_message",
                "connection_opened",
                "connection_closed",
                "connection_refused",
            )
        )
        .groupBy("instance", "peer")
        .agg(
            count_of("fragment_sent").alias("fragments_sent"),
            count_of("retransmission").alias("retransmissions"),
            count_of("fragment_received").alias("fragments_received"),
            count_of("duplicate").alias("duplicates"),
            count_of("corrupted_message").alias("corrupted_messages"),
            count_of("connection_opened").alias("opened"),
            count_of("connection_closed").alias("closed"),
            count_of("connection_refused").alias("refused"),
        )
    )
    faults = F.col("retransmissions") + F.col("duplicates") + F.col("corrupted_messages")
    return Ordered(per_connection, (faults.desc(), "instance", "peer"))


def by_route(messages: DataFrame) -> Ordered:
    """Messages, retransmissions, duplicates and drops per (sender, route, address)."""
    per_route = (
        messages.where(F.col("sender").isNotNull())
        .groupBy("sender", "route", "address")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum("retransmissions").alias("retransmissions"),
            F.count(F.when(F.col("retransmissions") > 0, 1)).alias("messages_retransmitted"),
            F.max("attempts").alias("max_attempts"),
            F.sum("duplicates").alias("duplicates"),
            F.sum("drops").alias("drops"),
        )
    )
    order = (F.col("retransmissions").desc(), F.col("messages").desc(), "sender", "route")
    return Ordered(per_route, order)


def drops_by_reason(events: DataFrame) -> Ordered:
    """Where and why messages were dropped (not acknowledged) or discarded."""
    per_reason = (
        events.where(is_event("dropped") | is_event("discarded"))
        .groupBy("instance", "event", "reason")
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.count_distinct("conversation_id").alias("conversations"),
            F.min("t").alias("first_t"),
            F.max("t").alias("last_t"),
        )
    )
    return Ordered(per_reason, (F.col("events").desc(), "instance", "reason"))


def total_columns() -> list[Column]:
    """Whole-set counts of the fault events, as aggregate columns over the events."""
    return [
        count_of("retransmission").alias("retransmissions"),
        count_of("duplicate").alias("duplicates"),
        count_of("corrupted_message").alias("corrupted_messages"),
        count_of("dropped").alias("drops"),
        count_of("discarded").alias("discards"),
        count_of("connection_refused").alias("connections_refused"),
    ]
