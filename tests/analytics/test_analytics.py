"""The PySpark jobs (analytics/) against trace sets whose figures are known.

* A synthetic deployment (brokerd.analytics.synthetic): six instances, load balancing, a
  forwarder, lost fragments, corrupted frames, lost acknowledgements, DELAYED and
  open conversations, injected audit violations, a torn line. Every figure the
  generator knows is checked.
* A handcrafted set with exact latencies (seq n takes n ms), so percentiles, hops
  and forwarder dwell have exact expected values; discarded messages (END
  CONVERSATION WITH ERROR) are not gaps (R-DLG-5); a conversation DELAYED to the
  end of the set (R-ROUTE-13) is reported with its reason.
* ``brokerd analyze`` as a command: exit status, printed audit, report files.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from markupsafe import escape
from pyspark.sql import SparkSession

from brokerd.analytics.audit import audit
from brokerd.analytics.load import load_traces
from brokerd.analytics.messages import message_table
from brokerd.analytics.page import FIGURES
from brokerd.analytics.report import Analysis, analyze, render_html
from brokerd.analytics.synthetic import ADDRESSES, Plan, Truth, generate
from brokerd.errors import AnalyticsError
from brokerd.traces import columnar
from tests.analytics.handwritten import T0, Writer
from tests.commands import brokerd

# -- a synthetic deployment ---------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic(
    tmp_path_factory: pytest.TempPathFactory, spark: SparkSession
) -> tuple[Truth, Analysis]:
    root = tmp_path_factory.mktemp("synthetic")
    truth = generate(root, Plan(conversations=200, violations=True, segment_seconds=20))
    return truth, analyze([root], spark=spark, progress=None, top=500)


def test_synthetic_inputs_are_read_and_the_torn_line_skipped(
    synthetic: tuple[Truth, Analysis],
) -> None:
    truth, result = synthetic
    assert result.inputs["events"] == truth.events
    assert result.inputs["lines_skipped"] == truth.lines_skipped == 1
    assert result.inputs["other_schema_versions"] == truth.other_versions == 1
    assert result.inputs["instances"] == sorted(ADDRESSES)
    assert result.inputs["files"] > len(ADDRESSES)  # segments rotated by age


def test_synthetic_totals_match_the_generator(synthetic: tuple[Truth, Analysis]) -> None:
    truth, result = synthetic
    t = result.totals
    assert t["messages_sent"] == truth.messages_sent
    assert t["messages_delivered"] == truth.messages_delivered
    assert t["messages_received"] == truth.messages_received
    assert t["messages_waiting"] == truth.messages_waiting
    assert t["messages_forwarded"] == truth.messages_forwarded
    assert t["retransmissions"] == truth.retransmissions
    assert t["duplicates"] == truth.duplicates
    assert t["corrupted_messages"] == truth.corrupted_messages
    assert t["connections_refused"] == truth.connections_refused
    assert t["conversations_delayed"] == truth.delayed_conversations


def test_synthetic_audit_names_every_injected_violation(synthetic: tuple[Truth, Analysis]) -> None:
    truth, result = synthetic
    found = {
        (v["kind"], v["conversation_id"], v["initiator"], v["seq"]) for v in result.audit.violations
    }
    assert found == truth.violations
    assert result.audit.counts == {
        "duplicate": 1,
        "gap": 1,  # an acknowledged message never delivered while a later one was
        "out_of_order": 1,
        "lost": 0,
        "unsent": 0,
        "unknown": 0,
        "witnessed": 0,
    }


def test_synthetic_latency_delays_spread_and_waiting(synthetic: tuple[Truth, Analysis]) -> None:
    truth, result = synthetic
    pairs = result.tables["latency_by_service_pair"].records()
    assert sum(r["count"] for r in pairs) == truth.messages_delivered
    legs = result.tables["latency_by_hop"].records()
    assert {(r["leg"], r["from_instance"], r["to_instance"]) for r in legs} >= {
        (1, "client-2", "hub"),
        (2, "hub", "ledger"),
        (1, "ledger", "hub"),
        (2, "hub", "client-2"),
    }
    delayed = result.tables["delayed_conversations"].records()
    assert len(delayed) == truth.delayed_conversations
    assert sum(r["delayed_seconds"] for r in delayed) == pytest.approx(truth.delayed_seconds)
    spread = result.tables["route_spread"].records()
    per_store: dict[str, int] = {}
    for r in spread:
        if r["service"] == "//warehouse/Orders":
            per_store[r["address"]] = per_store.get(r["address"], 0) + r["dialogs"]
    client_1 = [
        r for r in spread if r["sender"] == "client-1" and r["service"] == "//warehouse/Orders"
    ]
    assert sorted(r["share_pct"] for r in client_1) == [50.0, 50.0]
    assert per_store[ADDRESSES["store-2"]] == truth.dialogs_per_store[ADDRESSES["store-2"]]
    waiting = result.tables["waiting_messages"].records()
    assert {(r["conversation_id"], r["initiator"], r["seq"]) for r in waiting} == set(truth.waiting)
    assert all(r["last_status"].startswith("sent (attempt 3)") for r in waiting)
    assert result.tables["open_endpoints"].total_rows == truth.open_endpoints
    connections = result.tables["faults_by_connection"].records()
    assert sum(r["retransmissions"] for r in connections) == truth.retransmissions
    assert sum(r["corrupted_messages"] for r in connections) == truth.corrupted_messages
    routes = result.tables["faults_by_route"].records()
    assert sum(r["retransmissions"] for r in routes) == truth.retransmissions
    assert sum(r["duplicates"] for r in routes) == truth.duplicates


def test_compacted_plain_and_mixed_segments_give_the_same_analysis(
    tmp_path: Path, spark: SparkSession, synthetic: tuple[Truth, Analysis]
) -> None:
    """The same deployment's traces with every other segment still JSON Lines (as a running
    deployment leaves them, its open segments plain) give the analysis the compacted set
    gives: the same inputs, totals, findings and tables (docs/traces.md "Compaction")."""
    _, compacted = synthetic
    generate(tmp_path, Plan(conversations=200, violations=True, segment_seconds=20, compact=False))
    segments = sorted(tmp_path.rglob("*.jsonl"))
    for path in segments[::2]:
        columnar.write(path, path.with_name(path.name.removesuffix(".jsonl") + ".parquet"))
        path.unlink()
    assert sorted(tmp_path.rglob("*.jsonl")) and sorted(tmp_path.rglob("*.parquet"))
    mixed = analyze([tmp_path], spark=spark, progress=None, top=500)
    assert {k: v for k, v in mixed.inputs.items() if k != "bytes"} == {
        k: v for k, v in compacted.inputs.items() if k != "bytes"
    }
    assert mixed.totals == compacted.totals
    assert mixed.audit.violations == compacted.audit.violations
    assert {n: t.rows for n, t in mixed.tables.items()} == {
        n: t.rows for n, t in compacted.tables.items()
    }


def test_a_damaged_compacted_segment_is_named_and_left_out(
    tmp_path: Path, spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    """A compacted segment that does not read (a page changed on disk, here) is named, on
    stderr and in the inputs, and the analysis reads every other segment: bad input loses
    only itself (docs/analytics.md, Reading)."""
    truth = generate(tmp_path, Plan(conversations=40, segment_seconds=20))
    segments = sorted(tmp_path.rglob("*.parquet"))
    assert len(segments) > 2
    damaged = max(segments, key=columnar.rows)
    rows = columnar.rows(damaged)
    chunk = pq.read_metadata(damaged).row_group(0).column(0)
    page = (
        (chunk.dictionary_page_offset or chunk.data_page_offset) + chunk.total_compressed_size - 1
    )
    data = bytearray(damaged.read_bytes())
    data[page] ^= 0xFF
    damaged.write_bytes(bytes(data))
    result = analyze([tmp_path], spark=spark, progress=None)
    [named] = result.inputs["damaged_segments"]
    assert named["file"] == str(damaged) and "checksum" in named["error"]
    assert str(damaged) in capsys.readouterr().err
    assert result.inputs["files"] == len(segments) - 1
    read = ("events", "lines_skipped", "other_schema_versions")
    written = truth.events + truth.lines_skipped + truth.other_versions
    assert sum(result.inputs[k] for k in read) == written - rows
    assert f"Left out, damaged: <code>{damaged}</code>" in render_html(result)


def test_synthetic_report_is_well_formed_html_with_charts(
    synthetic: tuple[Truth, Analysis],
) -> None:
    """The page opens with the verdict, names every figure in plain words, and carries a
    Vega-Lite spec for each chart (drawn in a browser: tests/analytics/test_report_page.py)."""
    _, result = synthetic
    page = render_html(result)

    class Checker(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.stack: list[str] = []
            self.charts = 0

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.charts += tag == "div" and ("class", "view") in attrs
            if tag not in ("meta",):
                self.stack.append(tag)

        def handle_endtag(self, tag: str) -> None:
            assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
            self.stack.pop()

    checker = Checker()
    checker.feed(page)
    assert checker.stack == []
    assert checker.charts == 3
    assert page.count("vegaEmbed(") >= 3 and "window.vegaEmbed" in page  # embedded, offline
    assert "<script src=" not in page
    assert page.index("3 finding(s)") < page.index("Messages delivered")
    assert "1 out of order" in page
    for key in result.totals:
        assert key in FIGURES, f"{key} has no plain name"
        assert str(escape(FIGURES[key])) in page
    assert "messages_acknowledged_receiver_untraced</td>" not in page
    longest = result.tables["longest_waits"].records()
    assert longest[0]["wait_seconds"] >= longest[-1]["wait_seconds"]
    assert any("retransmission" in r["reason"] for r in longest)
    assert any(r["status"] == "waiting" and "still waiting" in r["reason"] for r in longest)


# -- a handcrafted set with exact figures ------------------------------------------------


def handcrafted(root: Path) -> dict[str, object]:
    w = Writer(root)
    c1, c2, c3 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    ms = 0.001
    w.emit(
        "a", T0, "dialog_begun", c1, database="db", initiator=True, service="//a", far_service="//b"
    )
    for seq in range(1, 101):  # a -> f -> b; message seq takes seq ms
        s = T0 + seq
        common = {"initiator": True, "seq": seq}
        w.emit(
            "a",
            s,
            "message_sent",
            c1,
            database="db",
            service="//a",
            far_service="//b",
            size=10,
            **common,
        )
        w.emit(
            "a",
            s,
            "fragment_sent",
            c1,
            fragment=0,
            attempt=1,
            peer="tcp://f:4022",
            route="R",
            **common,
        )
        w.emit("f", s + 0.3 * seq * ms, "fragment_received", c1, fragment=0, peer="a@x", **common)
        w.emit(
            "f",
            s + 0.5 * seq * ms,
            "forwarded",
            c1,
            fragment=0,
            hop=1,
            address="tcp://b:4022",
            **common,
        )
        w.emit(
            "b",
            s + 0.9 * seq * ms,
            "fragment_received",
            c1,
            fragment=0,
            hop=1,
            peer="f@x",
            **common,
        )
        w.emit("b", s + seq * ms, "delivered", c1, database="db", **common)
        w.emit(
            "a", s + 0.5, "ack_received", c1, initiator=True, through=seq, acked=1, seqs=str(seq)
        )
        w.emit("b", s + 0.6, "received", c1, database="db", **common)
    # c2: seqs 4 and 5 discarded by END CONVERSATION WITH ERROR, the Error is seq 6.
    for seq in (1, 2, 3, 4, 5, 6):
        w.emit(
            "a",
            T0 + seq,
            "message_sent",
            c2,
            database="db",
            service="//c",
            far_service="//d",
            initiator=True,
            seq=seq,
        )
        if seq not in (4, 5):
            w.emit("b", T0 + seq + 0.01, "delivered", c2, database="db", initiator=True, seq=seq)
    w.emit(
        "a",
        T0 + 5.5,
        "discarded",
        c2,
        database="db",
        initiator=True,
        seqs="4,5",
        reason="END CONVERSATION WITH ERROR",
    )
    # c3: DELAYED from T0 + 10 to the end of the set, with one message waiting.
    w.emit(
        "a",
        T0 + 10,
        "dialog_begun",
        c3,
        database="db",
        initiator=True,
        service="//a",
        far_service="//nowhere",
    )
    w.emit(
        "a",
        T0 + 10,
        "delayed",
        c3,
        database="db",
        initiator=True,
        service="//nowhere",
        reason="no route to service '//nowhere'",
    )
    w.emit(
        "a",
        T0 + 11,
        "message_sent",
        c3,
        database="db",
        service="//a",
        far_service="//nowhere",
        initiator=True,
        seq=1,
    )
    w.emit("a", T0 + 11, "enqueued", c3, database="db", initiator=True, seq=1)
    w.emit(
        "b", T0 + 12, "dropped", uuid.uuid4(), initiator=True, seq=3, reason="conversation is CD"
    )
    w.close()
    return {"c1": str(c1), "c2": str(c2), "c3": str(c3), "end": T0 + 100.6}


@pytest.fixture(scope="module")
def exact(
    tmp_path_factory: pytest.TempPathFactory, spark: SparkSession
) -> tuple[dict[str, object], Analysis]:
    root = tmp_path_factory.mktemp("handcrafted")
    known = handcrafted(root)
    return known, analyze([root], spark=spark, progress=None)


def test_percentiles_are_exact_on_known_latencies(
    exact: tuple[dict[str, object], Analysis],
) -> None:
    _, result = exact
    (pair,) = [r for r in result.tables["latency_by_service_pair"].records() if r["count"] == 100]
    assert (pair["p50_ms"], pair["p90_ms"], pair["p99_ms"], pair["max_ms"]) == (50, 90, 99, 100)
    assert pair["mean_ms"] == 50.5
    assert pair["receive_max_ms"] == 600
    (route,) = [r for r in result.tables["latency_by_route"].records() if r["route"] == "R"]
    assert route["address"] == "tcp://f:4022" and route["max_ms"] == 100


def test_latency_per_hop_and_forwarder_dwell(exact: tuple[dict[str, object], Analysis]) -> None:
    _, result = exact
    legs = {
        (r["leg"], r["from_instance"], r["to_instance"]): r
        for r in result.tables["latency_by_hop"].records()
    }
    assert set(legs) == {(1, "a", "f"), (2, "f", "b")}
    assert legs[(1, "a", "f")]["count"] == 100
    assert legs[(1, "a", "f")]["max_ms"] == 30 and legs[(1, "a", "f")]["p50_ms"] == 15
    assert legs[(2, "f", "b")]["max_ms"] == 40
    (dwell,) = result.tables["forwarder_dwell"].records()
    assert (dwell["instance"], dwell["hop"], dwell["max_ms"]) == ("f", 1, 20)
    histogram = result.tables["latency_histogram"].records()
    assert sum(r["messages"] for r in histogram) == result.totals["messages_delivered"] == 104


def test_discarded_messages_are_not_gaps(exact: tuple[dict[str, object], Analysis]) -> None:
    _, result = exact
    assert result.audit.passed, result.audit.violations
    assert result.audit.discarded == 2
    assert result.totals["messages_discarded"] == 2


def test_a_conversation_delayed_to_the_end_is_reported_with_its_reason(
    exact: tuple[dict[str, object], Analysis],
) -> None:
    known, result = exact
    (delayed,) = result.tables["delayed_conversations"].records()
    assert delayed["conversation_id"] == known["c3"] and delayed["still_delayed"] is True
    assert delayed["delayed_seconds"] == pytest.approx(float(known["end"]) - (T0 + 10))  # type: ignore[arg-type]
    (waiting,) = result.tables["waiting_messages"].records()
    assert waiting["conversation_id"] == known["c3"]
    assert waiting["last_status"] == "DELAYED: no route to service '//nowhere'"
    reasons = {(r["kind"], r["reason"]): r for r in result.tables["wait_reasons"].records()}
    assert reasons[("delayed", "no route to service '//nowhere'")]["still_waiting"] == 1
    assert reasons[("dropped", "conversation is CD")]["times"] == 1
    (drop,) = [r for r in result.tables["drops_by_reason"].records() if r["event"] == "dropped"]
    assert (drop["instance"], drop["reason"]) == ("b", "conversation is CD")


# -- edge cases: what the traces cannot show is not a violation ------------------------


def edge_cases(root: Path) -> dict[str, str]:
    w = Writer(root)
    c = {
        name: uuid.uuid4()
        for name in (
            "held",
            "untraced",
            "late",
            "unsent",
            "cleanup",
            "retry",
            "gap",
            "inherited",
            "inherited_sent",
            "inherited_gap",
            "inherited_again",
            "received_only",
        )
    }
    a = {"database": "db", "initiator": True}
    # seq 2 acknowledged by a range while seq 1 is still missing: held, not lost
    w.emit("a", T0 + 1, "message_sent", c["held"], seq=1, **a)
    w.emit("a", T0 + 1, "message_sent", c["held"], seq=2, **a)
    w.emit(
        "b",
        T0 + 1.01,
        "fragment_received",
        c["held"],
        initiator=True,
        seq=2,
        fragment=0,
        peer="a@x",
    )
    w.emit(
        "b", T0 + 1.02, "ack_sent", c["held"], database="db", initiator=True, through=0, peer="a@x"
    )
    w.emit("a", T0 + 1.03, "ack_received", c["held"], seqs="2", acked=1, through=0, **a)
    # only the sender's traces: acknowledged, not lost
    w.emit("a", T0 + 2, "message_sent", c["untraced"], seq=1, **a)
    w.emit("a", T0 + 2.01, "ack_received", c["untraced"], seqs="1", acked=1, through=1, **a)
    # acknowledged and RECEIVEd, its delivery's event not in the set: delivered, not lost
    w.emit("a", T0 + 2.5, "message_sent", c["received_only"], seq=1, **a)
    w.emit("b", T0 + 2.51, "ack_sent", c["received_only"], through=1, peer="a@x", **a)
    w.emit("a", T0 + 2.52, "ack_received", c["received_only"], seqs="1", acked=1, through=1, **a)
    w.emit("b", T0 + 2.53, "received", c["received_only"], seq=1, **a)
    w.emit("b", T0 + 3, "received", c["late"], seq=3, **a)
    w.emit("a", T0 + 3, "message_sent", c["late"], seq=4, **a)
    w.emit("b", T0 + 3.01, "delivered", c["late"], seq=4, **a)
    # the sender's traces begin at seq 2
    w.emit("b", T0 + 4, "delivered", c["unsent"], seq=1, **a)
    w.emit("a", T0 + 4, "message_sent", c["unsent"], seq=2, **a)
    w.emit("b", T0 + 4.01, "delivered", c["unsent"], seq=2, **a)
    # DELAYED, then END CONVERSATION WITH CLEANUP after one second
    w.emit("a", T0 + 5, "dialog_begun", c["cleanup"], service="//a", far_service="//x", **a)
    w.emit("a", T0 + 5, "delayed", c["cleanup"], reason="no route", **a)
    w.emit("a", T0 + 6, "dialog_ended", c["cleanup"], **a)
    # the first attempt reaches f1, which never forwards; the retry goes through f2
    r = c["retry"]
    w.emit("a", T0 + 30, "message_sent", r, seq=1, **a)
    w.emit("a", T0 + 30, "fragment_sent", r, seq=1, fragment=0, attempt=1, peer="tcp://f1", **a)
    w.emit("f1", T0 + 30.001, "fragment_received", r, initiator=True, seq=1, fragment=0, peer="a@x")
    w.emit("a", T0 + 30.5, "retransmission", r, seq=1, attempt=2, wait=1.0, peer="tcp://f1", **a)
    w.emit("a", T0 + 30.5, "fragment_sent", r, seq=1, fragment=0, attempt=2, peer="tcp://f2", **a)
    w.emit("f2", T0 + 30.502, "fragment_received", r, initiator=True, seq=1, fragment=0, peer="a@x")
    w.emit("f2", T0 + 30.503, "forwarded", r, initiator=True, seq=1, fragment=0, hop=1)
    w.emit(
        "b",
        T0 + 30.506,
        "fragment_received",
        r,
        initiator=True,
        seq=1,
        fragment=0,
        hop=1,
        peer="f2@y",
    )
    w.emit("b", T0 + 30.507, "delivered", r, seq=1, **a)
    # seqs 2..4 sent, never delivered, while 5 was: one gap line
    for seq in range(1, 6):
        w.emit("a", T0 + 40 + seq, "message_sent", c["gap"], seq=seq, **a)
        if seq in (1, 5):
            w.emit("b", T0 + 40.01 + seq, "delivered", c["gap"], seq=seq, **a)
    # R-TRACE-5: p1 delivered seqs 1..4 and was killed before its events of 3 and 4 were
    # on disk; p2, promoted, inherited them (received through 4) and delivered 5
    t = {"database": "db", "initiator": False}
    for name, through in (("inherited", 4), ("inherited_gap", 2), ("inherited_again", 4)):
        for seq in range(1, 6):
            w.emit("a", T0 + 50 + seq / 10, "message_sent", c[name], seq=seq, **a)
        for seq in (1, 2):
            w.emit("p1", T0 + 50.01 + seq / 10, "delivered", c[name], seq=seq, **a)
        w.emit("p2", T0 + 51, "inherited", c[name], sent_through=0, received_through=through, **t)
        w.emit("p2", T0 + 51.2, "delivered", c[name], seq=5, **a)
    # ... but p2's file held only 1..2 of this one: 3..4 are a gap
    # ... and p2 delivered 3 again, though its file held it: a duplicate
    w.emit("p2", T0 + 51.1, "delivered", c["inherited_again"], seq=3, **a)
    # the sender was told of all five: what p2 inherited is delivered, neither lost nor held
    w.emit("a", T0 + 51.3, "ack_received", c["inherited"], seqs="1,2,3,4,5", through=5, **a)
    # p1 sent replies 1..3, its events of 2 and 3 lost; p2's file had sent through 3
    w.emit("p1", T0 + 60, "message_sent", c["inherited_sent"], seq=1, **t)
    w.emit("p2", T0 + 61, "inherited", c["inherited_sent"], sent_through=3, received_through=0, **t)
    for seq in (1, 2, 3):
        w.emit("a", T0 + 61 + seq / 10, "delivered", c["inherited_sent"], seq=seq, **t)
    w.close()
    segment = sorted((root / "a").glob("*.jsonl"))[0]
    with segment.open("a") as f:
        f.write('{"v":1,"instance":"a","ts":"2026-11-21T09:09:57Z","event":"delivered"}\n')
        f.write('{"instance":"a","ts":"2026-11-21T09:09:57.000001Z","event":"delivered"}\n')
        bad_seqs = {
            "v": 1,
            "instance": "a",
            "ts": "2026-11-21T09:09:57.000001Z",
            "event": "ack_received",
            "conversation_id": str(uuid.uuid4()),
            "initiator": True,
            "seqs": "x,",
        }
        f.write(json.dumps(bad_seqs) + "\n")
        arrival = {  # a line without its instance: its leg still has its latency
            "v": 1,
            "ts": datetime.fromtimestamp(T0 + 30.504, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "event": "fragment_received",
            "conversation_id": str(r),
            "initiator": True,
            "seq": 1,
            "fragment": 0,
            "peer": "a@x",
        }
        f.write(json.dumps(arrival) + "\n")
    return {k: str(v) for k, v in c.items()}


@pytest.fixture(scope="module")
def edges(
    tmp_path_factory: pytest.TempPathFactory, spark: SparkSession
) -> tuple[dict[str, str], Analysis]:
    root = tmp_path_factory.mktemp("edges")
    known = edge_cases(root)
    return known, analyze([root], spark=spark, progress=None)


def test_only_what_the_traces_show_is_a_violation(edges: tuple[dict[str, str], Analysis]) -> None:
    known, result = edges
    found = [(v["kind"], v["conversation_id"], v["seq"]) for v in result.audit.violations]
    assert sorted(found) == sorted(
        [
            ("gap", known["gap"], 2),
            ("gap", known["inherited_gap"], 3),
            ("duplicate", known["inherited_again"], 3),
        ]
    )
    assert result.audit.unknown == 0
    by = {v["conversation_id"]: v for v in result.audit.violations}
    assert by[known["inherited_gap"]]["last_seq"] == 4
    assert by[known["inherited_again"]]["detail"] == (
        "delivered again after a promoted mirror's file held it"
    )
    gap = by[known["gap"]]
    assert gap["detail"] == "never delivered, nor the 2 after it" and gap["last_seq"] == 4
    t = result.totals
    assert (
        t["messages_lost"],
        t["messages_held"],
        t["messages_acknowledged_receiver_untraced"],
    ) == (0, 1, 1)


def test_bad_timestamps_missing_versions_and_bad_seqs_are_skipped(
    edges: tuple[dict[str, str], Analysis],
) -> None:
    _, result = edges
    assert result.inputs["lines_skipped"] == 1  # the timestamp without microseconds
    assert result.inputs["other_schema_versions"] == 1  # no "v"
    # the acknowledgement listing "x," lists no message: only the 32 messages written
    # (held 2, untraced 1, received only 1, late 2, unsent 2, retry 1, gap 5, inherited
    # 3 x 5, inherited sent 3) are in the message table
    assert result.audit.messages == 32


def test_a_delayed_endpoint_closed_by_cleanup_is_not_still_delayed(
    edges: tuple[dict[str, str], Analysis],
) -> None:
    known, result = edges
    (delayed,) = result.tables["delayed_conversations"].records()
    assert delayed["conversation_id"] == known["cleanup"]
    assert delayed["delayed_seconds"] == 1.0 and delayed["still_delayed"] is False


def test_a_retry_over_another_forwarder_is_its_own_leg(
    edges: tuple[dict[str, str], Analysis],
) -> None:
    _, result = edges
    legs = {
        (r["leg"], r["from_instance"], r["to_instance"]): r["max_ms"]
        for r in result.tables["latency_by_hop"].records()
    }
    assert legs == {
        (1, "a", "f1"): 1.0,
        (1, "a", "f2"): 2.0,
        (2, "f2", "b"): 3.0,
        (1, "a", None): 4.0,  # an arrival's line without its instance
    }
    (dwell,) = result.tables["forwarder_dwell"].records()
    assert (dwell["instance"], dwell["hop"], dwell["max_ms"]) == ("f2", 1, 1.0)


def test_audit_of_a_clean_synthetic_set_passes(tmp_path: Path, spark: SparkSession) -> None:
    """Read from the cache, and from the compacted segments directly (as a large set is)."""
    truth = generate(tmp_path, Plan(conversations=60, seed=7))
    for cache in (True, False):
        loaded = load_traces(spark, [tmp_path], cache=cache)
        try:
            found = audit(message_table(loaded.events), loaded.events)
        finally:
            loaded.release()
        assert found.passed and found.total == 0
        assert found.waiting == truth.messages_waiting > 0


# -- the command -----------------------------------------------------------------------------


def test_analyze_command_writes_the_report_and_fails_on_violations(tmp_path: Path) -> None:
    generate(tmp_path / "traces", Plan(conversations=40, violations=True))
    done = brokerd("analyze", str(tmp_path / "traces"), "--out", str(tmp_path / "report"))
    assert done.returncode == 1, done.stderr[-2000:]
    assert "FAILED: 3 violation(s)" in done.stdout
    assert "[3/11] building the message table" in done.stderr  # progress
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["audit"]["violations"] == 3
    assert summary["inputs"]["lines_skipped"] == 1
    assert summary["events_per_second"] > 0
    assert (tmp_path / "report" / "report.html").read_text().startswith("<!doctype html>")


def test_the_report_pages_modules_are_not_imported_before_spark_starts() -> None:
    """``brokerd analyze`` imports the page's modules (Altair, Jinja2, vl-convert: about
    half a second) while the JVM starts, not with the analysis before it."""
    code = (
        "import sys, brokerd.analytics.report\n"
        "print(sorted(m for m in ('altair', 'jinja2', 'vl_convert') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_analyze_command_refuses_a_missing_directory(tmp_path: Path) -> None:
    done = brokerd("analyze", str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert "no such trace directory" in done.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    done = brokerd("analyze", str(empty))
    assert done.returncode == 2 and "no trace segments" in done.stderr


def test_load_refuses_paths_without_segments(tmp_path: Path, spark: SparkSession) -> None:
    with pytest.raises(AnalyticsError, match="no trace segments"):
        load_traces(spark, [tmp_path])
