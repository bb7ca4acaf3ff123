"""The audit and the tables on edge cases of hand-written trace segments in the daemons'
format (docs/traces.md: one JSON object per line, ``v``, ``instance``, ``ts``, ``event``,
``n``; segments named ``<instance>-<UTC start>-<pid>-<n>.jsonl``), analysed by the real
Spark jobs (``brokerd.analytics.report.analyze``), all in one trace set:

* a stream whose first message is never delivered while the second is, on a receiver
  that crashed and restarted long before the conversation began;
* a conversation DELAYED on a daemon that is then restarted with a route: the new
  process chooses the route (its endpoint has no earlier decision in memory, so it writes
  ``route_chosen`` and no ``released``) and the message is delivered;
* daemon processes whose last segment holds no whole line (a torn one only, or none:
  killed right after a segment was rotated);
* a receiving endpoint whose last events are a rollback and a quarantine (their
  ``initiator`` names the sender's role, as the receiving side's message events do);
* a stream whose receiver moved midway (a mirrored database failed over from ``m1`` to
  ``m2``) and lost a message after the move.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from brokerd.analytics.report import Analysis, analyze
from brokerd.traces.writer import iso_micros

T0 = 1_790_000_000.0
STAMP = "20260922T000000"


class Segments:
    """Trace segments written line by line in the daemons' format."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.numbers: dict[str, int] = {}
        self.open: dict[tuple[str, int, int], list[str]] = {}

    def emit(
        self,
        instance: str,
        t: float,
        event: str,
        cid: uuid.UUID | None = None,
        *,
        pid: int = 100,
        segment: int = 1,
        **fields: Any,
    ) -> int:
        n = self.numbers.get(instance, 0) + 1
        self.numbers[instance] = n
        line: dict[str, Any] = {"v": 1, "instance": instance, "ts": iso_micros(t), "event": event}
        line["n"] = n
        if cid is not None:
            line["conversation_id"] = str(cid)
        line.update({k: v for k, v in fields.items() if v is not None})
        self.open.setdefault((instance, pid, segment), []).append(json.dumps(line) + "\n")
        return n

    def raw(self, instance: str, pid: int, segment: int, text: str) -> None:
        """Text as it is, for a torn line (or nothing: an empty segment)."""
        self.open.setdefault((instance, pid, segment), []).append(text)

    def close(self) -> None:
        for (instance, pid, segment), lines in self.open.items():
            directory = self.root / instance
            directory.mkdir(parents=True, exist_ok=True)
            stamp = f"{STAMP[:-2]}{segment:02d}"  # later segments start later
            name = f"{instance}-{stamp}-{pid}-{segment:05d}.jsonl"
            (directory / name).write_text("".join(lines))


def planted(root: Path) -> dict[str, Any]:
    s = Segments(root)
    a = {"database": "db", "initiator": True}
    known: dict[str, Any] = {}

    # -- b crashed and restarted long before the conversations below began ------------
    s.emit("b", T0, "started", pid=100)
    s.emit("b", T0 + 1, "connection_opened", pid=100, peer="a@127.0.0.1:4022")
    last = s.numbers["b"]
    s.emit(
        "b",
        T0 + 5,
        "started",
        pid=200,
        last_n=last,
        last_ts=iso_micros(T0 + 1),
        last_event="connection_opened",
        clean=False,
    )
    s.emit("a", T0, "started", pid=100)
    # first: seq 1 sent, never delivered; seq 2 delivered (one hour later)
    first = uuid.uuid4()
    later = uuid.uuid4()  # the same, with seq 2 the one missing: a gap, as a control
    known["first"], known["later"] = str(first), str(later)
    t = T0 + 3600
    for cid in (first, later):
        for seq in (1, 2, 3):
            s.emit(
                "a", t + seq, "message_sent", cid, seq=seq, service="//a", far_service="//b", **a
            )
            s.emit(
                "a", t + seq, "fragment_sent", cid, seq=seq, fragment=0, attempt=1,
                peer="tcp://127.0.0.2:4022", route="R", **a,
            )  # fmt: skip
        missing = 1 if cid == first else 2
        for seq in (1, 2, 3):
            if seq != missing:
                s.emit("b", t + seq + 0.01, "delivered", cid, pid=200, seq=seq, queue="Q", **a)
        t += 10

    # -- DELAYED on c, c restarted with a route, the message delivered on d ------------
    delayed = uuid.uuid4()
    known["delayed"] = str(delayed)
    t = T0 + 3700
    s.emit("c", t, "started", pid=100)
    s.emit("c", t + 1, "dialog_begun", delayed, service="//c", far_service="//d", **a)
    s.emit(
        "c", t + 1, "delayed", delayed, service="//d",
        reason="no route to service '//d'; DELAYED (R-ROUTE-13)", **a,
    )  # fmt: skip
    s.emit("c", t + 2, "message_sent", delayed, seq=1, service="//c", far_service="//d", **a)
    s.emit("c", t + 2, "enqueued", delayed, seq=1, **a)
    s.emit("c", t + 3, "stopped")
    last = s.numbers["c"]
    s.emit(
        "c", t + 10, "started", pid=200, last_n=last, last_ts=iso_micros(t + 3),
        last_event="stopped", clean=True,
    )  # fmt: skip
    s.emit(
        "c", t + 10.001, "route_chosen", delayed, pid=200, service="//d", decision="network",
        route="ToD", step="service", address="tcp://127.0.0.4:4022", **a,
    )  # fmt: skip
    s.emit(
        "c", t + 10.002, "fragment_sent", delayed, pid=200, seq=1, fragment=0, attempt=1,
        peer="tcp://127.0.0.4:4022", route="ToD", **a,
    )  # fmt: skip
    s.emit("d", t + 10.003, "started", pid=100)
    s.emit(
        "d", t + 10.004, "fragment_received", delayed, seq=1, fragment=0, fragments=1,
        peer="c@127.0.0.3:4022", initiator=True,
    )  # fmt: skip
    s.emit("d", t + 10.005, "delivered", delayed, seq=1, queue="Q", **a)
    s.emit("c", t + 10.006, "ack_received", delayed, pid=200, through=1, acked=1, seqs="1", **a)
    known["delayed_from"], known["routed_at"] = t + 1, t + 10.001

    # -- processes whose last segment holds no whole line ------------------------------
    t = T0 + 3800
    for instance, tail in (("e", '{"v":1,"instance":"e","ts":"2026-09-22T00:0'), ("f", "")):
        s.emit(instance, t, "started", pid=100, segment=1)
        s.emit(instance, t + 1, "connection_opened", pid=100, segment=1, peer="x@y:1")
        s.raw(instance, 100, 2, tail)  # rotated, then killed during (or before) its write
        last = s.numbers[instance]
        s.emit(
            instance, t + 20, "started", pid=200, segment=3, last_n=last,
            last_ts=iso_micros(t + 1), last_event="connection_opened", clean=False,
        )  # fmt: skip

    # -- a receiving endpoint whose last events are a rollback and a quarantine --------
    poison = uuid.uuid4()
    known["poison"] = str(poison)
    t = T0 + 3900
    s.emit("g", t, "started", pid=100)
    s.emit("h", t, "started", pid=100)
    s.emit("g", t + 1, "dialog_begun", poison, service="//g", far_service="//h", **a)
    s.emit("g", t + 1, "message_sent", poison, seq=1, service="//g", far_service="//h", **a)
    s.emit("h", t + 2, "dialog_begun", poison, database="db", initiator=False,
           service="//h", far_service="//g")  # fmt: skip
    s.emit("h", t + 2, "delivered", poison, seq=1, queue="Q", **a)
    s.emit("g", t + 2.1, "ack_received", poison, through=1, acked=1, seqs="1", **a)
    for k in (1, 2, 3):
        s.emit("h", t + 10 * k, "rolled_back", poison, seq=1, queue="Q", rollbacks=k,
               reason="ROLLBACK", **a)  # fmt: skip
    s.emit("h", t + 30, "quarantined", poison, seq=1, queue="Q", rollbacks=3,
           message_type="DEFAULT", reason="ROLLBACK", **a)  # fmt: skip
    known["quarantined_at"] = t + 30
    # -- streams received by m1, then by m2 (its promoted mirror); seq 5 lost after ----
    # seqs 3 and 4 of ``moved`` show on m2 by their RECEIVEs only (their deliveries'
    # events missing); those of ``inherited`` by m2's file, as the promotion found it
    t = T0 + 3950
    for instance in ("m1", "m2"):
        s.emit(instance, t, "started", pid=100)
    for name in ("moved", "inherited"):
        cid = uuid.uuid4()
        known[name] = str(cid)
        if name == "inherited":
            s.emit("m2", t + 2.5, "inherited", cid, database="db", initiator=False,
                   sent_through=0, received_through=4)  # fmt: skip
        for seq in range(1, 6):
            s.emit("g", t + seq, "message_sent", cid, seq=seq, service="//g",
                   far_service="//m", **a)  # fmt: skip
            if seq <= 2:
                s.emit("m1", t + seq + 0.01, "delivered", cid, seq=seq, queue="Q", **a)
            elif seq <= 4 and name == "moved":
                s.emit("m2", t + seq + 0.02, "received", cid, seq=seq, queue="Q", **a)
        s.emit("g", t + 5.1, "ack_received", cid, through=5, acked=5, seqs="1,2,3,4,5", **a)
    # the set ends a minute later
    s.emit("g", t + 90, "connection_closed", peer="h@127.0.0.8:4022", reason="idle")
    known["end"] = t + 90
    s.close()
    return known


@pytest.fixture(scope="module")
def planted_analysis(
    tmp_path_factory: pytest.TempPathFactory, spark: SparkSession
) -> tuple[dict[str, Any], Analysis]:
    root = tmp_path_factory.mktemp("edges")
    known = planted(root)
    return known, analyze([root], spark=spark, progress=None, top=500)


def test_a_gap_at_a_streams_start_is_not_hidden_by_an_older_crash_window(
    planted_analysis: tuple[dict[str, Any], Analysis],
) -> None:
    """R-TRACE-2: only a crash window that could hide the missing delivery makes a gap
    unknown. The first message of a stream cannot have been delivered before it was sent:
    a window of the receiver that closed an hour before is no excuse, and the gap is a
    violation, as the same gap one seq later is."""
    known, result = planted_analysis
    gaps = {v["conversation_id"]: v["seq"] for v in result.audit.violations if v["kind"] == "gap"}
    assert gaps.get(known["later"]) == 2  # the control: bounded by its neighbours
    hidden = [u for u in result.audit.unknowns if u["conversation_id"] == known["first"]]
    assert hidden == [], hidden
    assert gaps.get(known["first"]) == 1


def test_a_delayed_conversation_routed_after_a_restart_is_no_longer_delayed(
    planted_analysis: tuple[dict[str, Any], Analysis],
) -> None:
    """R-ROUTE-13, R-REPORT-1: a DELAYED period ends when the endpoint's messages get a
    route. A restarted daemon decides afresh and writes ``route_chosen`` (no ``released``:
    the new process made no earlier decision); its message was delivered, so the
    conversation is not still DELAYED, and its DELAYED time ends at the route at the
    latest."""
    known, result = planted_analysis
    (row,) = [
        r
        for r in result.tables["delayed_conversations"].records()
        if r["conversation_id"] == known["delayed"]
    ]
    assert row["still_delayed"] is False, row
    assert row["delayed_seconds"] <= known["routed_at"] - known["delayed_from"] + 1e-6, row
    reasons = [r for r in result.tables["wait_reasons"].records() if r["kind"] == "delayed"]
    assert sum(r["still_waiting"] for r in reasons) == 0, reasons


def test_a_process_whose_last_segment_has_no_whole_line_is_listed_as_killed(
    planted_analysis: tuple[dict[str, Any], Analysis],
) -> None:
    """R-REPORT-1: a restart is a segment written by a new process, a kill a process whose
    last segment ends in a torn line or whose successor's start marker says the stop was
    not clean. A process killed just after rotating its segment (the new one empty, or
    torn in its first line) still ran, was killed and was restarted."""
    _, result = planted_analysis
    by = {(p.instance, p.pid): p.ended for p in result.processes}
    for instance in ("e", "f"):
        assert by.get((instance, 100)) == "killed", (instance, by)
        assert by.get((instance, 200)) == "running", (instance, by)


def test_an_open_endpoints_last_event_counts_its_rollbacks_and_quarantine(
    planted_analysis: tuple[dict[str, Any], Analysis],
) -> None:
    """R-REPORT-1 (the endpoints waiting longest), SPEC §6: the receiving endpoint's own
    events include the rollbacks and quarantine of the messages it received (their
    ``initiator`` names the sender's role): its last event is the quarantine, and it has
    been idle since."""
    known, result = planted_analysis
    (row,) = [
        r
        for r in result.tables["open_endpoints"].records()
        if r["conversation_id"] == known["poison"] and r["initiator"] is False
    ]
    assert row["last_event"] == "quarantined", row
    assert row["idle_seconds"] == pytest.approx(known["end"] - known["quarantined_at"]), row


def test_a_message_lost_after_its_stream_moved_names_the_receiver_it_moved_to(
    planted_analysis: tuple[dict[str, Any], Analysis],
) -> None:
    """R-TRACE-2: a finding names the receiver instance. A message acknowledged and never
    delivered, the stream's last, is named after the instance that received the stream at
    its place: where the nearest arrival before it was (the mirror promoted after seq 2,
    which showed seqs 3 and 4 by their RECEIVEs, or held them in its file), not the
    stream's first receiver (m1, which delivered seqs 1 and 2)."""
    known, result = planted_analysis
    for name in ("moved", "inherited"):
        found = [v for v in result.audit.violations if v["conversation_id"] == known[name]]
        assert [(v["kind"], v["seq"]) for v in found] == [("lost", 5)], (name, found)
        assert (found[0]["sender"], found[0]["receiver"]) == ("g", "m2"), (name, found)
