"""The endpoints and messages waiting longest, with their last known status.

"Now" is the latest event of the trace set. A message waits when it was sent and
is neither acknowledged, delivered nor discarded; its age is now minus its SEND
time and its status is the last thing the traces say about it: its
conversation's DELAYED reason when the conversation is still DELAYED, otherwise
its latest event on any instance (events of one instant ordered by the life of a
message, ``MESSAGE_EVENTS``, and two of one kind at one instant by their numbers ``n``:
the same choice on every run). An
endpoint is open from ``dialog_begun`` until ``dialog_ended`` (and again from a later
``dialog_begun``: a target's endpoint removed after its keep is begun again, under the
same conversation id, by a late copy of the dialog's first message, SPEC §5); for each
open endpoint the table gives its age (from its latest beginning), how long it has been
idle, its last event (one instance's events of one microsecond ordered by their numbers
``n``, as its beginnings and ends are), and how many of its messages wait to be sent or
to be RECEIVEd (the pile-ups nobody notices). :func:`longest_waits` gives the messages
that waited longest, delivered or not, and why (the report's "Longest waits").
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from brokerd.analytics.messages import KEY, STREAM, is_event
from brokerd.analytics.ordered import Ordered

RECEIVING_SIDE = (
    "fragment_received",
    "duplicate",
    "dropped",
    "delivered",
    "received",
    "ack_sent",
    "rolled_back",
    "quarantined",
    "queue_disabled",
)
"""Events whose ``initiator`` names the other side (the messages' sender), not the endpoint:
the receiving side's message events, and the rollbacks and poison-message handling of the
messages it received."""


def _status(latest: str) -> Column:
    """A readable status from the fields of a message's latest event (the message table's
    ``latest``)."""

    def field(name: str) -> Column:
        return F.col(f"{latest}.{name}")

    event = field("event")
    return (
        F.when(
            event == "retransmission",
            F.format_string(
                "retransmitted (attempt %d) to %s, next in %.1f s",
                field("attempt"),
                field("peer"),
                field("wait"),
            ),
        )
        .when(
            event == "fragment_sent",
            F.format_string("sent (attempt %d) to %s", field("attempt"), field("peer")),
        )
        .when(
            event == "forwarded",
            F.format_string("forwarded (hop %d) to %s", field("hop"), field("address")),
        )
        .when(event == "dropped", F.concat(F.lit("dropped: "), field("reason")))
        .when(event == "enqueued", F.lit("in the transmission queue, not sent yet"))
        .when(event == "message_sent", F.lit("sent by the application, not yet committed"))
        .otherwise(event)
    )


def waiting_messages(events: DataFrame, messages: DataFrame, last_t: int) -> Ordered:
    """Messages still waiting, oldest first, with their last known status.

    A message's latest event comes with its row (the message table's ``latest``, folded
    with the rest of its events); only the conversations' DELAYED state is read from the
    events here, from the few events that change it."""
    fields = [
        *KEY,
        "sender",
        "database",
        "service",
        "far_service",
        "sent_t",
        "attempts",
        "route",
        "address",
    ]
    waiting = messages.where(F.col("status") == "waiting").select(
        *fields,
        F.round((F.lit(last_t) - F.col("sent_t")) / 1e6, 3).alias("age_seconds"),
        F.col("latest.instance").alias("status_instance"),
        _status("latest").alias("message_status"),
    )
    # one instance's events: its event numbers order those of one microsecond
    delayed_now = Window.partitionBy(*STREAM, "instance").orderBy(
        F.col("t").desc(), F.col("n").desc_nulls_last()
    )
    delays = (
        events.where(is_event("delayed") | is_event("released") | is_event("route_chosen"))
        .withColumn("newest", F.row_number().over(delayed_now))
        .where((F.col("newest") == 1) & is_event("delayed"))
        .select(
            *STREAM,
            F.col("instance").alias("sender"),
            F.concat(F.lit("DELAYED: "), F.col("reason")).alias("delayed_status"),
        )
    )
    listed = waiting.join(delays, on=[*STREAM, "sender"], how="left").select(
        *fields,
        "age_seconds",
        # a conversation still DELAYED at the end of the set: that is why it waits
        F.coalesce("delayed_status", "message_status").alias("last_status"),
        F.coalesce("status_instance", "sender").alias("status_instance"),
    )
    return Ordered(listed, ("sent_t", *KEY))


def _at(event: str) -> Column:
    """The latest ``event`` of the group, by its time and (one instance's events of one
    microsecond) its number: a struct of the two, as :func:`_open` compares them."""
    return F.max(F.when(is_event(event), F.struct("t", "n")))


def _open() -> Column:
    """An endpoint (``begun``, ``ended``: its latest ``dialog_begun`` and ``dialog_ended``,
    :func:`_at`) not ended since it was last begun."""
    return F.col("begun").isNotNull() & (
        F.col("ended").isNull() | (F.col("ended") < F.col("begun"))
    )


def open_endpoints(events: DataFrame, messages: DataFrame, last_t: int) -> Ordered:
    """Endpoints begun and not ended, oldest first: age, idle time, last event, backlog."""
    endpoint = [*STREAM, "instance"]
    # First the few conversations with an endpoint not ended since it was last begun
    # (begun/ended events only), then the activity of those conversations alone. An
    # endpoint removed after its keep is begun again, under the same conversation id, by
    # a late copy of the dialog's first message (SPEC §5): it is open again.
    lifecycle = is_event("dialog_begun") | is_event("dialog_ended")
    unended = (
        events.where(lifecycle & F.col("conversation_id").isNotNull())
        .groupBy(*endpoint)
        .agg(_at("dialog_begun").alias("begun"), _at("dialog_ended").alias("ended"))
        .where(_open())
        .select("conversation_id")
        .distinct()
    )
    activity = (
        events.where(F.col("conversation_id").isNotNull() & F.col("initiator").isNotNull())
        .join(unended, on="conversation_id", how="left_semi")
        .withColumn(
            # message events carry the sender's role; on the receiving side the
            # endpoint's own role is the other one
            "role",
            F.when(
                F.col("event").isin(*RECEIVING_SIDE),
                ~F.col("initiator"),
            ).otherwise(F.col("initiator")),
        )
        .groupBy("conversation_id", F.col("role").alias("initiator"), "instance")
        .agg(
            _at("dialog_begun").alias("begun"),
            _at("dialog_ended").alias("ended"),
            # one instance's events: its numbers order those of one microsecond
            F.max(F.struct("t", "n", "event")).alias("last"),
            F.first("database", ignorenulls=True).alias("database"),
            F.first(F.when(is_event("dialog_begun"), F.col("service")), ignorenulls=True).alias(
                "service"
            ),
            F.first(F.when(is_event("dialog_begun"), F.col("far_service")), ignorenulls=True).alias(
                "far_service"
            ),
        )
        .where(_open())
    )
    unsent = (
        messages.where(F.col("status") == "waiting")
        .groupBy(*STREAM, F.col("sender").alias("instance"))
        .agg(F.count(F.lit(1)).alias("messages_waiting_to_send"))
    )
    unreceived = (
        # a copy delivered again (a duplicate: a dialog begun again, say) waits too
        messages.where(F.col("deliveries") > F.col("receptions"))
        .groupBy(
            "conversation_id",
            (~F.col("initiator")).alias("initiator"),
            F.col("receiver").alias("instance"),
        )
        .agg(F.count(F.lit(1)).alias("messages_not_received"))
    )
    listed = (
        activity.join(unsent, on=endpoint, how="left")
        .join(unreceived, on=endpoint, how="left")
        .select(
            *endpoint,
            "database",
            "service",
            "far_service",
            F.round((F.lit(last_t) - F.col("begun.t")) / 1e6, 3).alias("age_seconds"),
            F.round((F.lit(last_t) - F.col("last.t")) / 1e6, 3).alias("idle_seconds"),
            F.col("last.event").alias("last_event"),
            F.coalesce("messages_waiting_to_send", F.lit(0)).alias("messages_waiting_to_send"),
            F.coalesce("messages_not_received", F.lit(0)).alias("messages_not_received"),
        )
    )
    return Ordered(listed, (F.col("age_seconds").desc(), "conversation_id"))


FAR_BROKER_EVENTS = ("fragment_sent", "retransmission", "route_chosen")
"""The sending endpoint's events that name its far broker: the addresses it sent to
(``peer``) or was routed to (``route_chosen``'s ``address``)."""


def longest_waits(
    events: DataFrame, messages: DataFrame, periods: DataFrame, last_t: int, top: int
) -> Ordered:
    """The ``top`` messages that waited longest, delivered or not, with why, longest first.

    The wait is SEND to delivery (to the end of the set for a message still waiting).
    It is cut into the time before the first fragment left (in the transmission
    queue: no route, DELAYED, no connection yet) and the time from there to delivery
    (on the way: retransmissions, drops, forwarders). ``reason`` names the longer part
    and what the traces say of it: the conversation's DELAYED time while the message
    waited to leave, and the latest reason of it (``periods`` is
    :func:`brokerd.analytics.delays.delayed_periods`: a period before its SEND or after it
    left explains nothing of its wait), the connections the sender could not open to the
    far broker while the message waited, to leave or, once it had left, to be sent again
    (its far broker down: it is retransmitted once a connection opens), to the addresses
    its endpoint sent to or was routed to, as ``brokerctl trace`` says (a refusal of a
    connection to another broker explains nothing of it; when none is named, every
    refusal of the sender), with the latest one's reason (of one microsecond, the later
    by its event number), retransmissions, drops and their reason, forwarders, and
    whether it still waits. The DELAYED periods, far brokers and refused connections are
    joined to the ``top`` rows only (range joins on the sender and the wait).
    """
    end = F.coalesce("delivered_t", F.lit(last_t))
    start_queue = F.coalesce("enqueued_t", "sent_t")
    queued = (F.coalesce("first_fragment_t", end) - start_queue) / 1e6
    on_the_way = (end - F.col("first_fragment_t")) / 1e6
    longest = (
        messages.where(F.col("sent_t").isNotNull() & F.col("status").isin("delivered", "waiting"))
        .withColumn("wait_seconds", F.round((end - F.col("sent_t")) / 1e6, 6))
        .withColumn("queued_seconds", F.round(queued, 6))
        .withColumn("on_the_way_seconds", F.round(on_the_way, 6))
        .withColumn("left_t", F.coalesce("first_fragment_t", end))
        .orderBy(F.col("wait_seconds").desc(), *KEY)
        .limit(top)
    )
    waits = longest.select(*KEY, "sender", "sent_t", "left_t", end.alias("end_t"))
    # the DELAYED time of the sending endpoint while the message waited to leave
    overlap = F.least(F.coalesce("until_t", F.lit(last_t)), F.col("left_t")) - F.greatest(
        "start_t", "sent_t"
    )
    delayed = (
        periods.select(
            *STREAM,
            F.col("instance").alias("sender"),
            "start_t",
            "start_n",
            F.col("end_t").alias("until_t"),
            "reason",
        )
        .join(F.broadcast(waits.drop("end_t")), on=[*STREAM, "sender"])
        .where(overlap > 0)
        .groupBy(*KEY)
        .agg(
            F.round(F.sum(overlap) / 1e6, 6).alias("delayed_seconds"),
            F.max_by("reason", F.struct("start_t", "start_n")).alias("delayed_reason"),
        )
    )
    far = (
        events.where(F.col("event").isin(*FAR_BROKER_EVENTS))
        .join(
            F.broadcast(waits.select(*STREAM, F.col("sender").alias("instance"))),
            on=[*STREAM, "instance"],
            how="left_semi",
        )
        .select(
            *STREAM,
            F.col("instance").alias("sender"),
            F.when(is_event("route_chosen"), F.col("address"))
            .otherwise(F.col("peer"))
            .alias("far"),
        )
        .where(F.col("far") != "")
        .groupBy(*STREAM, "sender")
        .agg(F.collect_set("far").alias("far_brokers"))
    )
    refusals = events.where(is_event("connection_refused")).select(
        F.col("instance").alias("refused_on"),
        F.col("t").alias("refused_t"),
        F.col("n").alias("refused_n"),
        F.col("peer").alias("refused_peer"),
        "reason",
    )
    refused = (
        refusals.join(
            F.broadcast(waits.join(far, on=[*STREAM, "sender"], how="left")),
            (F.col("refused_on") == F.col("sender"))
            # the whole wait: to leave, and on the way (its far broker down, it is sent
            # again once a connection opens)
            & F.col("refused_t").between(F.col("sent_t"), F.col("end_t"))
            # none named: every refusal of the sending broker may explain the wait
            & (
                F.col("far_brokers").isNull()
                | F.array_contains("far_brokers", F.col("refused_peer"))
            ),
        )
        .groupBy(*KEY)
        .agg(
            F.count(F.lit(1)).alias("refusals"),
            # one instance's: its numbers order one microsecond's
            F.max_by("reason", F.struct("refused_t", "refused_n")).alias("refusal_reason"),
        )
    )
    rows = longest.join(delayed, on=KEY, how="left").join(refused, on=KEY, how="left")
    longer = F.when(
        F.coalesce("on_the_way_seconds", F.lit(0.0)) > F.col("queued_seconds"),
        F.format_string("on the way %.3f s", "on_the_way_seconds"),
    ).otherwise(F.format_string("in the transmission queue %.3f s", "queued_seconds"))
    reason = F.concat_ws(
        "; ",
        longer,
        F.when(
            F.col("delayed_seconds") > 0,
            F.format_string("DELAYED %.3f s: %s", "delayed_seconds", "delayed_reason"),
        ),
        F.when(
            F.col("refusals") > 0,
            F.format_string(
                "%d connection(s) refused meanwhile (%s)", "refusals", "refusal_reason"
            ),
        ),
        F.when(
            F.col("retransmissions") > 0,
            F.format_string("%d retransmission(s), %d attempts", "retransmissions", "attempts"),
        ),
        F.when(
            F.col("drops") > 0, F.format_string("dropped %d time(s): %s", "drops", "drop_reason")
        ),
        F.when(F.col("forwards") > 0, F.format_string("relayed by %d forwarder(s)", "forwards")),
        F.when(F.col("status") == "waiting", F.lit("still waiting")),
    )
    listed = rows.select(
        *KEY,
        "sender",
        "receiver",
        "route",
        "address",
        "sent_t",
        "status",
        "wait_seconds",
        "queued_seconds",
        "on_the_way_seconds",
        reason.alias("reason"),
    )
    return Ordered(listed, (F.col("wait_seconds").desc(), *KEY))
