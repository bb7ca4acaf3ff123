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
  received by the application after a later one (R-DLG-1);
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
traces cannot say. Duplicates and disorder are never hidden by a lost event. With
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

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from brokerd.analytics.messages import STREAM, distinct_count, inheritance, is_event
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
_INHERITED_COLUMNS = (
    ("inherited_received", "long"),
    ("inherited_id", "string"),
    ("inherited_t", "long"),
    ("inherited_sent", "long"),
)
"""The columns :func:`inheritance` adds to a stream's messages."""
AUDITED = (
    "conversation_id",
    "initiator",
    "seq",
    "status",
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
    "lo",
    "hi",
]
"""A finding's columns before crash windows are looked at: ``witness`` lists the instances
that could have written the missing event (every instance that delivered or received the
stream's messages, or sent them: a mirrored pair's partners take turns), ``lo`` .. ``hi``
(microseconds, null: unbounded) when it could have happened."""


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


def _direction(initiator: Column) -> Column:
    return F.when(initiator, "initiator->target").otherwise("target->initiator")


def _ids(*columns: Column | str) -> Column:
    """The evidence: the non-null ids among ``columns``."""
    return F.filter(F.array(*columns), lambda c: c.isNotNull())


def _finding(
    kind: str,
    detail: Column,
    evidence: Column,
    seq: Column | None = None,
    last_seq: Column | None = None,
    witness: Column | None = None,
    lo: Column | None = None,
    hi: Column | None = None,
) -> list[Column]:
    seq = F.col("seq") if seq is None else seq
    none = F.lit(None)
    return [
        F.lit(kind).alias("kind"),
        *map(F.col, STREAM),
        seq.alias("seq"),
        (seq if last_seq is None else last_seq).alias("last_seq"),
        F.col("sender"),
        F.col("receiver"),
        detail.alias("detail"),
        evidence.alias("evidence"),
        (F.array().cast("array<string>") if witness is None else witness).alias("witness"),
        (none.cast("long") if lo is None else lo).alias("lo"),
        (none.cast("long") if hi is None else hi).alias("hi"),
    ]


def crash_windows(events: DataFrame) -> DataFrame:
    """Each crash window: ``window_instance``, ``window_from`` .. ``window_to``
    (microseconds: the last event on disk, the restart), ``last_durable`` and ``marker``
    (their ids). A start after a graceful stop (``clean``) or with nothing on disk before
    it opens none. A ``trace_resumed`` marker (events dropped on write errors) closes a
    window the same way; ``cause`` says how the events were lost."""
    last = F.concat_ws("#", "instance", F.col("last_n").cast("string"))
    marker = F.concat_ws("#", "instance", F.col("n").cast("string"))
    return events.where(
        (is_event("started") | is_event("trace_resumed"))
        & F.col("last_ts").isNotNull()
        & ~F.coalesce(F.col("clean"), F.lit(False))
    ).select(
        F.col("instance").alias("window_instance"),
        F.unix_micros(F.try_to_timestamp(F.col("last_ts"), F.lit(TIMESTAMP_FORMAT))).alias(
            "window_from"
        ),
        F.col("t").alias("window_to"),
        last.alias("last_durable"),
        marker.alias("marker"),
        F.when(
            is_event("started"),
            F.format_string(
                "%s crashed: its events after %s were lost, it restarted at %s",
                "instance",
                last,
                marker,
            ),
        )
        .otherwise(
            F.format_string(
                "%s could not write its trace: its events after %s were dropped, until %s",
                "instance",
                last,
                marker,
            )
        )
        .alias("cause"),
    )


def _prepared(messages: DataFrame, inherited: DataFrame | None = None) -> DataFrame:
    """The message table with each stream's sender and receiver, arrival (delivered, or
    received when the delivery's event is missing, or held in order by the file a
    promoted mirror inherited: :func:`inheritance`) and the stream's bounds."""
    in_seq = Window.partitionBy(*STREAM).orderBy("seq")
    messages = messages.select(*AUDITED)  # narrow rows: the sort and the cache copy less
    if inherited is None:
        messages = messages.select(
            "*",
            *(F.lit(None).cast(t).alias(c) for c, t in _INHERITED_COLUMNS),
        )
    else:
        messages = messages.join(inherited, STREAM, "left")
    sent = F.col("sent_t").isNotNull()
    in_file = F.col("seq") <= F.coalesce(F.col("inherited_received"), F.lit(0))
    arrived = (F.col("deliveries") > 0) | (F.col("receptions") > 0) | in_file
    discarded = F.col("status") == "discarded"
    open_message = ~arrived & ~discarded & (sent | F.col("acked_t").isNotNull())

    seq = F.col("seq")
    # The stream's bounds and names in one aggregate, joined back: one pass, where a
    # window per column made one pass each (and buffered every stream's rows for each).
    # A coalesced sender or receiver adds nothing to the stream's sets: it is one of them.
    bounds = messages.groupBy(*STREAM).agg(
        F.first("receiver", ignorenulls=True).alias("_first_receiver"),
        F.first("reader", ignorenulls=True).alias("_first_reader"),
        F.first("sender", ignorenulls=True).alias("_first_sender"),
        F.collect_set("sender").alias("senders"),
        F.array_union(F.collect_set("receiver"), F.collect_set("reader")).alias("receivers"),
        # the lowest seq the set saw sent, delivered or discarded: lower ones are
        # before the traces began (a late duplicate or RECEIVE does not count)
        F.min(F.when(sent | arrived | discarded, seq)).alias("lowest"),
        F.min(F.when(sent, seq)).alias("lowest_sent"),
        F.max(F.when(arrived, seq)).alias("highest"),
        F.min(F.when(open_message, seq)).alias("lowest_open"),
    )
    return (
        messages.join(bounds, STREAM, "left")
        .withColumn(  # a lost message names its stream's receiver
            "receiver",
            F.coalesce("receiver", "reader", "_first_receiver", "_first_reader"),
        )
        .withColumn("sender", F.coalesce("sender", "_first_sender"))
        .drop("_first_receiver", "_first_reader", "_first_sender")
        .withColumn("arrived", arrived)
        .withColumn("arrived_t", F.coalesce("delivered_t", "received_t"))
        .withColumn(
            "arrived_id",
            F.coalesce("delivered_id", "received_id", F.when(in_file, F.col("inherited_id"))),
        )
        .withColumn(
            "sent_before",
            F.max("sent_t").over(in_seq.rowsBetween(Window.unboundedPreceding, -1)),
        )
    )


def _disorder(m: DataFrame, event: str, verb: str) -> DataFrame:
    """Messages ``verb`` after a later one of their stream, in the order of their first
    ``event`` (``delivered`` or ``received``: time, then event number)."""
    t, n, eid = f"{event}_t", f"{event}_n", f"{event}_id"
    before = Window.partitionBy(*STREAM).orderBy(t, n, "seq")
    return (
        m.where(F.col(t).isNotNull())
        .withColumn(
            "before",
            F.max(F.struct(F.col("seq"), F.col(eid).alias("id"))).over(
                before.rowsBetween(Window.unboundedPreceding, -1)
            ),
        )
        .where(F.col("before.seq") > F.col("seq"))
        .select(
            *_finding(
                "out_of_order",
                F.format_string(f"{verb} after seq %d", "before.seq"),
                _ids(eid, "before.id"),
            )
        )
    )


def _gaps(m: DataFrame) -> DataFrame:
    """Seqs from the stream's lowest to its highest delivered one that were neither
    delivered nor discarded (END CONVERSATION WITH ERROR drops what is pending and sends
    the error after it): one row per missing range, found between neighbours. Its
    delivery events would lie between its neighbours' on the receiver."""
    accounted = m.where(
        (F.col("arrived") | (F.col("status") == "discarded"))
        & (F.col("seq") >= F.col("lowest"))
        & (F.col("seq") <= F.col("highest"))
    )
    in_seq = Window.partitionBy(*STREAM).orderBy("seq")
    previous = F.lag(F.struct("seq", "arrived_t", "arrived_id")).over(in_seq)
    width = F.col("seq") - F.col("previous") - 1
    # seqs a promoted mirror's file held in order arrived, with or without a row here
    held_through = F.least(F.coalesce(F.col("inherited_received"), F.lit(0)), F.col("seq") - 1)
    return (
        accounted.withColumn("before", previous)
        .withColumn(
            "previous",
            F.greatest(F.coalesce(F.col("before.seq"), F.col("lowest") - 1), held_through),
        )
        .where(width > 0)
        .select(
            *_finding(
                "gap",
                F.when(width == 1, F.format_string("never delivered, though seq %d was", "seq"))
                .otherwise(F.format_string("never delivered, nor the %d after it", width - 1))
                .alias("detail"),
                _ids("before.arrived_id", "arrived_id"),
                seq=F.col("previous") + 1,
                last_seq=F.col("seq") - 1,
                witness=F.col("receivers"),
                lo=F.col("before.arrived_t"),
                hi=F.col("arrived_t"),
            )
        )
    )


def findings(messages: DataFrame, inherited: DataFrame | None = None) -> DataFrame:
    """Every finding before crash windows are looked at (columns :data:`FINDING`);
    ``inherited``, :func:`inheritance` of the events."""
    return _findings(_prepared(messages, inherited))


def _findings(m: DataFrame) -> DataFrame:
    """Every finding in ``m``, the :func:`_prepared` message table (read once per kind)."""
    duplicates = m.where(F.col("deliveries") > 1).select(
        *_finding(
            "duplicate", F.format_string("delivered %d times", "deliveries"), F.col("delivered_ids")
        )
    )
    received_twice = m.where(F.col("receptions") > 1).select(
        *_finding(
            "duplicate",
            F.format_string("received %d times by the application", "receptions"),
            F.col("received_ids"),
        )
    )
    # held by the file a promoted mirror inherited, then delivered again there
    delivered_again = m.where(
        (F.col("deliveries") == 1)
        & (F.col("seq") <= F.col("inherited_received"))
        & (F.col("delivered_t") > F.col("inherited_t"))
    ).select(
        *_finding(
            "duplicate",
            F.lit("delivered again after a promoted mirror's file held it"),
            _ids("inherited_id", "delivered_id"),
        )
    )
    lost = m.where(
        F.col("status").isin("lost", "held")
        & ~F.col("arrived")
        & (F.col("seq") == F.col("lowest_open"))
        & (F.col("highest").isNull() | (F.col("seq") > F.col("highest")))
    ).select(
        *_finding(
            "lost",
            F.lit("acknowledged to the sender but never delivered"),
            _ids("acked_id", "sent_id"),
            witness=F.col("receivers"),
            lo=F.col("sent_t"),
            hi=F.col("acked_t"),
        )
    )
    unsent = m.where(
        F.col("arrived")
        & F.col("sent_t").isNull()
        & (F.col("seq") >= F.col("lowest_sent"))
        & (F.col("seq") > F.coalesce(F.col("inherited_sent"), F.lit(0)))
    ).select(
        *_finding(
            "unsent",
            F.lit("delivered but never sent by its sender"),
            _ids("arrived_id"),
            witness=F.col("senders"),
            lo=F.col("sent_before"),
            hi=F.col("arrived_t"),
        )
    )
    return (
        duplicates.unionByName(received_twice)
        .unionByName(delivered_again)
        .unionByName(_disorder(m, "delivered", "delivered"))
        .unionByName(_disorder(m, "received", "received by the application"))
        .unionByName(_gaps(m))
        .unionByName(lost)
        .unionByName(unsent)
    )


def judged(found: DataFrame, windows: DataFrame) -> DataFrame:
    """``found`` with the findings a crash window of their witness could hide turned
    ``unknown`` ("trace missing"; ``missing`` keeps the kind), the window's ids added to
    the evidence, and ``direction``."""
    numbered = found.withColumn("fid", F.monotonically_increasing_id())
    w = windows
    overlaps = (
        F.array_contains(F.col("witness"), w["window_instance"])
        & (F.col("lo").isNull() | (F.col("lo") <= w["window_to"]))
        & (F.col("hi").isNull() | (F.col("hi") >= w["window_from"]))
    )
    earliest = Window.partitionBy("fid").orderBy(F.col("window_to").asc_nulls_last())
    matched = (
        numbered.join(w, overlaps, "left")
        .withColumn("k", F.row_number().over(earliest))
        .where(F.col("k") == 1)
    )
    hidden = F.col("marker").isNotNull()
    return matched.select(
        F.when(hidden, F.lit(UNKNOWN)).otherwise(F.col("kind")).alias("kind"),
        F.when(hidden, F.col("kind")).alias("missing"),
        *STREAM,
        "seq",
        "last_seq",
        "sender",
        "receiver",
        F.when(
            hidden,
            F.format_string("trace missing: %s (%s)", "detail", "cause"),
        )
        .otherwise(F.col("detail"))
        .alias("detail"),
        F.when(hidden, F.concat("evidence", F.array("last_durable", "marker")))
        .otherwise(F.col("evidence"))
        .alias("evidence"),
        _direction(F.col("initiator")).alias("direction"),
    )


def witnessed(found: DataFrame, witness: DataFrame) -> DataFrame:
    """``found`` with the unknown findings the database files settle made ``witnessed``:
    a missing SEND whose sender's endpoint sent through its seq, a missing delivery
    whose receiver's endpoint received through it (every message up to it is in the
    queue or was received: R-DLG-1)."""
    key = ["conversation_id", "initiator"]
    sent = witness.groupBy("conversation_id", F.col("is_initiator").alias("initiator")).agg(
        F.max("send_sequence").alias("sent_through")
    )
    received = witness.groupBy("conversation_id", (~F.col("is_initiator")).alias("initiator")).agg(
        F.max("receive_sequence").alias("received_through")
    )
    joined = found.join(sent, key, "left").join(received, key, "left")
    settled = (F.col("kind") == UNKNOWN) & (
        ((F.col("missing") == "unsent") & (F.col("sent_through") >= F.col("seq")))
        | (F.col("missing").isin("gap", "lost") & (F.col("received_through") >= F.col("last_seq")))
    )
    return joined.withColumn(
        "kind", F.when(settled, F.lit(WITNESSED)).otherwise(F.col("kind"))
    ).drop("sent_through", "received_through")


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
    # every kind of finding reads the prepared table: its windows run once
    prepared = keep(_prepared(messages, inheritance(events)))
    judgement = judged(_findings(prepared.df), crash_windows(events))
    if witness is not None:
        judgement = witnessed(judgement, witness)
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
