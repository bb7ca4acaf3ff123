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
``target_database``, ``queue``, ``drop_reason``, ``discard_reason``; for a message
still waiting, ``latest``, its latest event on any instance (the fields
:mod:`brokerd.analytics.waiting` words its status from, :data:`LATEST_EVENT`), so that
no job reads every event again for the few messages that wait; ``legs`` and ``dwells``,
the message's way from instance to instance (:data:`LEGS`, or :data:`ONE_LEG` for a message
that went straight, and :data:`DWELLS`: the tables of
:func:`brokerd.analytics.latency.by_hop`); and ``status``, one of:

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

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from brokerd.analytics.session import compiles_expressions

KEY = ["conversation_id", "initiator", "seq"]
STREAM = ["conversation_id", "initiator"]
"""One direction of one conversation: the messages one side sends, in sequence order."""

MESSAGE_EVENTS = (
    "message_sent",
    "enqueued",
    "retransmission",  # written before the fragment it sends again
    "fragment_sent",
    "fragment_received",
    "duplicate",
    "forwarded",
    "dropped",
    "delivered",
    "received",
)


def is_event(name: str) -> Column:
    return F.col("event") == name


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


INHERITANCE_SQL = """
WITH e AS (
  SELECT *, CASE WHEN n IS NOT NULL THEN concat_ws('#', instance, CAST(n AS STRING)) END AS eid
  FROM {events}
  WHERE event = 'inherited' AND conversation_id IS NOT NULL AND initiator IS NOT NULL
),
received AS (
  SELECT conversation_id, NOT initiator AS initiator,
         max(received_through) AS inherited_received,
         max_by(eid, received_through) AS inherited_id,
         max_by(instance, received_through) AS inherited_instance,
         max_by(t, received_through) AS inherited_t,
         max_by(n, received_through) AS inherited_n
  FROM e GROUP BY conversation_id, NOT initiator
),
sent AS (
  SELECT conversation_id, initiator, max(sent_through) AS inherited_sent
  FROM e GROUP BY conversation_id, initiator
)
SELECT * FROM received FULL JOIN sent USING (conversation_id, initiator)
"""
"""What promoted mirrors inherited, per stream: :func:`inheritance`."""


def inheritance(events: DataFrame) -> DataFrame:
    """What promoted mirrors inherited (``inherited`` events, R-ROUTE-16), per stream: the
    highest seq a receiving endpoint's file held in order (``inherited_received``, with
    its event's id ``inherited_id``, instance ``inherited_instance``, time
    ``inherited_t`` and number ``inherited_n``) and the highest its sending
    endpoint's file had sent (``inherited_sent``). An endpoint's ``initiator`` is its own
    role: it receives the other role's stream and sends its own."""
    return events.sparkSession.sql(INHERITANCE_SQL, events=events)


MESSAGE_COLUMNS = (
    *KEY,
    "sender",
    "database",
    "service",
    "far_service",
    "message_type",
    "size",
    "sent_id",
    "sent_t",
    "enqueued_t",
    "first_fragment_t",
    "attempts",
    "retransmissions",
    "duplicates",
    "drops",
    "drop_reason",
    "forwards",
    "max_hop",
    "acked_t",
    "acked_id",
    "discarded_t",
    "discard_reason",
    "delivered_t",
    "deliveries",
    "receiver",
    "target_database",
    "queue",
    "delivered_n",
    "delivered_id",
    "delivered_ids",
    "received_t",
    "receptions",
    "reader",
    "received_n",
    "received_id",
    "received_ids",
)
"""The message table's columns before ``route``, ``address`` and ``status``."""


def _when(event: str, value: str) -> str:
    return f"CASE WHEN event = '{event}' THEN {value} END"


def _first(event: str, fields: str) -> str:
    """SQL: the earliest event ``event`` of the group, as a struct of its time ``t`` and
    ``fields``. One aggregate with one buffer for the time and the fields both, where a
    ``min_by`` beside a ``min`` of the time was two, one of them with two buffers, each
    evaluating its own conditions on every event of the table (interpreted, on a small
    set, a third of the fold's CPU); of events at the same time, the least by the
    fields, the same on every run: ``fields`` begin with the event's number ``n`` (or
    its instance, then ``n``), so that one instance's events of one microsecond are
    ordered as they were written."""
    return f"min({_when(event, f'struct(t, {fields})')})"


def _last(event: str, fields: str) -> str:
    """SQL: the latest event ``event`` of the group, as :func:`_first` the earliest."""
    return f"max({_when(event, f'struct(t, {fields})')})"


def _eid(instance: str, n: str) -> str:
    """SQL: the event id ``instance#n`` (null without ``n``), as :func:`event_id`."""
    return f"CASE WHEN {n} IS NOT NULL THEN concat_ws('#', {instance}, CAST({n} AS STRING)) END"


def _ids(pairs: str) -> str:
    """SQL: the sorted ids of a list of (instance, n): built once per message, not once per
    event."""
    return f"sort_array(transform({pairs}, p -> {_eid('p.instance', 'p.n')}))"


def _listed(event: str, as_event: str) -> str:
    """SQL: the events that list messages in ``seqs`` (acknowledgements, discards), one
    row per seq, as event ``as_event``; one without its stream names no message (as the
    message events without one)."""
    return f"""
    SELECT conversation_id, initiator, instance, n, t, reason, seq, '{as_event}' AS event
    FROM (
      SELECT *, try_cast(listed AS BIGINT) AS seq
      FROM (
        SELECT conversation_id, initiator, instance, n, t, reason,
               explode(split(seqs, ',')) AS listed
        FROM {{events}}
        WHERE event = '{event}' AND seqs IS NOT NULL AND seqs != ''
          AND conversation_id IS NOT NULL AND initiator IS NOT NULL
      )
    )
    WHERE seq IS NOT NULL"""


_MESSAGE_EVENT_LIST = ", ".join(f"'{name}'" for name in MESSAGE_EVENTS)
LATEST_EVENT = (
    f"struct(t, array_position(array({_MESSAGE_EVENT_LIST}), event) AS stage, n, event,"
    " instance, attempt, peer, wait, hop, address, reason)"
)
"""SQL: a message event as the fold's ``max`` orders it, the latest by time and, of one
instant, by the life of a message (``MESSAGE_EVENTS``, in the order one instance writes
them), then by the event's number: the message table's ``latest``."""

ARRIVAL_SOURCE = "regexp_extract(peer, '^(.*)@[^@]*$', 1)"
"""SQL: the instance an arrival came from: its connection's peer (``instance@host:port``)
up to the last ``@``."""

PATH_EVENT = f"""CASE WHEN fragment = 0 THEN CASE event
    WHEN 'fragment_sent' THEN struct(0 AS kind, instance, t, CAST(NULL AS STRING) AS source, hop)
    WHEN 'forwarded' THEN struct(1 AS kind, instance, t, CAST(NULL AS STRING) AS source, hop)
    WHEN 'fragment_received' THEN struct(2 AS kind, instance, t,
                                         {ARRIVAL_SOURCE} AS source, hop)
  END END"""
"""SQL: an event of a message's way between instances, for its ``path`` (the first
fragment's only): its ``kind`` (0 a departure, 1 a forwarder's departure, 2 an arrival),
instance, time, the instance an arrival came from (its connection's peer,
``instance@host:port``) and the hop count."""

LEGS = """filter(transform(
    transform(
      array_distinct(transform(filter(path, e -> e.kind = 2),
                               e -> struct(e.instance AS instance, e.source AS source,
                                           coalesce(e.hop, 0) + 1 AS leg))),
      k -> struct(k.leg AS leg, k.source AS from_instance, k.instance AS to_instance,
                  array_min(transform(filter(path, e -> e.kind = 2 AND e.instance <=> k.instance
                                                   AND e.source <=> k.source
                                                   AND coalesce(e.hop, 0) + 1 = k.leg),
                                      e -> e.t)) AS arrive)),
    l -> struct(l.leg AS leg, l.from_instance AS from_instance, l.to_instance AS to_instance,
                coalesce(
                  array_max(transform(filter(path, d -> d.kind < 2 AND d.instance = l.from_instance
                                                    AND d.t <= l.arrive), d -> d.t)),
                  -- clocks disagree: the first departure
                  array_min(transform(filter(path, d -> d.kind < 2
                                                    AND d.instance = l.from_instance), d -> d.t))
                ) AS left_at,
                l.arrive AS arrive)),
  l -> l.left_at IS NOT NULL)"""
"""SQL: a message's legs from its ``path``, one per first arrival on an instance from
another (by the hop count): that instance's latest departure of the message before the
arrival, and where there is none before it, its first (:func:`latency.by_hop`)."""

DWELLS = """filter(transform(
    array_distinct(transform(filter(path, e -> e.kind = 1), e -> e.instance)),
    i -> struct(i AS instance,
                array_min(transform(filter(path, e -> e.kind = 1 AND e.instance = i), e -> e.hop))
                  AS hop,
                array_min(transform(filter(path, e -> e.kind = 2 AND e.instance = i), e -> e.t))
                  AS arrive,
                array_min(transform(filter(path, e -> e.kind = 1 AND e.instance = i), e -> e.t))
                  AS depart)),
  d -> d.arrive IS NOT NULL)"""
"""SQL: a message's stay on each forwarder that received it, from its ``path``: its first
arrival there and its first forwarding from there (with that forwarding's hop)."""

DWELL_TYPE = "STRUCT<instance: STRING, hop: BIGINT, arrive: BIGINT, depart: BIGINT>"
"""SQL: the type of a :data:`DWELLS` element (a message that no forwarder touched has none)."""

ARRIVAL = f"""CASE WHEN fragment = 0 AND event = 'fragment_received'
  THEN struct(instance, {ARRIVAL_SOURCE} AS source, coalesce(hop, 0) AS hop, t) END"""
"""SQL: a first fragment's arrival on an instance, as the fold's ``min`` and ``max`` order it:
by where it arrived, where from and by which hop (its leg), then by time."""

DEPARTURE = """CASE WHEN fragment = 0 AND event IN ('fragment_sent', 'forwarded')
  THEN struct(instance, t) END"""
"""SQL: a first fragment's departure from an instance (a sender's or a forwarder's)."""

ONE_LEG = """CASE
  WHEN forwards = 0 AND arrival_lo.instance <=> arrival_hi.instance
       AND arrival_lo.source <=> arrival_hi.source AND arrival_lo.hop = arrival_hi.hop
       AND departure_lo.instance = departure_hi.instance
       AND departure_lo.instance = arrival_lo.source AND departure_hi.t <= arrival_lo.t
  THEN array(struct(arrival_lo.hop + 1 AS leg, arrival_lo.source AS from_instance,
                    arrival_lo.instance AS to_instance, departure_hi.t AS left_at,
                    arrival_lo.t AS arrive))
END"""
"""SQL: the legs of a message that went straight from one instance to another, from the
fold's aggregates alone, where :data:`LEGS` would give exactly one leg: no forwarder, every
arrival on the same instance from the same instance by the same hop, every departure from
that instance and none after the first arrival. Null otherwise (forwarders, a departure
after an arrival, traces missing), for :data:`LEGS` to work out. Most messages go straight,
and :data:`LEGS`'s functions, interpreted, were a quarter of the message table's time."""

SENT_FIELDS = "instance, n, database, service, far_service, message_type, size"
"""What the message table keeps of a message's ``message_sent`` event."""

STRAIGHT_FOLD = f""",
    min({ARRIVAL}) AS arrival_lo, max({ARRIVAL}) AS arrival_hi,
    min({DEPARTURE}) AS departure_lo, max({DEPARTURE}) AS departure_hi"""
"""SQL: the fold's aggregates :data:`ONE_LEG` reads."""
STRAIGHT_COLUMNS = ", arrival_lo, arrival_hi, departure_lo, departure_hi"
"""SQL: the same aggregates, carried from the fold to where :data:`ONE_LEG` reads them."""


def _message_table_sql(straight_legs: bool) -> str:
    """The message table's statement; ``straight_legs``: with :data:`ONE_LEG` (four more
    aggregates in the fold, and :data:`LEGS` only for the messages that did not go
    straight)."""
    legs = f"coalesce({ONE_LEG}, {LEGS})" if straight_legs else LEGS
    return f"""
WITH keyed AS (
  SELECT conversation_id, initiator, instance, n, t, reason, seq, event, database, service,
         far_service, message_type, size, route, peer, attempt, hop, queue, wait, address,
         fragment
  FROM {{events}}
  WHERE event IN ({_MESSAGE_EVENT_LIST})
    AND conversation_id IS NOT NULL AND initiator IS NOT NULL AND seq > 0
  UNION ALL
  SELECT *, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
  FROM ({_listed("ack_received", "acked")})
  UNION ALL
  SELECT *, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
  FROM ({_listed("discarded", "discarded")})
),
streams_of_events AS (
  -- one shuffle of the message events, by stream: the fold (by message), the joins and
  -- the window by stream all read them where they are. Without it the fold's partial
  -- aggregates (about one per event: a message's events are on several instances) were
  -- shuffled by message, and its rows again by stream (on five million events the
  -- table took about a quarter more)
  SELECT * FROM keyed DISTRIBUTE BY conversation_id, initiator
),
folded AS (
  SELECT conversation_id, initiator, seq,
    {_first("message_sent", SENT_FIELDS)} AS sent,
    min({_when("enqueued", "t")}) AS enqueued_t,
    {_first("fragment_sent", "n, route, peer")} AS link,
    max({_when("fragment_sent", "attempt")}) AS attempts,
    count({_when("retransmission", "1")}) AS retransmissions,
    count({_when("duplicate", "1")}) AS duplicates,
    count({_when("dropped", "1")}) AS drops,
    {_last("dropped", "instance, n, reason")} AS dropping,
    CAST(size(collect_set({_when("forwarded", "instance")})) AS BIGINT) AS forwards,
    max({_when("forwarded", "hop")}) AS max_hop,
    {_first("acked", "instance, n")} AS acked,
    {_first("discarded", "instance, n, reason")} AS discarding,
    count({_when("delivered", "1")}) AS deliveries,
    {_first("delivered", "instance, n, database, queue")} AS delivery,
    collect_list(CASE WHEN event = 'delivered' AND n IS NOT NULL
                      THEN struct(instance, n) END) AS delivered_pairs,
    count({_when("received", "1")}) AS receptions,
    {_first("received", "instance, n")} AS reception,
    collect_list(CASE WHEN event = 'received' AND n IS NOT NULL
                      THEN struct(instance, n) END) AS received_pairs,
    max(CASE WHEN event IN ({_MESSAGE_EVENT_LIST}) THEN {LATEST_EVENT} END) AS latest,
    collect_list({PATH_EVENT}) AS path{STRAIGHT_FOLD if straight_legs else ""}
  FROM streams_of_events
  GROUP BY conversation_id, initiator, seq
),
rows AS (
  SELECT conversation_id, initiator, seq,
    sent.instance AS sender, sent.database AS database, sent.service AS service,
    sent.far_service AS far_service, sent.message_type AS message_type, sent.size AS size,
    {_eid("sent.instance", "sent.n")} AS sent_id,
    sent.t AS sent_t, enqueued_t, link.t AS first_fragment_t,
    link.route AS fragment_route, link.peer AS fragment_peer,
    attempts, retransmissions, duplicates, drops, dropping.reason AS drop_reason,
    forwards, max_hop,
    acked.t AS acked_t, {_eid("acked.instance", "acked.n")} AS acked_id,
    discarding.t AS discarded_t, discarding.reason AS discard_reason,
    delivery.t AS delivered_t, deliveries,
    delivery.instance AS receiver, delivery.database AS target_database,
    delivery.queue AS queue, delivery.n AS delivered_n,
    {_eid("delivery.instance", "delivery.n")} AS delivered_id,
    delivered_pairs,
    reception.t AS received_t, receptions,
    reception.instance AS reader, reception.n AS received_n,
    {_eid("reception.instance", "reception.n")} AS received_id,
    received_pairs, latest, path{STRAIGHT_COLUMNS if straight_legs else ""}
  FROM folded
),
routes AS (
  SELECT conversation_id, initiator, instance AS sender,
         coalesce(route, decision) AS conversation_route,
         coalesce(address, target_database) AS conversation_address
  FROM (
    -- one instance's events: its numbers order those of one microsecond
    SELECT *, row_number() OVER (
      PARTITION BY conversation_id, initiator, instance ORDER BY t DESC, n DESC NULLS LAST)
      AS latest
    FROM {{events}} WHERE event = 'route_chosen'
  )
  WHERE latest = 1
),
receivers AS (
  SELECT DISTINCT conversation_id, initiator, true AS receiver_traced
  FROM {{events}} WHERE event IN ('delivered', 'ack_sent')
),
inherited AS (
  SELECT conversation_id, NOT initiator AS initiator,
         max(received_through) AS inherited_received
  FROM {{events}}
  WHERE event = 'inherited' AND conversation_id IS NOT NULL AND initiator IS NOT NULL
  GROUP BY conversation_id, NOT initiator
),
joined AS (
  SELECT *,
    delivered_t IS NOT NULL OR received_t IS NOT NULL
      OR seq <= coalesce(inherited_received, 0) AS is_delivered
  FROM rows
  LEFT JOIN routes USING (conversation_id, initiator, sender)
  LEFT JOIN receivers USING (conversation_id, initiator)
  LEFT JOIN inherited USING (conversation_id, initiator)
),
streams AS (
  SELECT *, min(CASE WHEN NOT is_delivered AND discarded_t IS NULL
                      AND (sent_t IS NOT NULL OR acked_t IS NOT NULL) THEN seq END)
            OVER (PARTITION BY conversation_id, initiator) AS lowest_open
  FROM joined
)
SELECT {", ".join(MESSAGE_COLUMNS)},
  coalesce(fragment_route, conversation_route) AS route,
  coalesce(fragment_peer, conversation_address) AS address,
  status,
  CASE WHEN status = 'waiting' THEN latest END AS latest,
  legs, dwells
FROM (
  -- what is worked out of the fold's lists (the event ids, the legs and stays) comes after
  -- the stream's window: with it, the code Spark generates for the rows before the
  -- window's sort was one method too large for the JVM to compile (over 8,000 bytes), and
  -- ran interpreted on every message
  SELECT *,
    {_ids("delivered_pairs")} AS delivered_ids,
    {_ids("received_pairs")} AS received_ids,
    {legs} AS legs,
    CASE WHEN forwards = 0 THEN CAST(array() AS ARRAY<{DWELL_TYPE}>) ELSE {DWELLS} END AS dwells,
    CASE
      WHEN is_delivered THEN 'delivered'
      WHEN discarded_t IS NOT NULL THEN 'discarded'
      WHEN acked_t IS NOT NULL AND receiver_traced IS NULL THEN 'acknowledged'
      WHEN acked_t IS NOT NULL AND seq = lowest_open THEN 'lost'
      WHEN acked_t IS NOT NULL THEN 'held'
      WHEN sent_t IS NOT NULL THEN 'waiting'
      ELSE 'unknown'
    END AS status
  FROM streams
)
"""


MESSAGE_TABLE_SQL = _message_table_sql(straight_legs=False)
"""The message table's statement where expressions are interpreted (a small set's
settings, :mod:`brokerd.analytics.session`): there the four aggregates that
:data:`ONE_LEG` reads cost every event more than :data:`LEGS` costs the messages."""
STRAIGHT_MESSAGE_TABLE_SQL = _message_table_sql(straight_legs=True)
"""The message table's statement where expressions are compiled (a large set's settings)."""


def message_table(events: DataFrame, *, straight_legs: bool | None = None) -> DataFrame:
    """Every message of the trace set, one row each (see the module docstring).

    One SQL statement: Spark analyses it once, where the same plan built a column and a
    step at a time is analysed again at each step, over a round trip to the JVM for each
    (about a second of the driver's time on any set, most of a small set's).
    ``straight_legs``: work out the legs of messages that went straight from the fold's
    aggregates (:data:`ONE_LEG`); by default, where the session compiles expressions.
    The table is the same either way."""
    spark = events.sparkSession
    if straight_legs is None:
        straight_legs = compiles_expressions(spark)
    sql = STRAIGHT_MESSAGE_TABLE_SQL if straight_legs else MESSAGE_TABLE_SQL
    return spark.sql(sql, events=events)
