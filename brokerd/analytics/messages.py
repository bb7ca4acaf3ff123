"""One row per message, joined across every instance it touched (docs/traces.md).

A message is named by (``conversation_id``, ``initiator``, ``seq``): ``initiator``
is the role of the side that sent it, the same on the sender, on forwarders and on
the receiver. :func:`message_table` folds every event of a message (and the
acknowledgements and discards that list it in ``seqs``) into one row with one
shuffle, so the jobs that follow (latency, faults, audit, waiting) share it.

Columns: the key; ``sender``, ``database``, ``service``, ``far_service``,
``message_type``, ``size``; the times ``sent_t``, ``enqueued_t``,
``first_fragment_t``, ``acked_t``, ``discarded_t``, ``delivered_t``,
``received_t`` (microseconds, null when it did not happen); ``attempts``,
``retransmissions``, ``duplicates``, ``drops``, ``forwards``, ``max_hop``,
``deliveries``, ``receptions``; the evidence, as event ids (``instance#n``, see
:func:`event_id`): ``sent_id``, ``delivered_id``, ``delivered_n``, ``delivered_ids``,
``received_id``, ``received_n``, ``received_ids``, ``acked_id``, with ``reader`` (the
instance whose application received it); ``route`` and ``address`` (the first link used,
or the conversation's route for a local delivery), ``receiver``,
``target_database``, ``queue``, ``drop_reason``, ``discard_reason``; and
``status``, one of:

* ``delivered``: its delivery, its reception by the application, or a promoted mirror's
  ``inherited`` event covering it (R-TRACE-5) is in the set;
* ``discarded`` (its own side removed it unacknowledged);
* ``lost``: acknowledged, never delivered, and no earlier message of its stream
  is missing;
* ``held``: acknowledged (by an acknowledgement range) but held by the receiver
  until an earlier message arrives;
* ``acknowledged``: acknowledged, and the receiver's traces are not in the set;
* ``waiting``: sent, none of the above yet;
* ``unknown``: seen only in passing (a forwarder, a drop); its sender's traces
  are not in the set.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

KEY = ["conversation_id", "initiator", "seq"]
STREAM = ["conversation_id", "initiator"]
"""One direction of one conversation: the messages one side sends, in sequence order."""

MESSAGE_EVENTS = (
    "message_sent",
    "enqueued",
    "fragment_sent",
    "retransmission",
    "fragment_received",
    "duplicate",
    "forwarded",
    "dropped",
    "delivered",
    "received",
)


def is_event(name: str) -> Column:
    return F.col("event") == name


def time_of(name: str) -> Column:
    """The earliest time of event ``name`` in the group."""
    return F.min(F.when(is_event(name), F.col("t")))


def first_of(column: str, name: str) -> Column:
    """``column`` of the earliest event ``name`` in the group."""
    return F.min_by(F.when(is_event(name), F.col(column)), F.when(is_event(name), F.col("t")))


def first_fields(name: str, *columns: str) -> Column:
    """A struct of ``columns`` of the earliest event ``name`` in the group (one aggregate)."""
    return F.min_by(F.when(is_event(name), F.struct(*columns)), F.when(is_event(name), F.col("t")))


def last_of(column: str, name: str) -> Column:
    """``column`` of the latest event ``name`` in the group."""
    return F.max_by(F.when(is_event(name), F.col(column)), F.when(is_event(name), F.col("t")))


def count_of(name: str) -> Column:
    return F.count(F.when(is_event(name), 1))


def distinct_count(column: Column) -> Column:
    """How many distinct non-null values of ``column`` the group has, as a long.

    The same figure as ``count_distinct``, without its cost: an aggregate with a distinct
    count is planned as two aggregations, with a shuffle of every input row keyed by the
    group and the value before the group's own; a set is one more aggregate buffer."""
    return F.size(F.collect_set(column)).cast("long")


def event_id(events: DataFrame) -> DataFrame:
    """``events`` with ``eid``: ``instance#n``, the event's id (null for a line without
    ``n``, written before lines were numbered)."""
    return events.withColumn(
        "eid",
        F.when(F.col("n").isNotNull(), F.concat_ws("#", "instance", F.col("n").cast("string"))),
    )


def eid_of(instance: Column, n: Column) -> Column:
    """The event id ``instance#n`` (null without ``n``)."""
    return F.when(n.isNotNull(), F.concat_ws("#", instance, n.cast("string")))


def ids_of(name: str) -> Column:
    """The (instance, n) of every event ``name`` in the group (:func:`sorted_ids` makes
    them ids): the ids are built once per message, not once per event."""
    return F.collect_list(
        F.when(is_event(name) & F.col("n").isNotNull(), F.struct("instance", "n"))
    )


def sorted_ids(pairs: Column) -> Column:
    """The ids of :func:`ids_of`'s pairs, sorted."""
    return F.sort_array(F.transform(pairs, lambda p: eid_of(p["instance"], p["n"])))


def listed_messages(events: DataFrame, event: str, as_event: str) -> DataFrame:
    """Events that list messages in ``seqs`` (acknowledgements, discards), one row per seq."""
    return (
        events.where(is_event(event) & F.col("seqs").isNotNull() & (F.col("seqs") != ""))
        .select(
            "conversation_id",
            "initiator",
            "instance",
            "n",
            "t",
            "reason",
            F.explode(F.split("seqs", ",")).alias("listed"),
        )
        .withColumn("seq", F.col("listed").try_cast("long"))
        .where(F.col("seq").isNotNull())
        .drop("listed")
        .withColumn("event", F.lit(as_event))
    )


def conversation_routes(events: DataFrame) -> DataFrame:
    """The latest routing decision of each conversation endpoint: (stream, instance) -> route."""
    latest = Window.partitionBy(*STREAM, "instance").orderBy(F.col("t").desc())
    return (
        events.where(is_event("route_chosen"))
        .withColumn("n", F.row_number().over(latest))
        .where(F.col("n") == 1)
        .select(
            *STREAM,
            F.col("instance").alias("sender"),
            F.coalesce("route", F.col("decision")).alias("conversation_route"),
            F.coalesce("address", F.col("target_database")).alias("conversation_address"),
        )
    )


def inheritance(events: DataFrame) -> DataFrame:
    """What promoted mirrors inherited (``inherited`` events, R-ROUTE-16), per stream: the
    highest seq a receiving endpoint's file held in order (``inherited_received``, with
    its event's id ``inherited_id`` and time ``inherited_t``) and the highest its sending
    endpoint's file had sent (``inherited_sent``). An endpoint's ``initiator`` is its own
    role: it receives the other role's stream and sends its own."""
    e = event_id(
        events.where(
            is_event("inherited")
            & F.col("conversation_id").isNotNull()
            & F.col("initiator").isNotNull()
        )
    )
    received = e.groupBy("conversation_id", (~F.col("initiator")).alias("initiator")).agg(
        F.max("received_through").alias("inherited_received"),
        F.max_by("eid", "received_through").alias("inherited_id"),
        F.max_by("t", "received_through").alias("inherited_t"),
    )
    sent = e.groupBy("conversation_id", "initiator").agg(
        F.max("sent_through").alias("inherited_sent")
    )
    return received.join(sent, STREAM, "full")


def message_table(events: DataFrame) -> DataFrame:
    """Every message of the trace set, one row each (see the module docstring)."""
    per_message = events.where(
        F.col("event").isin(*MESSAGE_EVENTS)
        & F.col("conversation_id").isNotNull()
        & F.col("initiator").isNotNull()
        & (F.col("seq") > 0)
    )
    keyed = per_message.unionByName(
        listed_messages(events, "ack_received", "acked"), allowMissingColumns=True
    ).unionByName(listed_messages(events, "discarded", "discarded"), allowMissingColumns=True)
    folded = keyed.groupBy(*KEY).agg(
        first_fields(
            "message_sent",
            "instance",
            "database",
            "service",
            "far_service",
            "message_type",
            "size",
            "n",
        ).alias("sent"),
        time_of("message_sent").alias("sent_t"),
        time_of("enqueued").alias("enqueued_t"),
        time_of("fragment_sent").alias("first_fragment_t"),
        first_fields("fragment_sent", "route", "peer").alias("link"),
        F.max(F.when(is_event("fragment_sent"), F.col("attempt"))).alias("attempts"),
        count_of("retransmission").alias("retransmissions"),
        count_of("duplicate").alias("duplicates"),
        count_of("dropped").alias("drops"),
        last_of("reason", "dropped").alias("drop_reason"),
        distinct_count(F.when(is_event("forwarded"), F.col("instance"))).alias("forwards"),
        F.max(F.when(is_event("forwarded"), F.col("hop"))).alias("max_hop"),
        time_of("acked").alias("acked_t"),
        first_fields("acked", "instance", "n").alias("acked"),
        time_of("discarded").alias("discarded_t"),
        first_of("reason", "discarded").alias("discard_reason"),
        time_of("delivered").alias("delivered_t"),
        count_of("delivered").alias("deliveries"),
        first_fields("delivered", "instance", "database", "queue", "n").alias("delivery"),
        ids_of("delivered").alias("delivered_ids"),
        time_of("received").alias("received_t"),
        count_of("received").alias("receptions"),
        first_fields("received", "instance", "n").alias("reception"),
        ids_of("received").alias("received_ids"),
    )
    rows = folded.select(
        *KEY,
        F.col("sent.instance").alias("sender"),
        "sent.database",
        "sent.service",
        "sent.far_service",
        "sent.message_type",
        "sent.size",
        eid_of(F.col("sent.instance"), F.col("sent.n")).alias("sent_id"),
        "sent_t",
        "enqueued_t",
        "first_fragment_t",
        F.col("link.route").alias("fragment_route"),
        F.col("link.peer").alias("fragment_peer"),
        "attempts",
        "retransmissions",
        "duplicates",
        "drops",
        "drop_reason",
        "forwards",
        "max_hop",
        "acked_t",
        eid_of(F.col("acked.instance"), F.col("acked.n")).alias("acked_id"),
        "discarded_t",
        "discard_reason",
        "delivered_t",
        "deliveries",
        F.col("delivery.instance").alias("receiver"),
        F.col("delivery.database").alias("target_database"),
        "delivery.queue",
        F.col("delivery.n").alias("delivered_n"),
        eid_of(F.col("delivery.instance"), F.col("delivery.n")).alias("delivered_id"),
        sorted_ids(F.col("delivered_ids")).alias("delivered_ids"),
        "received_t",
        "receptions",
        F.col("reception.instance").alias("reader"),
        F.col("reception.n").alias("received_n"),
        eid_of(F.col("reception.instance"), F.col("reception.n")).alias("received_id"),
        sorted_ids(F.col("received_ids")).alias("received_ids"),
    )
    routes = conversation_routes(events)
    joined = rows.join(routes, on=[*STREAM, "sender"], how="left")
    # The receiver's traces are in the set when its side of the stream left a trace
    # (only the final target delivers and acknowledges; forwarders do neither).
    receivers = (
        events.where(F.col("event").isin("delivered", "ack_sent"))
        .select(*STREAM)
        .distinct()
        .withColumn("receiver_traced", F.lit(True))
    )
    # A message its application received was delivered, whether or not the delivery's own
    # event is in the set; so was one a promoted mirror's file held in order (R-TRACE-5).
    # joined on the stream, as the receivers are: no broadcast job (small sets have none)
    inherited = inheritance(events).select(*STREAM, "inherited_received")
    delivered = (
        F.col("delivered_t").isNotNull()
        | F.col("received_t").isNotNull()
        | (F.col("seq") <= F.coalesce(F.col("inherited_received"), F.lit(0)))
    )
    open_message = (
        ~delivered
        & F.col("discarded_t").isNull()
        & (F.col("sent_t").isNotNull() | F.col("acked_t").isNotNull())
    )
    stream = Window.partitionBy(*STREAM)
    with_stream = (
        joined.join(receivers, on=STREAM, how="left")
        .join(inherited, on=STREAM, how="left")
        .withColumn("lowest_open", F.min(F.when(open_message, F.col("seq"))).over(stream))
    )
    acked = F.col("acked_t").isNotNull()
    traced = F.col("receiver_traced").isNotNull()
    status = (
        F.when(delivered, "delivered")
        .when(F.col("discarded_t").isNotNull(), "discarded")
        .when(acked & ~traced, "acknowledged")
        .when(acked & (F.col("seq") == F.col("lowest_open")), "lost")
        .when(acked, "held")
        .when(F.col("sent_t").isNotNull(), "waiting")
        .otherwise("unknown")
    )
    return with_stream.select(
        *rows.columns,
        F.coalesce("fragment_route", "conversation_route").alias("route"),
        F.coalesce("fragment_peer", "conversation_address").alias("address"),
        status.alias("status"),
    ).drop("fragment_route", "fragment_peer")
