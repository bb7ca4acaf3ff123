"""Trace files that a restart, a reader and `brokerctl trace` must get right, with real
daemons and real files: the restart marker after a crash whose last line is long
(R-TRACE-1), segments closed, compacted or damaged under the reader and a trace directory
shared by two daemons (R-TRACE-3, R-REPORT-2), and the wait a refused connection to
another broker does not explain (R-REPORT-2)."""

from __future__ import annotations

import asyncio
import gzip
import json
import uuid
from collections import Counter
from pathlib import Path

import pytest

from brokerd.admin import trace
from brokerd.admin.ctl import main
from brokerd.config import TraceConfig
from brokerd.sdk.client import BrokerClient
from brokerd.tools.launcher import Deployment
from brokerd.traces.last_event import TAIL_BYTES
from brokerd.traces.writer import TraceWriter, read_events, segment_files
from protocol.errors import TransactionRolledBack
from tests.daemons import (
    FAST_RETRY,
    SOLO_DATABASE,
    client_of,
    in_process,
    running,
    solo_broker,
    wait_until,
)

HOST = "127.0.0.217"
ALPHA, BETA, GAMMA = "127.0.0.218", "127.0.0.219", "127.0.0.220"
"""GAMMA: an address nothing listens on (its connections are refused)."""


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


async def _conversation_id(client: BrokerClient) -> str:
    endpoints = await client.view("conversation_endpoints")
    return str(endpoints[0]["conversation_id"])


async def test_a_restart_names_a_last_event_longer_than_the_tail_it_reads(tmp_path: Path) -> None:
    """R-TRACE-1: a start writes ``started`` naming the last whole event on disk, and every
    ``n`` goes on from it. The last event before a SIGKILL may be a long line (a
    ``discarded`` listing the 15,000 messages an END CONVERSATION WITH ERROR removed):
    the restart must still name it, not an older one or none, and must not number its
    own lines from 1 again."""
    config = TraceConfig(directory=tmp_path, compress=False)
    crashed = TraceWriter(config, "alpha")
    await crashed.start()
    seqs = ",".join(str(n) for n in range(1, 15_001))
    assert len(seqs) > TAIL_BYTES
    crashed.emit(
        "discarded",
        uuid.uuid4(),
        database="shop",
        initiator=True,
        seqs=seqs,
        reason="END CONVERSATION WITH ERROR",
    )
    await crashed.flush()  # on disk (fsynced); then the process is killed: no stop
    later = TraceWriter(config, "alpha")
    await later.start()
    await later.stop()
    events = list(read_events(segment_files([tmp_path])))
    assert [e["event"] for e in events] == ["started", "discarded", "started", "stopped"]
    restart = events[2]
    assert restart.get("last_n") == events[1]["n"] == 2, restart
    assert restart.get("last_event") == "discarded" and restart["clean"] is False, restart
    assert [e["n"] for e in events] == [1, 2, 3, 4]


async def test_trace_reads_a_segment_closed_and_compacted_after_it_was_listed(
    tmp_path: Path,
) -> None:
    """R-TRACE-3, R-REPORT-2: ``brokerctl trace`` reads the segments of running daemons,
    whose open segment is closed and compacted in the background while the command reads
    (it lists the segments, then reads them one by one). A segment listed as
    ``.jsonl.open`` and then closed and compacted into ``.parquet`` holds the same events:
    they are read from where the segment went, not lost, and the command does not fail."""
    traces = tmp_path / "traces"
    extra = f'[trace]\ndirectory = "{traces}"\nsegment_seconds = 2.0\nflush_interval = 0.05\n'
    async with solo_broker(tmp_path / "daemon", HOST, extra) as broker:
        client = await client_of(broker)
        try:
            handle = await client.begin_dialog("//solo/S1", "//solo/S2")
            await client.send(handle, body=b"one")
            assert len(await client.receive("Q2", timeout=5)) == 1  # its events are on disk
            conversation = uuid.UUID(await _conversation_id(client))
            listed = trace.segments([traces])
            assert any(p.name.endswith(".jsonl.open") for p in listed), listed
            plain = [p for p in listed if not p.name.endswith(".parquet")]

            async def moved() -> bool:  # closed when 2 s old, then compacted
                return not any(p.exists() for p in plain)

            await wait_until(moved, 30)
        finally:
            await client.close()
    read = trace.read_conversation(listed, conversation)
    names = [e.name for e in read.events]
    assert {"dialog_begun", "message_sent", "delivered", "received"} <= set(names), names
    again = trace.read_conversation(trace.segments([traces]), conversation)
    assert [(e.instance, e.fields["n"]) for e in read.events] == [
        (e.instance, e.fields["n"]) for e in again.events
    ]


async def test_trace_names_a_damaged_gzip_segment_and_reads_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-TRACE-3, R-REPORT-2: segments compacted into gzip by earlier versions are still
    read; one cut short (its compression damaged) is named and left out, as a damaged
    ``.parquet`` is, and the others are read: the command does not end in a traceback."""
    traces = tmp_path / "traces"
    extra = f'[trace]\ndirectory = "{traces}"\ncompress = false\n'
    async with solo_broker(tmp_path / "daemon", HOST, extra) as broker:
        client = await client_of(broker)
        try:
            handle = await client.begin_dialog("//solo/S1", "//solo/S2")
            await client.send(handle, body=b"one")
            conversation = await _conversation_id(client)
        finally:
            await client.close()
    (first,) = list(traces.glob("*.jsonl"))
    # an earlier version's compaction of the first run's segment, damaged on disk since
    packed = gzip.compress(first.read_bytes())
    damaged = first.with_name(first.name + ".gz")
    damaged.write_bytes(packed[: len(packed) // 2])
    damaged.chmod(0o600)
    first.unlink()
    async with solo_broker(tmp_path / "daemon", HOST, extra) as broker:
        client = await client_of(broker)
        try:
            await client.send(handle, body=b"two")
            assert len(await client.receive("Q2", timeout=5, top=2)) >= 1
        finally:
            await client.close()
    status, out, err = _run(capsys, "trace", conversation, "2", "--traces", str(traces))
    assert status == 0, err
    assert out.startswith(f"conversation {conversation} message 2 "), out
    assert damaged.name in err, err


def test_trace_reads_a_directory_two_daemons_share_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-REPORT-2, R-TRACE-3: two daemons may share a trace directory (each keeps to its own
    files), named in each configuration relative to it (``directory = "../traces"``).
    ``brokerctl trace --config alpha --config beta`` reads that directory once: every step
    of the path once, not twice."""
    d = Deployment(tmp_path)
    shared = '[trace]\ndirectory = "../traces"\n'
    d.add("alpha", ALPHA, SOLO_DATABASE, extra=shared)
    d.add("beta", BETA, SOLO_DATABASE, extra=shared)

    async def dialog() -> str:
        client = await d.daemons["alpha"].client()
        try:
            handle = await client.begin_dialog("//solo/S1", "//solo/S2")
            await client.send(handle, body=b"one")
            assert len(await client.receive("Q2", timeout=5)) == 1
            return await _conversation_id(client)
        finally:
            await client.close()

    with running(d, "alpha"):
        conversation = asyncio.run(dialog())
    configs = [str(d.daemons[name].config_path) for name in ("alpha", "beta")]
    status, out, err = _run(
        capsys, "trace", conversation, "1", "--config", configs[0], "--config", configs[1], "--json"
    )
    assert status == 0, err
    (path,) = json.loads(out)
    steps = Counter((s["broker"], s["n"]) for s in path["steps"])
    assert [step for step, count in steps.items() if count > 1] == [], path["steps"]
    assert [s["event"] for s in path["steps"]].count("message_sent") == 1


ROUTES = f"""
[[database.route]]
name = "ToBeta"
remote_service_name = "//far/Nobody"
address = "tcp://{BETA}:4022"
[[database.route]]
name = "ToGamma"
remote_service_name = "//far/Gone"
address = "tcp://{GAMMA}:4022"
"""


def test_a_wait_is_not_blamed_on_refused_connections_to_another_broker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-REPORT-2: a wait is explained by the refused connections *to the far broker*
    during it. alpha sends one message to beta, which is up but has no such service: it
    drops the message, not acknowledged (R-ROUTE-13), and alpha retransmits it (R-DLG-6).
    Meanwhile alpha's connections to gamma, for another conversation, are refused. The
    retransmissions to beta waited for an acknowledgement; gamma's refusals are not why."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("alpha", ALPHA, SOLO_DATABASE + ROUTES)
    d.add("beta", BETA, SOLO_DATABASE)

    async def dialogs() -> str:
        client = await d.daemons["alpha"].client()
        try:
            elsewhere = await client.begin_dialog("//solo/S1", "//far/Gone")
            await client.send(elsewhere, body=b"to gamma")
            handle = await client.begin_dialog("//solo/S1", "//far/Nobody")
            await client.send(handle, body=b"to beta")
            await asyncio.sleep(6)  # several retransmissions, several refusals
            endpoints = await client.view("conversation_endpoints")
            (ours,) = [e for e in endpoints if e["far_service"] == "//far/Nobody"]
            return str(ours["conversation_id"])
        finally:
            await client.close()

    with running(d, "beta", "alpha"):
        conversation = asyncio.run(dialogs())
    folders = [d.daemons[name].directory / "data" / "traces" for name in ("alpha", "beta")]
    refused = [
        e
        for e in read_events(segment_files(folders))
        if e["event"] == "connection_refused" and e["instance"] == "alpha"
    ]
    assert refused and {e["peer"] for e in refused} == {f"tcp://{GAMMA}:4022"}
    status, out, err = _run(
        capsys,
        "trace",
        conversation,
        "1",
        "--traces",
        str(folders[0]),
        "--traces",
        str(folders[1]),
        "--json",
    )
    assert status == 0, err
    (path,) = json.loads(out)
    steps = path["steps"]
    assert "retransmission" in [s["event"] for s in steps], steps
    blamed = [s for s in steps if GAMMA in s["why"] or "could not be reached" in s["why"]]
    assert blamed == [], blamed
    for step in steps:
        if step["event"] == "retransmission":
            assert step["why"] == "no acknowledgement came within the retry wait", step


async def test_a_send_rolled_back_with_its_transaction_leaves_no_message_sent(
    tmp_path: Path,
) -> None:
    """R-TRACE-1 (docs/traces.md: ``message_sent``, "SEND by the application committed"):
    a client transaction's SENDs take effect at COMMIT, all of them or none (SPEC §6).
    A transaction SENDs on dialog A, then on dialog B, which another connection ends
    before the COMMIT: the COMMIT refuses B's SEND and rolls everything back, A's number
    is given back, and the next SEND on A is message 1. The trace must hold one
    ``message_sent`` of A's message 1, the committed one, not also the rolled-back one."""
    traces = tmp_path / "traces"
    extra = f'[trace]\ndirectory = "{traces}"\ncompress = false\n'
    async with solo_broker(tmp_path / "daemon", HOST, extra) as broker:
        client = await client_of(broker)
        other = await client_of(broker)
        try:
            a = await client.begin_dialog("//solo/S1", "//solo/S2")
            b = await client.begin_dialog("//solo/S1", "//solo/S2")
            tx = await client.begin_transaction()
            await tx.send(a, body=b"rolled back")
            await tx.send(b, body=b"refused at the commit")
            await other.end_conversation(b.handle)
            with pytest.raises(TransactionRolledBack):
                await tx.commit()
            assert await client.send(a, body=b"committed") == 1
            bodies: list[bytes] = []
            for _ in range(2):  # one conversation group a RECEIVE: B's EndDialog, A's
                bodies += [m.message_body for m in await client.receive("Q2", timeout=5)]
            assert [body for body in bodies if body] == [b"committed"]
            rows = await client.view("conversation_endpoints")
            (conversation,) = {
                str(r["conversation_id"])
                for r in rows
                if str(r["conversation_handle"]) == str(a.handle)
            }
        finally:
            await client.close()
            await other.close()
    sent = [
        (e["seq"], e["size"])
        for e in read_events(segment_files([traces]))
        if e["event"] == "message_sent" and e.get("conversation_id") == conversation
    ]
    assert sent == [(1, len(b"committed"))], sent


async def test_an_end_with_error_rolled_back_with_its_transaction_discards_nothing(
    tmp_path: Path,
) -> None:
    """R-TRACE-1, R-TRACE-2 (``discarded``: messages removed unacknowledged from the
    transmission queue by their own side): a client transaction ENDs dialog X WITH
    ERROR while X's three messages wait in the transmission queue (their broker, gamma,
    cannot be reached), then SENDs on dialog B, which another connection ends before the
    COMMIT: everything is rolled back and X's messages stay in the transmission queue. The
    trace must not say they were discarded (the audit would stop expecting them)."""
    traces = tmp_path / "traces"
    extra = f'[trace]\ndirectory = "{traces}"\ncompress = false\n'
    daemon = Deployment(tmp_path / "daemon").add("solo", HOST, SOLO_DATABASE + ROUTES, extra=extra)
    async with in_process(daemon.config_path) as broker:
        client = await client_of(broker)
        other = await client_of(broker)
        try:
            x = await client.begin_dialog("//solo/S1", "//far/Gone")
            for n in range(3):
                await client.send(x, body=f"m{n}".encode())
            b = await client.begin_dialog("//solo/S1", "//solo/S2")
            tx = await client.begin_transaction()
            await tx.end_conversation(x, error_code=50_000, description="given up")
            await tx.send(b, body=b"refused at the commit")
            await other.end_conversation(b.handle)
            with pytest.raises(TransactionRolledBack):
                await tx.commit()
            waiting = [
                row.message_sequence_number
                for row in await client.transmission_queue()
                if row.conversation_handle == x.handle
            ]
            assert sorted(waiting) == [1, 2, 3]
            rows = await client.view("conversation_endpoints")
            (conversation,) = {
                str(r["conversation_id"])
                for r in rows
                if str(r["conversation_handle"]) == str(x.handle)
            }
        finally:
            await client.close()
            await other.close()
    discarded = [
        e
        for e in read_events(segment_files([traces]))
        if e["event"] == "discarded" and e.get("conversation_id") == conversation
    ]
    assert discarded == [], discarded
