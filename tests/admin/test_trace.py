"""``brokerctl trace`` (brokerd/admin/trace.py): one message followed across two real
daemons' trace files, without Spark and with no daemon running.

alpha (the shop, 127.0.0.143) sends one order to beta (the warehouse, 127.0.0.144), which
RECEIVEs it; both daemons are stopped (their segments closed), then ``brokerctl trace``
reads the segments through the daemons' configuration files and through their trace
folders. The output names both brokers and the message's events in the order of its life
(docs/traces.md "The life of one message"): SEND, transmission queue, fragment sent,
received, delivered (R-DLG-5: acknowledged once stored), acknowledgement back at the
sender. A conversation the traces do not hold, an id that is not one, and a message the
conversation does not have each give one clear line and exit status 2. Reading is bounded:
an over-long line and a torn tail are skipped.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from brokerd.admin import trace
from brokerd.admin.ctl import main
from brokerd.config import TraceConfig
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from brokerd.traces.writer import TraceWriter
from tests.daemons import FAST_RETRY, drain, running, wait_until

HOSTS = ("127.0.0.143", "127.0.0.144")
LIFE = ("message_sent", "enqueued", "fragment_sent", "fragment_received", "delivered")


async def _one_order(root: Path) -> tuple[Deployment, str]:
    d = shop_and_warehouse(root, FAST_RETRY, hosts=HOSTS)
    with running(d):
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(handle, ORDER, b"<order>1</order>")
        await drain(warehouse, "OrderQueue", 1)

        async def acknowledged() -> bool:
            return not await shop.transmission_queue()

        await wait_until(acknowledged, 20)
        (endpoint,) = await warehouse.view("conversation_endpoints")
        await shop.close()
        await warehouse.close()
    return d, str(endpoint["conversation_id"])


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


Lines = list[tuple[float, str, dict[str, object]]]
"""A segment's events by hand: (seconds after :data:`T0`, event, fields)."""
T0 = 1_795_000_000.0


def write_segment(root: Path, cid: str, instance: str, lines: Lines) -> None:
    """``instance``'s one segment under ``root / instance``: ``lines`` in the writer's
    format, every event but a connection's of conversation ``cid``."""

    def at(seconds: float) -> str:
        return datetime.fromtimestamp(T0 + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    folder = root / instance
    folder.mkdir()
    (folder / f"{instance}-20261129T070000-1-00001.jsonl").write_text(
        "".join(
            json.dumps(
                {"v": 1, "instance": instance, "ts": at(s), "event": e}
                | ({} if e.startswith("connection") else {"conversation_id": cid})
                | f
            )
            + "\n"
            for s, e, f in lines
        )
    )


async def test_one_message_across_two_daemons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d, conversation = await _one_order(tmp_path)
    configs = [str(d.daemons[name].config_path) for name in ("alpha", "beta")]

    status, out, err = _run(
        capsys, "trace", conversation, "1", "--config", configs[0], "--config", configs[1]
    )
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"conversation {conversation} message 1 (sent by the initiator)")
    assert "alpha -> beta" in lines[0]
    # a step's line starts with its time (the summary line may start with "20.2 ms")
    steps = [line.split() for line in lines[1:] if re.match(r"  \d{4}-\d\d-\d\dT", line)]
    events = [next(w for w in words if w in trace.STAGE) for words in steps]
    brokers = [next(w for w in words if w in ("alpha", "beta")) for words in steps]
    assert set(brokers) == {"alpha", "beta"} and brokers[0] == "alpha"
    assert [e for e in events if e in LIFE] == list(LIFE)  # in the order of its life
    assert events.index("ack_received") > events.index("delivered")
    assert "on the network from alpha" in out
    assert "SEND to delivery" in out and "longest wait" in out

    # the same from the trace folders, as JSON: every step timed and explained
    folders = [str(d.daemons[name].directory / "data" / "traces") for name in ("alpha", "beta")]
    status, out, err = _run(
        capsys, "trace", conversation, "--traces", folders[0], "--traces", folders[1], "--json"
    )
    assert status == 0, err
    (path,) = json.loads(out)  # one message in the conversation: the order
    assert (path["initiator"], path["seq"]) == (True, 1)
    assert path["brokers"] == ["alpha", "beta"]
    assert all(s["wait_seconds"] >= 0 and s["why"] for s in path["steps"])
    timestamps = [s["ts"] for s in path["steps"]]
    assert timestamps == sorted(timestamps)

    # what the traces do not hold: one clear line, status 2
    unknown = str(uuid.uuid4())
    status, _, err = _run(capsys, "trace", unknown, "--config", configs[0], "--config", configs[1])
    assert status == 2
    assert f"conversation {unknown}: no trace event in" in err and err[-1] == "\n"
    assert err.count("\n") == 1
    status, _, err = _run(capsys, "trace", "not-a-conversation", "--traces", folders[0])
    assert status == 2 and "is not a conversation id" in err
    status, _, err = _run(capsys, "trace", conversation, "7", "--traces", folders[0])
    assert status == 2 and "no message 7 in the traces (it has messages 1..1)" in err
    status, _, err = _run(capsys, "trace", conversation)  # nowhere to read
    assert status == 2 and "--traces DIR or --config FILE" in err


def test_over_long_and_torn_lines_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(trace, "MAX_LINE", 400)
    cid = str(uuid.uuid4())

    def line(event: str, ts: str, **fields: object) -> str:
        return json.dumps(
            {"v": 1, "instance": "a", "ts": ts, "event": event, "conversation_id": cid, **fields}
        )

    segment = tmp_path / "a-20261129T070000-1-00001.jsonl"
    segment.write_text(
        line("message_sent", "2026-11-29T07:00:00.000000Z", initiator=True, seq=1)
        + "\n"
        + line("enqueued", "2026-11-29T07:00:00.100000Z", initiator=True, seq=1, pad="x" * 900)
        + "\n"
        + line("enqueued", "2026-11-29T07:00:00.200000Z", initiator=True, seq=1)
        + "\n"
        + line("delivered", "2026-11-29T07:00:00.300000Z", initiator=True, seq=1)[:40]
    )
    damaged = tmp_path / "a-20261129T060000-1-00001.parquet"  # a compacted file, damaged
    damaged.write_bytes(b"PAR1 not a parquet file")
    events = trace.read_conversation([damaged, segment], uuid.UUID(cid)).events
    assert [(e.name, e.ts) for e in events] == [
        ("message_sent", "2026-11-29T07:00:00.000000Z"),
        ("enqueued", "2026-11-29T07:00:00.200000Z"),
    ]
    assert "a line of 1,0" in capsys.readouterr().err  # the long one of the conversation, said
    with pytest.raises(trace.TraceNotFound, match="more than 1 trace events"):
        trace.read_conversation([segment], uuid.UUID(cid), limit=1)


def test_every_wait_has_its_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A message sent while its conversation was DELAYED (R-ROUTE-13), sent once a route
    appeared while the far broker refused connections, retransmitted after a lost
    acknowledgement (R-DLG-6), relayed by a forwarder (R-ROUTE-7), delivered and RECEIVEd:
    each wait is named by what the traces say of it, and the conversation's routing after
    the message was acknowledged is not part of its path."""
    cid = str(uuid.uuid4())

    m = {"initiator": True, "seq": 1}
    write_segment(
        tmp_path,
        cid,
        "a",
        [
            (0.0, "delayed", {"initiator": True, "reason": "no route to service '//b'"}),
            (0.5, "message_sent", m),
            (0.5001, "enqueued", m),
            (2.0, "released", {"initiator": True}),
            (2.2, "connection_refused", {"peer": "tcp://f:4022", "reason": "refused"}),
            (2.0001, "route_chosen", {"initiator": True, "route": "R", "address": "tcp://f:4022"}),
            (2.5, "fragment_sent", {**m, "attempt": 1, "peer": "tcp://f:4022"}),
            (4.5, "retransmission", {**m, "attempt": 2, "wait": 4.0}),
            (4.5001, "fragment_sent", {**m, "attempt": 2, "peer": "tcp://f:4022"}),
            (4.6, "ack_received", {"initiator": True, "through": 1, "seqs": "1"}),
            # long after: the conversation's later messages wait, not this one
            (60.0, "delayed", {"initiator": True, "reason": "the route was dropped later"}),
        ],
    )
    write_segment(
        tmp_path,
        cid,
        "f",
        [
            (2.51, "fragment_received", {**m, "peer": "a@h:1", "hop": 0}),
            (2.52, "forwarded", {**m, "hop": 1, "address": "tcp://b:4022"}),
        ],
    )
    write_segment(
        tmp_path,
        cid,
        "b",
        [
            (2.53, "fragment_received", {**m, "peer": "f@h:2", "hop": 1}),
            (2.54, "delivered", {**m, "queue": "Q"}),
            (4.51, "duplicate", m),
            (9.0, "received", {**m, "queue": "Q"}),
        ],
    )
    status, out, err = _run(capsys, "trace", cid, "1", "--traces", str(tmp_path))
    assert status == 0, err
    why = {}
    for line in out.splitlines()[1:]:
        words = line.split()
        name = next((w for w in words if w in trace.STAGE), None)
        if name is not None:
            why.setdefault(name, line)
    assert "sent while the conversation was DELAYED" in why["delayed"]
    assert "DELAYED until a route was found" in why["released"]
    assert "the far broker could not be reached (1 connection(s) refused" in why["fragment_sent"]
    assert "retry wait" in why["retransmission"]
    assert "held by the forwarder f (hop 1)" in why["forwarded"]
    assert "acknowledgement was lost or late" in why["duplicate"]
    assert "RECEIVE" in why["received"] and "+4.400 s" in why["received"]
    assert "message 1 (sent by the initiator): a -> f -> b" in out
    assert "longest wait 4.400 s before received on b" in out
    assert "dropped later" not in out  # routing after its acknowledgement is not its path


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "compacted"])
async def test_a_line_as_long_as_the_writer_writes_is_read(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    compress: bool,
) -> None:
    """R-REPORT-2: the writer's lines have no length of their own: a ``discarded`` event
    lists every message the END CONVERSATION WITH ERROR removed (here 300,000, a line of
    about 2 MB). brokerctl trace reads it, from a plain segment and from one the stop
    compacted, and the message's path ends with it; an unrelated line as long is skipped
    without a word."""
    cid = uuid.uuid4()
    config = TraceConfig(directory=tmp_path / "alpha", compress=compress)
    writer = TraceWriter(config, "alpha")
    await writer.start()
    writer.emit("message_sent", cid, initiator=True, seq=1, size=3)
    writer.emit("enqueued", cid, initiator=True, seq=1)
    other = ",".join(map(str, range(1, 300_001)))
    writer.emit("discarded", uuid.uuid4(), initiator=True, seqs=other, reason="not this one")
    seqs = ",".join(map(str, range(1, 300_001)))
    writer.emit("discarded", cid, initiator=True, seqs=seqs, reason="ended with error")
    await writer.stop()
    assert any(p.name.endswith(".parquet") for p in config.directory.iterdir()) == compress
    status, out, err = _run(capsys, "trace", str(cid), "1", "--traces", str(tmp_path))
    assert status == 0, err
    # a step's line starts with its time (the summary's "  201.8 ms from ..." does not)
    step = re.compile(r"  \d{4}-\d\d-\d\dT")
    steps = [line.split() for line in out.splitlines() if step.match(line)]
    events = [next(w for w in words if w in trace.STAGE) for words in steps]
    assert events == ["message_sent", "enqueued", "discarded"], out
    assert "discarded: ended with error" in out
    assert err == ""
    # past the longest line read whole: said, never dropped without a word
    monkeypatch.setattr(trace, "MAX_LINE", 1_000_000)
    monkeypatch.setattr(trace, "READ_PIECE", 1000)
    status, out, err = _run(capsys, "trace", str(cid), "1", "--traces", str(tmp_path))
    assert status == 0, err
    assert "discarded" not in out
    (said,) = err.splitlines()
    assert said.startswith("brokerctl trace: skipped ") and "names the conversation" in said
    assert "over 1,000,000 bytes: not read" in said
