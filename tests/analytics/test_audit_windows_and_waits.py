"""The audit and the tables that say why messages waited, on hand-written trace segments in
the daemons' format (docs/traces.md), analysed by the real Spark jobs
(``brokerd.analytics.report.analyze``), all in one trace set:

* a message that waited to leave while its sender could not reach another broker (a
  refusal of a connection to a broker the message was not going to);
* a message acknowledged by a receiver that crashed right after delivering it: its
  ``delivered`` event died in the crash window, the acknowledgement was lost with the
  connection, and after the restart the receiver's only trace of the stream is the
  resent copy it took as a duplicate and acknowledged;
* a conversation DELAYED after its first message had left, for its later messages;
* a sender killed right after its END CONVERSATION WITH ERROR committed: the discard of
  its pending messages and the Error's SEND died in its crash window;
* a target endpoint ended and removed, then begun again under the same conversation id by
  a late copy of the dialog's first message (SPEC §5);

and, from a real daemon's traces, a dialog ended WITH ERROR whose Error the target's
application receives before the messages waiting in its queue (R-DLG-10); and processes
read from segment names (no Spark): a daemon restarted under the same pid (a container's
pid 1).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from brokerd.analytics.processes import processes, restarts
from brokerd.analytics.report import Analysis, analyze
from brokerd.traces.writer import iso_micros
from protocol.dialog import ERROR
from tests.analytics.test_audit_edges import T0, Segments
from tests.daemons import solo_daemon, wait_until

HOST = "127.0.0.145"


def planted(root: Path) -> dict[str, Any]:
    s = Segments(root)
    a: dict[str, Any] = {"database": "db", "initiator": True}
    known: dict[str, Any] = {}

    # -- refusals of connections to another broker than the message's -----------------
    t = T0
    s.emit("a1", t, "started")
    for name, far, other in (
        ("elsewhere", "tcp://127.0.0.2:4022", "tcp://127.0.0.9:4022"),
        ("far", "tcp://127.0.0.3:4022", None),
    ):
        cid = uuid.uuid4()
        known[name] = str(cid)
        s.emit("a1", t + 1, "dialog_begun", cid, service="//a", far_service="//b", **a)
        s.emit(
            "a1", t + 1, "route_chosen", cid, service="//b", decision="network", route="R",
            step="service", address=far, **a,
        )  # fmt: skip
        s.emit("a1", t + 2, "message_sent", cid, seq=1, service="//a", far_service="//b", **a)
        s.emit("a1", t + 2, "enqueued", cid, seq=1, **a)
        for k in (3, 4, 5):
            s.emit(
                "a1", t + k, "connection_refused", peer=other or far,
                reason="connection refused (attempt 1); next attempt in 1 s",
            )  # fmt: skip
        s.emit(
            "a1", t + 8, "fragment_sent", cid, seq=1, fragment=0, fragments=1, attempt=1,
            peer=far, route="R", **a,
        )  # fmt: skip
        s.emit("b1", t + 8.01, "delivered", cid, seq=1, queue="Q", **a)
        s.emit("b1", t + 8.01, "ack_sent", cid, through=1, peer="a1@127.0.0.1:4022", **a)
        s.emit("a1", t + 8.02, "ack_received", cid, through=1, acked=1, seqs="1", **a)
        t += 100

    # -- a receiver that crashed right after a delivery --------------------------------
    t = T0 + 1000
    crashed = uuid.uuid4()
    known["crashed"] = str(crashed)
    s.emit("r", t, "started", pid=100)
    last = s.emit("r", t + 1, "connection_opened", pid=100, peer="s@127.0.0.1:4022")
    s.emit("s", t, "started")
    s.emit("s", t + 10, "message_sent", crashed, seq=1, service="//s", far_service="//r", **a)
    s.emit(
        "s", t + 10, "fragment_sent", crashed, seq=1, fragment=0, fragments=1, attempt=1,
        peer="tcp://127.0.0.4:4022", route="R", **a,
    )  # fmt: skip
    # r delivered seq 1 at t + 10.01 and was killed before its trace flush
    s.emit(
        "r", t + 20, "started", pid=200, last_n=last, last_ts=iso_micros(t + 1),
        last_event="connection_opened", clean=False,
    )  # fmt: skip
    s.emit("s", t + 25, "retransmission", crashed, seq=1, attempt=2, wait=4.0, **a)
    s.emit(
        "s", t + 25, "fragment_sent", crashed, seq=1, fragment=0, fragments=1, attempt=2,
        peer="tcp://127.0.0.4:4022", route="R", **a,
    )  # fmt: skip
    s.emit(
        "r", t + 25.01, "fragment_received", crashed, pid=200, seq=1, fragment=0, fragments=1,
        peer="s@127.0.0.1:4022", **a,
    )  # fmt: skip
    s.emit(
        "r", t + 25.01, "duplicate", crashed, pid=200, seq=1, fragment=0,
        peer="s@127.0.0.1:4022", **a,
    )  # fmt: skip
    s.emit("r", t + 25.01, "ack_sent", crashed, pid=200, through=1, peer="s@127.0.0.1:4022", **a)
    s.emit("s", t + 25.02, "ack_received", crashed, through=1, acked=1, seqs="1", **a)

    # -- DELAYED after the first message had left --------------------------------------
    t = T0 + 2000
    later = uuid.uuid4()
    known["later"] = str(later)
    s.emit("d1", t, "started")
    s.emit("d1", t + 1, "dialog_begun", later, service="//d", far_service="//e", **a)
    s.emit(
        "d1", t + 1, "route_chosen", later, service="//e", decision="network", route="R",
        step="service", address="tcp://127.0.0.5:4022", **a,
    )  # fmt: skip
    for seq, (sent, left) in enumerate(((2.0, 12.0), (21.0, 322.0)), start=1):
        s.emit("d1", t + sent, "message_sent", later, seq=seq, service="//d",
               far_service="//e", **a)  # fmt: skip
        s.emit("d1", t + sent, "enqueued", later, seq=seq, **a)
        if seq == 2:
            s.emit(
                "d1", t + 20, "delayed", later, service="//e",
                reason="no route to service '//e'; DELAYED (R-ROUTE-13)", **a,
            )  # fmt: skip
            s.emit("d1", t + 320, "released", later, **a)
            s.emit(
                "d1", t + 320, "route_chosen", later, service="//e", decision="network",
                route="R", step="service", address="tcp://127.0.0.5:4022", **a,
            )  # fmt: skip
        s.emit(
            "d1", t + left, "fragment_sent", later, seq=seq, fragment=0, fragments=1,
            attempt=1, peer="tcp://127.0.0.5:4022", route="R", **a,
        )  # fmt: skip
        s.emit("e1", t + left + 0.01, "delivered", later, seq=seq, queue="Q", **a)
        s.emit("d1", t + left + 0.02, "ack_received", later, through=seq, acked=1,
               seqs=str(seq), **a)  # fmt: skip

    # -- a sender that crashed right after END CONVERSATION WITH ERROR -----------------
    t = T0 + 2500
    ended = uuid.uuid4()
    known["ended"] = str(ended)
    s.emit("x", t, "started", pid=100)
    s.emit("y", t, "started")
    for seq in (1, 2, 3):
        s.emit("x", t + seq, "message_sent", ended, pid=100, seq=seq, service="//x",
               far_service="//y", **a)  # fmt: skip
        s.emit(
            "x", t + seq, "fragment_sent", ended, pid=100, seq=seq, fragment=0, fragments=1,
            attempt=1, peer="tcp://127.0.0.7:4022", route="R", **a,
        )  # fmt: skip
    s.emit("y", t + 1.01, "delivered", ended, seq=1, queue="Q", **a)
    last = s.emit("x", t + 1.02, "ack_received", ended, pid=100, through=1, acked=1, seqs="1", **a)
    # at t + 5 x commits END CONVERSATION WITH ERROR (seqs 2 and 3 discarded, the Error
    # numbered 4) and is killed before its trace flush; 2 and 3 never reached y
    s.emit(
        "x", t + 10, "started", pid=200, last_n=last, last_ts=iso_micros(t + 1.02),
        last_event="ack_received", clean=False,
    )  # fmt: skip
    s.emit(
        "x", t + 10.1, "fragment_sent", ended, pid=200, seq=4, fragment=0, fragments=1,
        attempt=1, peer="tcp://127.0.0.7:4022", route="R", **a,
    )  # fmt: skip
    s.emit("y", t + 10.11, "delivered", ended, seq=4, queue="Q", **a)
    s.emit("x", t + 10.12, "ack_received", ended, pid=200, through=4, acked=1, seqs="4", **a)
    # the control: x2 crashed too, but its seq 4 is an application's message (its SEND is
    # traced), sent after 2 and 3 and not an Error: no END discarded them
    control = uuid.uuid4()
    known["control"] = str(control)
    s.emit("x2", t, "started", pid=100)
    for seq in (1, 2, 3):
        s.emit("x2", t + seq, "message_sent", control, pid=100, seq=seq, service="//x",
               far_service="//y", message_type="DEFAULT", **a)  # fmt: skip
    s.emit("y", t + 1.01, "delivered", control, seq=1, queue="Q", **a)
    last = s.emit("x2", t + 3.5, "connection_opened", pid=100, peer="y@127.0.0.7:4022")
    s.emit(
        "x2", t + 10, "started", pid=200, last_n=last, last_ts=iso_micros(t + 3.5),
        last_event="connection_opened", clean=False,
    )  # fmt: skip
    s.emit("x2", t + 10.1, "message_sent", control, pid=200, seq=4, service="//x",
           far_service="//y", message_type="DEFAULT", **a)  # fmt: skip
    s.emit("y", t + 10.11, "delivered", control, seq=4, queue="Q", **a)

    # -- a target endpoint removed after its keep, begun again by a late first message --
    t = T0 + 3000
    again = uuid.uuid4()
    known["again"] = str(again)
    target: dict[str, Any] = {"database": "db", "initiator": False}
    for instance in ("ia", "tb"):
        s.emit(instance, t, "started")
    s.emit("ia", t + 1, "dialog_begun", again, service="//i", far_service="//t", **a)
    s.emit("ia", t + 1, "message_sent", again, seq=1, service="//i", far_service="//t", **a)
    s.emit("tb", t + 2, "dialog_begun", again, service="//t", far_service="//i", **target)
    s.emit("tb", t + 2, "delivered", again, seq=1, queue="Q", **a)
    s.emit("ia", t + 2.1, "ack_received", again, through=1, acked=1, seqs="1", **a)
    s.emit("tb", t + 3, "received", again, seq=1, queue="Q", **a)
    s.emit("tb", t + 3, "dialog_ended", again, **target)  # END CONVERSATION, then removed
    s.emit("ia", t + 4, "dialog_ended", again, **a)
    # a copy of the first message, after the keep: a dialog begun again (SPEC §5)
    s.emit("tb", t + 2000, "dialog_begun", again, service="//t", far_service="//i", **target)
    s.emit("tb", t + 2000, "delivered", again, seq=1, queue="Q", **a)
    known["begun_again"] = t + 2000
    s.emit("tb", t + 2100, "connection_closed", peer="ia@127.0.0.6:4022", reason="idle")
    known["end"] = t + 2100
    s.close()
    return known


@pytest.fixture(scope="module")
def planted_analysis(
    tmp_path_factory: pytest.TempPathFactory, spark: SparkSession
) -> tuple[dict[str, Any], Analysis]:
    root = tmp_path_factory.mktemp("waits")
    known = planted(root)
    return known, analyze([root], spark=spark, progress=None, top=500)


def _longest(result: Analysis, cid: str) -> dict[int, dict[str, Any]]:
    rows = result.tables["longest_waits"].records()
    return {r["seq"]: r for r in rows if r["conversation_id"] == cid}


def test_a_refusal_of_another_brokers_connection_is_not_why_a_message_waited(
    planted_analysis: tuple[dict[str, Any], Analysis],
) -> None:
    """R-REPORT-1 (the messages that waited longest, with the reason), as R-REPORT-2 says
    it: the refused connections that explain a wait are those of the sending broker to
    the far broker (the addresses the sending endpoint sent to or was routed to). Refusals
    of a connection to another broker while the message waited explain nothing of it; the
    same refusals toward its own far broker do."""
    known, result = planted_analysis
    elsewhere = _longest(result, known["elsewhere"])[1]
    assert "refused" not in elsewhere["reason"], elsewhere
    far = _longest(result, known["far"])[1]
    assert "3 connection(s) refused" in far["reason"], far


def test_a_lost_message_whose_receiver_crashed_after_delivering_it_is_unknown(
    planted_analysis: tuple[dict[str, Any], Analysis],
) -> None:
    """R-TRACE-2 (R-DLG-5): a message acknowledged and never shown delivered is ``lost``
    unless a crash window of its receiver could hide the delivery. The receiver crashed
    between delivering it (and acknowledging it at the commit) and its trace flush; after
    its restart its only trace of the stream is the resent copy, a duplicate it
    acknowledged again. That is the receiver of the stream, its window covers the time
    between the SEND and the acknowledgement, and the finding is ``unknown: trace
    missing``, naming that receiver, not a violation."""
    known, result = planted_analysis
    found = [v for v in result.audit.violations if v["conversation_id"] == known["crashed"]]
    assert found == [], found
    (unknown,) = [u for u in result.audit.unknowns if u["conversation_id"] == known["crashed"]]
    assert (unknown["missing"], unknown["seq"]) == ("lost", 1), unknown
    assert (unknown["sender"], unknown["receiver"]) == ("s", "r"), unknown
    assert "r#2" in unknown["evidence"] and "r#3" in unknown["evidence"], unknown


def test_a_delayed_period_after_a_message_left_is_not_why_it_waited(
    planted_analysis: tuple[dict[str, Any], Analysis],
) -> None:
    """R-REPORT-1 (the messages that waited longest, with the reason; R-ROUTE-13): the
    DELAYED time a message's reason names is the conversation's DELAYED time while that
    message waited to leave. The conversation was DELAYED for 300 s after its first
    message had left, from a second before its second message's SEND: the first
    message's reason names no DELAYED time, the second's the 299 s it waited DELAYED."""
    known, result = planted_analysis
    rows = _longest(result, known["later"])
    assert "DELAYED" not in rows[1]["reason"], rows[1]
    assert "DELAYED 299.000 s: no route" in rows[2]["reason"], rows[2]


def test_messages_whose_discard_died_in_the_senders_crash_window_are_unknown(
    planted_analysis: tuple[dict[str, Any], Analysis],
) -> None:
    """R-TRACE-2, R-DLG-10: seqs 2 and 3 were never delivered though seq 4 was: a ``gap``,
    unless the event that accounts for them could be in a crash window. Here the sender
    ended the dialog WITH ERROR (its pending messages discarded, the Error sent after
    them) and was killed before its trace flush: the ``discarded`` event, durable and
    told to nobody, died in the sender's crash window, as did the Error's SEND. The
    traces cannot say: both findings are ``unknown: trace missing``, not violations. When
    the message after the gap is an application's message whose SEND is traced, no END
    discarded what came before it, and the gap stays a violation."""
    known, result = planted_analysis
    found = [v for v in result.audit.violations if v["conversation_id"] == known["ended"]]
    assert found == [], found
    unknown = [u for u in result.audit.unknowns if u["conversation_id"] == known["ended"]]
    assert sorted((u["missing"], u["seq"], u["last_seq"]) for u in unknown) == [
        ("gap", 2, 3),
        ("unsent", 4, 4),
    ], unknown
    for u in unknown:
        assert (u["sender"], u["receiver"]) == ("x", "y"), u
        assert "x#8" in u["evidence"] and "x#9" in u["evidence"], u
    control = [v for v in result.audit.violations if v["conversation_id"] == known["control"]]
    assert [(v["kind"], v["seq"], v["last_seq"]) for v in control] == [("gap", 2, 3)], control


def test_an_endpoint_begun_again_after_it_ended_is_open(
    planted_analysis: tuple[dict[str, Any], Analysis],
) -> None:
    """R-REPORT-1, SPEC §5: a target's closed endpoint is removed after its keep, and a
    copy of the dialog's first message arriving after that begins the dialog again there,
    under the same conversation id. That endpoint is open (begun, never ended since), and
    the endpoints open longest list it, its age counted from its new beginning; the
    message it delivered again is a duplicate (R-DLG-4)."""
    known, result = planted_analysis
    rows = [
        r
        for r in result.tables["open_endpoints"].records()
        if r["conversation_id"] == known["again"]
    ]
    assert [(r["initiator"], r["instance"]) for r in rows] == [(False, "tb")], rows
    assert rows[0]["age_seconds"] == pytest.approx(known["end"] - known["begun_again"]), rows
    assert rows[0]["messages_not_received"] == 1, rows
    found = [v for v in result.audit.violations if v["conversation_id"] == known["again"]]
    assert [(v["kind"], v["seq"]) for v in found] == [("duplicate", 1)], found


def _segment(root: Path, instance: str, stamp: str, pid: int, lines: list[dict[str, Any]]) -> Path:
    path = root / f"{instance}-{stamp}-{pid}-00001.jsonl"
    path.write_text(
        "".join(json.dumps({"v": 1, "instance": instance, **line}) + "\n" for line in lines)
    )
    return path


def test_a_daemon_restarted_under_the_same_pid_is_a_new_process(tmp_path: Path) -> None:
    """R-REPORT-1: a restart is a trace segment written by a new process, and a kill a
    process whose successor's start marker says the stop was not clean. A daemon that is
    its container's first process has the same pid at every start: its segments' names
    tell its processes apart by their writer's start (each begins with a ``started``
    marker, its numbers from 1), and each of its processes is listed."""
    t = "2026-11-29T07:00:{:02d}.000000Z".format
    files = [
        _segment(tmp_path, "alpha", "20261129T070000", 1, [
            {"ts": t(0), "event": "started", "n": 1},
            {"ts": t(1), "event": "message_sent", "n": 2},
        ]),
        # killed between two writes, started again in a new container: pid 1 again
        _segment(tmp_path, "alpha", "20261129T070010", 1, [
            {"ts": t(10), "event": "started", "n": 3, "last_n": 2, "last_ts": t(1),
             "last_event": "message_sent", "clean": False},
            {"ts": t(11), "event": "stopped", "n": 4},
        ]),
        _segment(tmp_path, "alpha", "20261129T070020", 1, [
            {"ts": t(20), "event": "started", "n": 5, "last_n": 4, "last_ts": t(11),
             "last_event": "stopped", "clean": True},
            {"ts": t(21), "event": "message_sent", "n": 6},
        ]),
    ]  # fmt: skip
    found = processes(files)
    assert [(p.first_ts, p.last_ts, p.ended) for p in found] == [
        (t(0), t(1), "killed"),
        (t(10), t(11), "stopped"),
        (t(20), t(21), "running"),
    ], found
    assert restarts(found) == 2


async def test_an_error_received_before_the_waiting_messages_is_in_order(
    tmp_path: Path, spark: SparkSession
) -> None:
    """R-TRACE-2, R-DLG-1, R-DLG-10: the audit checks that each stream is received by the
    application in sequence order, with the order R-DLG-10 gives an Error: it is received
    before the dialog's waiting messages. The initiator ends its dialog WITH ERROR while
    its three messages wait, unreceived, in the target's queue; the target's application
    receives the Error (seq 4) first, then seqs 1 to 3. No message is out of order."""
    async with solo_daemon(tmp_path, HOST) as (deployment, client):
        handle = await client.begin_dialog("//solo/S1", "//solo/S2")
        for n in range(3):
            await client.send(handle, body=f"before the error {n}".encode())

        async def queued() -> bool:
            return len(await client.queue_messages("Q2")) >= 3

        await wait_until(queued)
        await client.end_conversation(handle, error_code=7, description="the order was cancelled")
        received = await client.receive("Q2", top=100, timeout=5)
        received += await client.receive("Q2", top=100, timeout=0.5)
    order = [(m.message_sequence_number, m.message_type_name) for m in received]
    assert order == [(4, ERROR), (1, "DEFAULT"), (2, "DEFAULT"), (3, "DEFAULT")], order
    traces = deployment.daemons["solo"].directory / "data" / "traces"
    result = analyze([traces], spark=spark, progress=None, top=500)
    assert result.audit.violations == [], result.audit.violations
    assert result.audit.passed
