"""The exactly-once-in-order audit (R-TRACE-2; R-DLG-1, R-DLG-4, R-DLG-5): every finding,
one per line.

For every stream (one direction of one conversation, named by ``conversation_id``
and the sender's ``initiator`` role) the messages must reach the receiving side's
queue, and its application, exactly once and in sequence order, and every sent
message must be delivered, discarded (by its own side: END CONVERSATION WITH ERROR
or CLEANUP, a broker error; or by a receiver that had ended, R-DLG-10) or still
waiting in a transmission queue. A ``received`` event is evidence of delivery too
(the application cannot receive what was not in its queue). Violations:

* ``duplicate``: a message delivered more than once, or received more than once by
  the application;
* ``out_of_order``: a message delivered after a later one of its stream, or
  received by the application after a later one (R-DLG-1) other than the other side's
  Error, which is received before the dialog's waiting messages (R-DLG-10: the message
  type of its SEND says which it is);
* ``gap``: sequence numbers never delivered (nor discarded) although a later one
  was; one finding per missing range, named by its first seq;
* ``lost``: acknowledged to its sender but never delivered, with nothing later of
  its stream delivered, while no earlier message of its stream is missing (an
  acknowledgement range lets the receiver acknowledge a message it holds until an
  earlier one arrives: that is ``held``, not lost);
* ``unsent``: delivered, but its sender's traces (present for the stream from a
  lower seq on) never sent it.

**Crash windows.** A daemon killed loses the trace events it had not written; the
database changes they describe survive. Each start writes ``started`` naming the last
event it found on disk (docs/traces.md); unless that was a graceful stop's, the time
between the two is a crash window of that instance. So is the time between the last
event written before a trace's write errors (a full trace disk) and the ``trace_resumed``
marker written once it could write again: the daemon kept delivering, its events were
dropped. A ``gap``, ``lost`` or ``unsent``
whose missing event belongs to an instance with a crash window, and could have
happened inside it (the window overlaps the time between the events around the
missing one), is reported as ``unknown`` ("trace missing"), not as a violation: the
traces cannot say. The missing event is a delivery (on the receiving side: every
instance that delivered, received or acknowledged the stream's messages), a SEND (on its
sender) or, for a ``gap`` before an Error, its sender's discard (END CONVERSATION WITH
ERROR drops what is pending and sends the Error after it, R-DLG-10). Duplicates and
disorder are never hidden by a lost event. With
``trace.durable`` a daemon's application learns of a commit only once its events
are on disk, so an outcome an application saw is never in a window.

**What a promoted mirror inherited** (R-TRACE-5). A promotion writes an ``inherited``
event per endpoint of the mirrored database, as the promoted partner's file holds it
(:func:`inheritance`): a stream's messages up to the receiving endpoint's
``received_through`` count as delivered there, those up to the sending endpoint's
``sent_through`` as sent. The old principal committed and shipped them; its own events
of them may have died with it (SIGKILLed before its trace flush), and if it never
starts again no crash window covers them. A delivery there after that event of a
message its file held is a ``duplicate``.

Every finding names the conversation, direction, seq (and the last seq of a range),
sender and receiver instances, and its evidence: the ids (``instance#n``) of the
events that show it, and for ``unknown`` the window's last durable event and restart
marker.

What the set cannot show is not reported:

* a trace set may begin in the middle of a conversation (segments deleted,
  tracing switched on late): sequence numbers below the lowest one the set saw
  sent, delivered or discarded are not gaps, and delivered messages below the
  lowest one sent are not ``unsent``;
* when the receiver's traces are not in the set (no ``delivered`` or
  ``ack_sent`` for the stream), acknowledged messages are not ``lost``.

Unsequenced broker errors (seq 0) are not audited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from brokerd.analytics.messages import STREAM, distinct_count, inheritance
from brokerd.analytics.schema import TIMESTAMP_FORMAT
from brokerd.analytics.session import keep

KINDS = ("duplicate", "gap", "out_of_order", "lost", "unsent")
"""The violations."""
UNKNOWN = "unknown"
"""A finding a crash window hides: what it would be is in ``missing``."""
WITNESSED = "witnessed"
"""An unknown finding a database file settles: it shows the SEND committed, or the
message delivered (counted, not listed)."""
WITNESS_SCHEMA = (
    "conversation_id string, is_initiator boolean, send_sequence long, receive_sequence long"
)
"""The endpoints of database files (:mod:`brokerd.storage.witness`), as the audit reads
them: each one's last sequence number sent, and the last received in order."""
AUDITED = (
    "conversation_id",
    "initiator",
    "seq",
    "status",
    "message_type",
    "sender",
    "sent_id",
    "sent_t",
    "acked_id",
    "acked_t",
    "receiver",
    "deliveries",
    "delivered_t",
    "delivered_n",
    "delivered_id",
    "delivered_ids",
    "reader",
    "receptions",
    "received_t",
    "received_n",
    "received_id",
    "received_ids",
)
"""The columns of the message table the audit reads."""
ERROR_TYPE = "http://schemas.microsoft.com/SQL/ServiceBroker/Error"
"""The message type of an Error (``protocol.dialog.ERROR``): the other side's END
CONVERSATION WITH ERROR, received before the dialog's waiting messages (R-DLG-10)."""
MAX_LISTED = 10_000
"""Findings listed in full (all are counted)."""
FINDING = [
    "kind",
    "conversation_id",
    "initiator",
    "seq",
    "last_seq",
    "sender",
    "receiver",
    "detail",
    "evidence",
    "witness",
]
"""A finding's columns before crash windows are looked at: ``witness`` lists the instances
that could have written a missing event that would account for it (every instance that
delivered, received or acknowledged the stream's messages, for a delivery; every one that
sent them, for a SEND or a discard: a mirrored pair's partners take turns), each with
``lo`` .. ``hi`` (microseconds, null: unbounded), when that event could have happened."""
Witness = tuple[str, str, str]
"""SQL: the instances that could have written a missing event (an array), and the bounds
of its time (``lo``, ``hi``)."""


@dataclass
class Audit:
    streams: int
    messages: int
    delivered: int
    waiting: int
    discarded: int
    counts: dict[str, int]
    """Findings by kind: every violation kind, ``unknown`` and ``witnessed``."""
    violations: list[dict[str, Any]]
    """The first :data:`MAX_LISTED` violations, ordered by conversation and seq."""
    unknowns: list[dict[str, Any]]
    """The first :data:`MAX_LISTED` findings crash windows hide."""

    @property
    def passed(self) -> bool:
        return not self.total

    @property
    def total(self) -> int:
        """Violations (``unknown`` findings are not)."""
        return sum(self.counts[kind] for kind in KINDS)

    @property
    def unknown(self) -> int:
        return self.counts[UNKNOWN]

    def view(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "streams": self.streams,
            "messages": self.messages,
            "delivered": self.delivered,
            "waiting": self.waiting,
            "discarded": self.discarded,
            "violations": self.total,
            "unknown": self.unknown,
            "witnessed": self.counts[WITNESSED],
            "by_kind": self.counts,
            "listed": self.violations,
            "unknown_listed": self.unknowns,
        }


def _ids(*columns: str) -> str:
    """SQL: the evidence, the non-null ids among ``columns``."""
    return f"filter(array({', '.join(columns)}), x -> x IS NOT NULL)"


def _finding(
    kind: str,
    detail: str,
    evidence: str,
    *,
    where: str,
    source: str = "{m}",
    seq: str = "seq",
    last_seq: str | None = None,
    witness: tuple[Witness, ...] = (),
) -> str:
    """SQL: one kind of finding, the rows of ``source`` where ``where`` holds, as the
    columns of :data:`FINDING`."""
    each = [
        f"transform({instances}, i -> named_struct("
        f"'instance', i, 'lo', CAST({lo} AS BIGINT), 'hi', CAST({hi} AS BIGINT)))"
        for instances, lo, hi in witness
    ]
    witnesses = f"flatten(array({', '.join(each)}))" if each else f"CAST(array() AS {_WITNESS})"
    return (
        f"SELECT '{kind}' AS kind, conversation_id, initiator, {seq} AS seq, "
        f"{last_seq or seq} AS last_seq, sender, receiver, {detail} AS detail, "
        f"{evidence} AS evidence, {witnesses} AS witness\n"
        f"FROM {source}\nWHERE {where}"
    )


_STREAM = "conversation_id, initiator"
_WITNESS = "array<struct<instance: string, lo: bigint, hi: bigint>>"
_EARLIER = "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING"

PREPARED_SQL = f"""
WITH m AS (
  SELECT *,
    seq <= coalesce(inherited_received, 0) AS in_file,
    deliveries > 0 OR receptions > 0 OR seq <= coalesce(inherited_received, 0) AS arrived,
    -- where it arrived: its delivery's instance, its reception's, or the promoted mirror
    -- whose file held it
    coalesce(receiver, reader,
             CASE WHEN seq <= coalesce(inherited_received, 0) THEN inherited_instance END)
      AS arrived_at,
    status = 'discarded' AS discarded,
    sent_t IS NOT NULL AS sent
  FROM (SELECT {", ".join(AUDITED)} FROM {{messages}})
  LEFT JOIN {{inherited}} USING ({_STREAM})
  LEFT JOIN {{acknowledgers}} USING ({_STREAM})
),
bounded AS (
  -- the stream's bounds and names over the whole stream, in the window that gives each
  -- message the SENDs before it: one sort of the stream's rows, where an aggregate
  -- joined back sorted them for the join and again for the window. A coalesced sender or
  -- receiver adds nothing to the stream's sets: it is one of them.
  SELECT *,
    -- a message that arrived nowhere (or whose SEND is not in the set) names the
    -- stream's receiver (sender) at its place: where the nearest arrival (SEND) before
    -- it was, a promoted mirror after a failover; else the stream's first
    last(arrived_at, true) OVER (PARTITION BY {_STREAM} ORDER BY seq {_EARLIER})
      AS _receiver_before,
    first(receiver, true) OVER whole AS _first_receiver,
    first(reader, true) OVER whole AS _first_reader,
    last(sender, true) OVER (PARTITION BY {_STREAM} ORDER BY seq {_EARLIER}) AS _sender_before,
    first(sender, true) OVER whole AS _first_sender,
    collect_set(sender) OVER whole AS senders,
    -- its receiving endpoints: those that delivered or received its messages, and those
    -- that acknowledged them (a receiver whose deliveries died in a crash window may show
    -- the stream by nothing else: a resent copy taken as a duplicate, acknowledged again)
    array_union(array_union(collect_set(receiver) OVER whole, collect_set(reader) OVER whole),
                coalesce(acknowledgers, CAST(array() AS array<string>))) AS receivers,
    -- the lowest seq the set saw sent, delivered or discarded: lower ones are before
    -- the traces began (a late duplicate or RECEIVE does not count)
    min(CASE WHEN sent OR arrived OR discarded THEN seq END) OVER whole AS lowest,
    min(CASE WHEN sent THEN seq END) OVER whole AS lowest_sent,
    -- no message of the stream was delivered before its first SEND
    min(sent_t) OVER whole AS first_sent_t,
    max(CASE WHEN arrived THEN seq END) OVER whole AS highest,
    min(CASE WHEN NOT arrived AND NOT discarded AND (sent OR acked_t IS NOT NULL)
             THEN seq END) OVER whole AS lowest_open,
    max(sent_t) OVER (PARTITION BY {_STREAM} ORDER BY seq {_EARLIER}) AS sent_before
  FROM m
  WINDOW whole AS (PARTITION BY {_STREAM} ORDER BY seq
                   ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
)
SELECT {_STREAM}, seq, status, message_type,
  coalesce(sender, _sender_before, _first_sender) AS sender, sent_id, sent_t, acked_id, acked_t,
  coalesce(arrived_at, _receiver_before, _first_receiver, _first_reader,
           array_min(acknowledgers)) AS receiver,
  deliveries, delivered_t, delivered_n, delivered_id, delivered_ids,
  reader, receptions, received_t, received_n, received_id, received_ids,
  inherited_received, inherited_id, inherited_instance, inherited_t, inherited_n,
  inherited_sent,
  senders, receivers, lowest, lowest_sent, first_sent_t, highest, lowest_open,
  arrived,
  coalesce(delivered_t, received_t) AS arrived_t,
  coalesce(delivered_id, received_id, CASE WHEN in_file THEN inherited_id END) AS arrived_id,
  sent_before
FROM bounded
"""
"""The message table with each stream's sender and receiver, arrival (delivered, or
received when the delivery's event is missing, or held in order by the file a promoted
mirror inherited) and the stream's bounds; ``{messages}``, ``{inherited}``,
``{acknowledgers}`` (:data:`ACKNOWLEDGERS_SQL`)."""

ACKNOWLEDGERS_SQL = """
SELECT conversation_id, initiator, collect_set(instance) AS acknowledgers
FROM {events}
WHERE event IN ('ack_sent', 'duplicate')
  AND conversation_id IS NOT NULL AND initiator IS NOT NULL
GROUP BY conversation_id, initiator
"""
"""The instances that acknowledged each stream's messages (``ack_sent``, ``duplicate``:
their ``initiator`` is the sender's role): receivers of the stream, whether or not their
deliveries are in the set."""


def _disorder(event: str, verb: str, ahead: str = "false") -> str:
    """SQL: messages ``verb`` after a later one of their stream, in the order of their first
    ``event`` (``delivered`` or ``received``: time, then event number); a later message
    where ``ahead`` holds may go before them."""
    t, n, eid = f"{event}_t", f"{event}_n", f"{event}_id"
    ordered = f"""(
  SELECT *, max(CASE WHEN NOT coalesce({ahead}, false)
                     THEN named_struct('seq', seq, 'id', {eid}) END) OVER (
    PARTITION BY {_STREAM} ORDER BY {t}, {n}, seq {_EARLIER}) AS before
  FROM {{m}} WHERE {t} IS NOT NULL
)"""
    return _finding(
        "out_of_order",
        f"format_string('{verb} after seq %d', before.seq)",
        _ids(eid, "before.id"),
        source=ordered,
        where="before.seq > seq",
    )


# Seqs from the stream's lowest to its highest delivered one that were neither delivered
# nor discarded (END CONVERSATION WITH ERROR drops what is pending and sends the error
# after it): one row per missing range, found between neighbours. Its delivery events
# would lie between its neighbours' on the receiver; with no arrival before it (the
# stream's lowest seqs), between the stream's first SEND and the arrival after it. Seqs
# a promoted mirror's file held in order arrived, with or without a row here.
_ACCOUNTED_WITH_NEIGHBOURS = f"""(
  SELECT *, CASE WHEN seq - previous - 1 = 1
                 THEN format_string('never delivered, though seq %d was', seq)
                 ELSE format_string('never delivered, nor the %d after it', seq - previous - 2)
            END AS detail
  FROM (
    SELECT *, greatest(coalesce(before.seq, lowest - 1),
                       least(coalesce(inherited_received, 0), seq - 1)) AS previous
    FROM (
      SELECT *, lag(named_struct('seq', seq, 'arrived_t', arrived_t, 'arrived_id', arrived_id))
                OVER (PARTITION BY {_STREAM} ORDER BY seq) AS before
      FROM {{m}}
      WHERE (arrived OR status = 'discarded') AND seq >= lowest AND seq <= highest
    )
  )
)"""

FINDINGS_SQL = "\nUNION ALL\n".join(
    (
        _finding(
            "duplicate",
            "format_string('delivered %d times', deliveries)",
            "delivered_ids",
            where="deliveries > 1",
        ),
        _finding(
            "duplicate",
            "format_string('received %d times by the application', receptions)",
            "received_ids",
            where="receptions > 1",
        ),
        # held by the file a promoted mirror inherited, then delivered again there (of one
        # microsecond on that instance, after its ``inherited`` event by their numbers)
        _finding(
            "duplicate",
            "'delivered again after a promoted mirror''s file held it'",
            _ids("inherited_id", "delivered_id"),
            where="deliveries = 1 AND seq <= inherited_received AND (delivered_t > inherited_t"
            " OR (delivered_t = inherited_t AND receiver = inherited_instance"
            " AND delivered_n > inherited_n))",
        ),
        _disorder("delivered", "delivered"),
        # R-DLG-10: the other side's Error is received before the dialog's waiting
        # messages (it ends the stream: nothing is sent after it)
        _disorder("received", "received by the application", f"message_type = '{ERROR_TYPE}'"),
        _finding(
            "gap",
            "detail",
            _ids("before.arrived_id", "arrived_id"),
            source=_ACCOUNTED_WITH_NEIGHBOURS,
            where="seq - previous - 1 > 0",
            seq="previous + 1",
            last_seq="seq - 1",
            witness=(
                # their deliveries, between the arrivals around them (a range at the
                # stream's start has no arrival before it: its SENDs bound it)
                ("receivers", "coalesce(before.arrived_t, first_sent_t)", "arrived_t"),
                # or their sender's discard (END CONVERSATION WITH ERROR, R-DLG-10), after
                # their SENDs and before the Error that followed them arrived: when the
                # message after them is that Error, or its SEND is missing too
                (
                    f"CASE WHEN coalesce(message_type, '{ERROR_TYPE}') = '{ERROR_TYPE}'"
                    " THEN senders ELSE CAST(array() AS array<string>) END",
                    "sent_before",
                    "arrived_t",
                ),
            ),
        ),
        _finding(
            "lost",
            "'acknowledged to the sender but never delivered'",
            _ids("acked_id", "sent_id"),
            where="status IN ('lost', 'held') AND NOT arrived AND seq = lowest_open"
            " AND (highest IS NULL OR seq > highest)",
            witness=(("receivers", "sent_t", "acked_t"),),
        ),
        _finding(
            "unsent",
            "'delivered but never sent by its sender'",
            _ids("arrived_id"),
            where="arrived AND sent_t IS NULL AND seq >= lowest_sent"
            " AND seq > coalesce(inherited_sent, 0)",
            witness=(("senders", "sent_before", "arrived_t"),),
        ),
    )
)
"""Every finding in ``{m}``, the prepared message table (:data:`PREPARED_SQL`), before
crash windows are looked at (columns :data:`FINDING`)."""

_LAST = "concat_ws('#', instance, CAST(last_n AS STRING))"
_MARKER = "concat_ws('#', instance, CAST(n AS STRING))"
CRASH_WINDOWS_SQL = f"""
SELECT instance AS window_instance,
  unix_micros(try_to_timestamp(last_ts, :ts_format)) AS window_from,
  t AS window_to,
  {_LAST} AS last_durable,
  {_MARKER} AS marker,
  CASE WHEN event = 'started'
    THEN format_string('%s crashed: its events after %s were lost, it restarted at %s',
                       instance, {_LAST}, {_MARKER})
    ELSE format_string(
      '%s could not write its trace: its events after %s were dropped, until %s',
      instance, {_LAST}, {_MARKER})
  END AS cause
FROM {{events}}
WHERE event IN ('started', 'trace_resumed') AND last_ts IS NOT NULL
  AND NOT coalesce(clean, false)
"""
"""Each crash window: ``window_instance``, ``window_from`` .. ``window_to`` (microseconds:
the last event on disk, the restart), ``last_durable`` and ``marker`` (their ids). A start
after a graceful stop (``clean``) or with nothing on disk before it opens none. A
``trace_resumed`` marker (events dropped on write errors) closes a window the same way;
``cause`` says how the events were lost."""


def judgement_sql(witnessed: bool) -> str:
    """SQL: the findings (``{m}``, the prepared table) with those a crash window
    (``{events}``) of their witness could hide turned ``unknown`` ("trace missing";
    ``missing`` keeps the kind), the window's ids added to the evidence, and
    ``direction``; with ``witnessed``, the unknown findings the database files
    (``{witness}``, :data:`WITNESS_SCHEMA`) settle made ``witnessed``: a missing SEND
    whose sender's endpoint sent through its seq, a missing delivery whose receiver's
    endpoint received through it (every message up to it is in the queue or was
    received: R-DLG-1)."""
    judged = f"""
WITH found AS ({FINDINGS_SQL}),
windows AS ({CRASH_WINDOWS_SQL}),
matched AS (
  SELECT *, row_number() OVER (PARTITION BY fid ORDER BY window_to ASC NULLS LAST) AS k
  FROM (
    SELECT * FROM (SELECT *, monotonically_increasing_id() AS fid FROM found)
    LATERAL VIEW OUTER explode(witness) AS x
  ) f
  LEFT JOIN windows w
    ON x.instance = w.window_instance
    AND (x.lo IS NULL OR x.lo <= w.window_to) AND (x.hi IS NULL OR x.hi >= w.window_from)
),
judged AS (
  SELECT
    CASE WHEN marker IS NOT NULL THEN '{UNKNOWN}' ELSE kind END AS kind,
    CASE WHEN marker IS NOT NULL THEN kind END AS missing,
    {_STREAM}, seq, last_seq, sender, receiver,
    CASE WHEN marker IS NOT NULL THEN format_string('trace missing: %s (%s)', detail, cause)
         ELSE detail END AS detail,
    CASE WHEN marker IS NOT NULL THEN concat(evidence, array(last_durable, marker))
         ELSE evidence END AS evidence,
    CASE WHEN initiator THEN 'initiator->target' ELSE 'target->initiator' END AS direction
  FROM matched WHERE k = 1
)"""
    if not witnessed:
        return judged + " SELECT * FROM judged"
    return (
        judged
        + f""",
sent AS (
  SELECT conversation_id, is_initiator AS initiator, max(send_sequence) AS sent_through
  FROM {{witness}} GROUP BY conversation_id, is_initiator
),
received AS (
  SELECT conversation_id, NOT is_initiator AS initiator,
         max(receive_sequence) AS received_through
  FROM {{witness}} GROUP BY conversation_id, NOT is_initiator
)
SELECT
  CASE WHEN kind = '{UNKNOWN}' AND (
         (missing = 'unsent' AND sent_through >= seq)
         OR (missing IN ('gap', 'lost') AND received_through >= last_seq))
       THEN '{WITNESSED}' ELSE kind END AS kind,
  missing, {_STREAM}, seq, last_seq, sender, receiver, detail, evidence, direction
FROM judged
LEFT JOIN sent USING ({_STREAM})
LEFT JOIN received USING ({_STREAM})
"""
    )


def _listed(
    found: DataFrame, counts: dict[str, int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The first :data:`MAX_LISTED` violations and unknown findings, by conversation and
    seq: in one job when both fit (the usual case), else one job each."""
    order = ["conversation_id", "initiator", "seq", "kind"]
    violation = ~F.col("kind").isin(UNKNOWN, WITNESSED)
    unknown = F.col("kind") == UNKNOWN
    if sum(counts[k] for k in KINDS) <= MAX_LISTED and counts[UNKNOWN] <= MAX_LISTED:
        rows = [r.asDict() for r in found.where(violation | unknown).orderBy(*order).collect()]
        return [r for r in rows if r["kind"] != UNKNOWN], [r for r in rows if r["kind"] == UNKNOWN]

    def listed(which: Column) -> list[dict[str, Any]]:
        ordered = found.where(which).orderBy(*order)
        return [r.asDict() for r in ordered.limit(MAX_LISTED).collect()]

    return listed(violation), listed(unknown)


def audit(messages: DataFrame, events: DataFrame, witness: DataFrame | None = None) -> Audit:
    """Run the audit over the message table of ``events`` (crash windows from ``events``);
    ``witness`` (:data:`WITNESS_SCHEMA`), the endpoints of the daemons' database files,
    settles what it can of what the windows hide."""
    spark = messages.sparkSession
    # every kind of finding reads the prepared table: its windows run once
    prepared = keep(
        spark.sql(
            PREPARED_SQL,
            messages=messages,
            inherited=inheritance(events),
            acknowledgers=spark.sql(ACKNOWLEDGERS_SQL, events=events),
        )
    )
    tables = {"m": prepared.df, "events": events}
    if witness is not None:
        tables["witness"] = witness
    judgement = spark.sql(
        judgement_sql(witness is not None), {"ts_format": TIMESTAMP_FORMAT}, **tables
    )
    found = keep(judgement)
    try:
        counts = {k: 0 for k in (*KINDS, UNKNOWN, WITNESSED)}
        for row in found.df.groupBy("kind").count().collect():
            counts[row["kind"]] = int(row["count"])
        violations, unknowns = _listed(found.df, counts)
    finally:
        found.release()
        prepared.release()
    totals = messages.agg(
        distinct_count(
            F.when(
                F.col("conversation_id").isNotNull() & F.col("initiator").isNotNull(),
                F.struct(*STREAM),
            )
        ).alias("streams"),
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
        violations=violations,
        unknowns=unknowns,
    )


def violation_line(v: dict[str, Any]) -> str:
    """One finding as one line: ``GAP conversation C (initiator->target) seq 7: ...``."""
    seqs = f"seq {v['seq']}"
    if v.get("last_seq") is not None and v["last_seq"] != v["seq"]:
        seqs = f"seqs {v['seq']}..{v['last_seq']}"
    evidence = ", ".join(v.get("evidence") or []) or "none"
    return (
        f"{v['kind'].upper()} conversation {v['conversation_id']} ({v['direction']}) "
        f"{seqs}: {v['detail']} (sender {v['sender'] or '?'}, "
        f"receiver {v['receiver'] or '?'}; evidence {evidence})"
    )
