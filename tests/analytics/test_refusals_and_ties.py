"""Why messages waited while their far broker refused connections, and the order of one
instance's events of one microsecond, on hand-written trace segments in the daemons'
format (docs/traces.md), analysed by the real Spark jobs
(``brokerd.analytics.report.analyze``) and followed by ``brokerctl trace``
(``brokerd.admin.trace.follow``), all in one trace set:

* a message sent, then retransmitted once its far broker, gone down after its first
  fragment left, accepted connections again; a second message sent while it was down
  again, still waiting at the end of the set;
* the refusals of two senders, whose reasons differ from one attempt to the next
  (attempt number, next delay, errno text);
* events of one instance written in one microsecond: an endpoint ended and begun again, a
  conversation routed twice, a message dropped twice.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from brokerd.admin.trace import follow, format_paths
from brokerd.analytics.report import Analysis, analyze
from tests.analytics.test_audit_edges import T0, Segments

FAR = "tcp://127.0.0.11:4022"
UNREACHABLE = "tcp://127.0.0.12:4022"
FIRST = "tcp://127.0.0.21:4022"
SECOND = "tcp://127.0.0.22:4022"


def _refused(attempt: int, delay: float) -> str:
    """A refusal's reason as a daemon's link writes it (brokerd/server/peer_link.py)."""
    return f"connection refused by 127.0.0.11:4022 (attempt {attempt}); next attempt in {delay:g} s"


def planted(root: Path) -> dict[str, Any]:
    s = Segments(root)
    a: dict[str, Any] = {"database": "db", "initiator": True}
    known: dict[str, Any] = {}

    # -- the far broker down after seq 1 left, and again after seq 2 left --------------
    t = T0
    down = uuid.uuid4()
    known["down"] = str(down)
    s.emit("s1", t, "started")
    s.emit("r1", t, "started")
    s.emit("s1", t + 1, "dialog_begun", down, service="//s", far_service="//r", **a)
    s.emit(
        "s1", t + 1, "route_chosen", down, service="//r", decision="network", route="R",
        step="service", address=FAR, **a,
    )  # fmt: skip
    s.emit("s1", t + 2, "message_sent", down, seq=1, service="//s", far_service="//r", **a)
    s.emit("s1", t + 2, "enqueued", down, seq=1, **a)
    s.emit(
        "s1", t + 2.001, "fragment_sent", down, seq=1, fragment=0, fragments=1, attempt=1,
        peer=FAR, route="R", **a,
    )  # fmt: skip
    s.emit("s1", t + 2.5, "connection_closed", peer=FAR, reason="closed by peer")
    # the last two in one microsecond: the later (by its number) is the latest
    for attempt, at, delay in ((1, 3, 1), (2, 4, 2), (3, 6, 4), (4, 10, 8), (5, 18, 8), (6, 18, 8)):
        s.emit("s1", t + at, "connection_refused", peer=FAR, reason=_refused(attempt, delay))
    known["latest_refusal"] = _refused(6, 8)
    s.emit("s1", t + 30, "connection_opened", peer=FAR)
    s.emit("s1", t + 30, "retransmission", down, seq=1, attempt=2, wait=4.0, peer=FAR, **a)
    s.emit(
        "s1", t + 30, "fragment_sent", down, seq=1, fragment=0, fragments=1, attempt=2,
        peer=FAR, route="R", **a,
    )  # fmt: skip
    s.emit(
        "r1", t + 30.01, "fragment_received", down, seq=1, fragment=0, fragments=1,
        peer="s1@127.0.0.1:4022", **a,
    )  # fmt: skip
    s.emit("r1", t + 30.01, "delivered", down, seq=1, queue="Q", **a)
    s.emit("r1", t + 30.01, "ack_sent", down, through=1, peer="s1@127.0.0.1:4022", **a)
    s.emit("s1", t + 30.02, "ack_received", down, through=1, acked=1, seqs="1", **a)
    s.emit("s1", t + 40, "message_sent", down, seq=2, service="//s", far_service="//r", **a)
    s.emit("s1", t + 40, "enqueued", down, seq=2, **a)
    s.emit(
        "s1", t + 40.001, "fragment_sent", down, seq=2, fragment=0, fragments=1, attempt=1,
        peer=FAR, route="R", **a,
    )  # fmt: skip
    s.emit("s1", t + 40.5, "connection_closed", peer=FAR, reason="closed by peer")
    for attempt, at, delay in ((1, 41, 1), (2, 42, 2), (3, 44, 4)):
        s.emit("s1", t + at, "connection_refused", peer=FAR, reason=_refused(attempt, delay))
    known["still_refused"] = _refused(3, 4)
    # a connection to another broker refused meanwhile explains nothing of its wait
    s.emit(
        "s1", t + 45, "connection_refused", peer="tcp://127.0.0.19:4022",
        reason="connection refused by 127.0.0.19:4022 (attempt 1); next attempt in 1 s",
    )  # fmt: skip

    # -- another sender that cannot reach its peer at all ------------------------------
    t = T0 + 500
    s.emit("s2", t, "started")
    for attempt, text in ((1, "Connect call failed ('127.0.0.12', 4022)"), (2, "No route to host"),
                          (3, "Connect call failed ('127.0.0.12', 4022)")):  # fmt: skip
        s.emit(
            "s2", t + attempt, "connection_refused", peer=UNREACHABLE,
            reason=f"cannot connect to 127.0.0.12:4022: [Errno 113] {text} (attempt {attempt}); "
            f"next attempt in {2 ** (attempt - 1)} s",
        )  # fmt: skip

    # -- an endpoint ended, then begun again in the same microsecond -------------------
    t = T0 + 1000
    again = uuid.uuid4()
    known["again"] = str(again)
    target: dict[str, Any] = {"database": "db", "initiator": False}
    s.emit("ia", t, "started")
    s.emit("tb", t, "started")
    s.emit("ia", t + 1, "dialog_begun", again, service="//i", far_service="//t", **a)
    s.emit("ia", t + 1, "message_sent", again, seq=1, service="//i", far_service="//t", **a)
    s.emit("tb", t + 2, "dialog_begun", again, service="//t", far_service="//i", **target)
    s.emit("tb", t + 2, "delivered", again, seq=1, queue="Q", **a)
    s.emit("ia", t + 2.1, "ack_received", again, through=1, acked=1, seqs="1", **a)
    s.emit("tb", t + 3, "received", again, seq=1, queue="Q", **a)
    s.emit("ia", t + 4, "dialog_ended", again, **a)
    # ended (and removed), then a late copy of the first message begins it again, and is
    # delivered again: the three in one microsecond, in this order (their numbers)
    s.emit("tb", t + 5, "dialog_ended", again, **target)
    s.emit("tb", t + 5, "dialog_begun", again, service="//t", far_service="//i", **target)
    s.emit("tb", t + 5, "delivered", again, seq=1, queue="Q", **a)
    known["begun_again"] = t + 5
    # the control: begun and ended in one microsecond, in this order: not open
    closed = uuid.uuid4()
    known["closed"] = str(closed)
    s.emit("ia", t + 6, "dialog_begun", closed, service="//i", far_service="//t", **a)
    s.emit("ia", t + 6, "dialog_ended", closed, **a)

    # -- a conversation routed twice in one microsecond; another routed once -----------
    t = T0 + 1100
    rerouted, other = uuid.uuid4(), uuid.uuid4()
    known["rerouted"], known["other"] = str(rerouted), str(other)
    s.emit("q1", t, "started")
    for cid, addresses in ((rerouted, (FIRST, SECOND)), (other, (FIRST,))):
        s.emit("q1", t + 1, "dialog_begun", cid, service="//q", far_service="//svc", **a)
        for address in addresses:  # the principal refused at once: the mirror partner
            s.emit(
                "q1", t + 1, "route_chosen", cid, service="//svc", decision="network",
                route="Mirrored", step="service", address=address, **a,
            )  # fmt: skip
        s.emit("q1", t + 2, "message_sent", cid, seq=1, service="//q", far_service="//svc", **a)
        s.emit("q1", t + 2, "enqueued", cid, seq=1, **a)

    # -- a message dropped twice in one microsecond by its receiver --------------------
    t = T0 + 1200
    dropped = uuid.uuid4()
    known["dropped"] = str(dropped)
    s.emit("ds", t, "started")
    s.emit("dr", t, "started")
    s.emit("ds", t + 1, "message_sent", dropped, seq=1, service="//ds", far_service="//dr", **a)
    s.emit(
        "ds", t + 1, "fragment_sent", dropped, seq=1, fragment=0, fragments=2, attempt=1,
        peer="tcp://127.0.0.31:4022", route="R", **a,
    )  # fmt: skip
    for fragment, reason in (
        (0, "the target queue is disabled (poison message handling)"),
        (1, "its conversation was ended by the target"),
    ):
        s.emit(
            "dr", t + 1.01, "dropped", dropped, seq=1, fragment=fragment,
            peer="ds@127.0.0.1:4022", reason=reason, **a,
        )  # fmt: skip
    known["latest_drop"] = "its conversation was ended by the target"
    s.emit("dr", t + 50, "connection_closed", peer="ds@127.0.0.1:4022", reason="idle")

    # -- a promoted mirror's file held a message it then delivered again, at once ------
    t = T0 + 1300
    promoted = uuid.uuid4()
    known["promoted"] = str(promoted)
    s.emit("p1", t, "started")
    s.emit("mm", t, "started")
    s.emit("p1", t + 1, "message_sent", promoted, seq=1, service="//p", far_service="//m", **a)
    s.emit(
        "p1", t + 1, "fragment_sent", promoted, seq=1, fragment=0, fragments=1, attempt=1,
        peer="tcp://127.0.0.41:4022", route="R", **a,
    )  # fmt: skip
    inherited = s.emit("mm", t + 2, "inherited", promoted, database="db", initiator=False,
                       sent_through=0, received_through=1)  # fmt: skip
    again = s.emit("mm", t + 2, "delivered", promoted, seq=1, queue="Q", **a)
    known["promoted_evidence"] = [f"mm#{inherited}", f"mm#{again}"]
    s.close()
    return known


@pytest.fixture(scope="module")
def planted_analysis(
    tmp_path_factory: pytest.TempPathFactory, spark: SparkSession
) -> tuple[Path, dict[str, Any], Analysis]:
    root = tmp_path_factory.mktemp("refusals")
    known = planted(root)
    return root, known, analyze([root], spark=spark, progress=None, top=500)


def _longest(result: Analysis, cid: str) -> dict[int, dict[str, Any]]:
    rows = result.tables["longest_waits"].records()
    return {r["seq"]: r for r in rows if r["conversation_id"] == cid}


def test_refusals_after_the_first_fragment_left_are_why_a_message_waited(
    planted_analysis: tuple[Path, dict[str, Any], Analysis],
) -> None:
    """R-REPORT-1 (the messages that waited longest, with the reason): a message whose
    far broker went down after its first fragment left waits on the way for the
    connection to be opened again, to be retransmitted. The refusals of connections to
    that far broker meanwhile are why, and the longest waits name them, as ``brokerctl
    trace`` names them for the same message's step: the same count, the same latest
    reason. A message still waiting at the end of the set, its far broker down again,
    names the refusals since its first fragment left, and so does ``brokerctl trace``."""
    root, known, result = planted_analysis
    rows = _longest(result, known["down"])
    reason = rows[1]["reason"]
    assert reason.startswith("on the way 28.009 s"), rows[1]
    assert f"6 connection(s) refused meanwhile ({known['latest_refusal']})" in reason, rows[1]
    assert "1 retransmission(s), 2 attempts" in reason, rows[1]

    (path,) = follow([root], known["down"], 1)
    (retransmission,) = [s for s in path.steps if s.event.name == "retransmission"]
    assert retransmission.why == (
        "waited for a connection: the far broker could not be reached "
        f"(6 connection(s) refused; {FAR}: {known['latest_refusal']})"
    ), retransmission

    waiting = rows[2]
    assert waiting["status"] == "waiting", waiting
    assert f"3 connection(s) refused meanwhile ({known['still_refused']})" in waiting["reason"]
    (path,) = follow([root], known["down"], 2)
    assert path.waiting == (
        "waiting for a connection: the far broker could not be reached "
        f"(3 connection(s) refused; {FAR}: {known['still_refused']})"
    ), path.view()
    assert f"not delivered in these traces; {path.waiting}" in format_paths(known["down"], [path])


def test_wait_reasons_count_refusals_by_their_cause(
    planted_analysis: tuple[Path, dict[str, Any], Analysis],
) -> None:
    """R-REPORT-1 (why messages waited): a refused connection's reason says what failed
    and when the link dials again, with the attempt's number, its next delay, the address
    and the system's wording of the error, which differ from one attempt to the next. The
    table counts refusals by their cause, that reason without what varies, with an
    example of the reasons it stands for (the latest): one row per cause."""
    result = planted_analysis[2]
    rows = [r for r in result.tables["wait_reasons"].records() if r["kind"] == "connection refused"]
    got = {r["reason"]: (r["where"], r["times"], r["example"]) for r in rows}
    assert got == {
        "connection refused by <address>": (
            "s1",
            10,
            "connection refused by 127.0.0.19:4022 (attempt 1); next attempt in 1 s",
        ),
        "cannot connect to <address>: [Errno 113]": (
            "s2",
            3,
            "cannot connect to 127.0.0.12:4022: [Errno 113] Connect call failed "
            "('127.0.0.12', 4022) (attempt 3); next attempt in 4 s",
        ),
    }, rows
    drops = [r for r in result.tables["wait_reasons"].records() if r["kind"] == "dropped"]
    assert len(drops) == 2 and all(r["example"] == r["reason"] for r in drops), drops


def test_an_endpoint_ended_and_begun_again_in_one_microsecond_is_open(
    planted_analysis: tuple[Path, dict[str, Any], Analysis],
) -> None:
    """R-REPORT-1, SPEC §5, docs/traces.md (``n`` orders one instance's events): an
    endpoint ended, then begun again by a late copy of the dialog's first message in the
    same microsecond, is open, its last event the delivery that followed, in the order of
    their numbers; one begun, then ended in one microsecond is not."""
    _, known, result = planted_analysis
    rows = result.tables["open_endpoints"].records()
    again = [r for r in rows if r["conversation_id"] == known["again"]]
    assert [(r["initiator"], r["instance"], r["last_event"]) for r in again] == [
        (False, "tb", "delivered")
    ], again
    assert again[0]["messages_not_received"] == 1, again
    assert [r for r in rows if r["conversation_id"] == known["closed"]] == []


def test_a_conversations_latest_route_is_its_last_numbered(
    planted_analysis: tuple[Path, dict[str, Any], Analysis],
) -> None:
    """R-REPORT-1, R-ROUTE-5, docs/traces.md (``n`` orders one instance's events): a
    conversation routed to a mirrored route's principal, then to its partner, in one
    microsecond, is routed to the partner: its message waiting to be sent shows that
    address, and the dialogs per address count it there."""
    _, known, result = planted_analysis
    (waiting,) = [
        r
        for r in result.tables["waiting_messages"].records()
        if r["conversation_id"] == known["rerouted"]
    ]
    assert waiting["address"] == SECOND, waiting
    spread = [
        (r["address"], r["dialogs"])
        for r in result.tables["route_spread"].records()
        if r["service"] == "//svc"
    ]
    assert spread == [(FIRST, 1), (SECOND, 1)], spread


def test_a_messages_latest_drop_is_its_last_numbered(
    planted_analysis: tuple[Path, dict[str, Any], Analysis],
) -> None:
    """R-REPORT-1, docs/traces.md (``n`` orders one instance's events): of two drops of a
    message in one microsecond on its receiver, the latest is the one written last, and
    its reason is the one the longest waits name."""
    _, known, result = planted_analysis
    row = _longest(result, known["dropped"])[1]
    assert f"dropped 2 time(s): {known['latest_drop']}" in row["reason"], row


def test_a_delivery_after_a_promotion_in_its_microsecond_is_a_duplicate(
    planted_analysis: tuple[Path, dict[str, Any], Analysis],
) -> None:
    """R-TRACE-5, R-DLG-4, docs/traces.md (``n`` orders one instance's events): a message
    the promoted mirror's file held in order (its ``inherited`` event) and that mirror then
    delivered again, in the same microsecond, is a duplicate: by their numbers the
    delivery came after the event."""
    _, known, result = planted_analysis
    found = [v for v in result.audit.violations if v["conversation_id"] == known["promoted"]]
    assert [(v["kind"], v["seq"], v["evidence"]) for v in found] == [
        ("duplicate", 1, known["promoted_evidence"])
    ], found
