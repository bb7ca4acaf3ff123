"""Trace files at rest with real daemons (docs/traces.md "Compaction", "Retention",
"Write errors"): closed segments compacted into Parquet and read back, a SIGKILL leaving the
open segment readable (R-TRACE-1), retention by size and age that never deletes the open
segment, files 0600 in a 0700 directory (R-TRACE-3), and a full trace disk that never
stops delivery (R-TRACE-4)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import pytest

from brokerd.tools.launcher import Deployment
from brokerd.traces.names import latest_names
from brokerd.traces.writer import read_events, segment_files
from tests.daemons import SOLO_DATABASE as SOLO
from tests.daemons import client_of, running, solo_broker, stats_with, wait_until
from tests.disks import fill, small_tmpfs

HOST = "127.0.0.247"


def _modes(directory: Path) -> set[int]:
    return {p.stat().st_mode & 0o777 for p in directory.iterdir()}


async def test_segments_are_private_and_compacted_and_read_back(tmp_path: Path) -> None:
    """A trace directory made 0755 by someone else is made 0700 at the start; every
    segment, open, closed or compacted, is 0600; closed segments become ``.parquet``
    that the readers read like plain ones."""
    traces = tmp_path / "traces"
    traces.mkdir(mode=0o755)
    os.chmod(traces, 0o755)
    extra = f'[trace]\ndirectory = "{traces}"\nsegment_seconds = 0.3\n'
    async with solo_broker(tmp_path, HOST, extra) as broker:
        assert traces.stat().st_mode & 0o777 == 0o700
        client = await client_of(broker)
        try:
            handle = await client.begin_dialog("//solo/S1", "//solo/S2")
            for n in range(3):
                await client.send(handle, body=f"m{n}".encode())
                await wait_until(lambda: _compacted(traces), 10)
            received = [m for _ in range(3) for m in await client.receive("Q2", timeout=5)]
            assert [m.message_body for m in received] == [b"m0", b"m1", b"m2"]
            stats = await stats_with(client, "trace_")
        finally:
            await client.close()
        assert stats["trace_segments_compacted"] >= 1
        assert _modes(traces) == {0o600}
    # the segment the stop closed is too small to be compacted then: the next start does
    # it, and so it does a closed one whose compaction (in a child, at a low priority) had
    # not ended when the stop came, on a busy machine: compacted ones first, then plain
    names = sorted(p.name for p in traces.iterdir())
    compacted = [n.endswith(".parquet") for n in names]
    assert any(compacted) and compacted == sorted(compacted, reverse=True), names
    assert names[-1].endswith(".jsonl"), names
    assert _modes(traces) == {0o600}
    events = list(read_events(segment_files([traces])))
    assert [e["n"] for e in events] == list(range(1, len(events) + 1))
    sent = [e["seq"] for e in events if e["event"] == "message_sent"]
    assert sent == [1, 2, 3]
    assert events[-1]["event"] == "stopped"


async def _compacted(traces: Path) -> bool:
    return any(p.name.endswith(".parquet") for p in traces.iterdir())


def test_a_sigkill_leaves_the_open_segment_readable_to_the_last_durable_event(
    tmp_path: Path,
) -> None:
    """A daemon killed while it writes: the open segment holds every event flushed before
    the kill (the open segment is plain JSON Lines, fsynced per flush); the restart closes and
    compacts the segment, and its ``started`` names the last event found."""
    d = Deployment(tmp_path)
    d.add("solo", HOST, SOLO, extra="[trace]\nsegment_seconds = 0.5\n")
    traces = tmp_path / "solo" / "data" / "traces"

    async def sends() -> None:
        client = await d.daemons["solo"].client()
        handle = await client.begin_dialog("//solo/S1", "//solo/S2")
        for n in range(200):
            await client.send(handle, body=b"x" * 100)
            if n == 100:  # a segment closed and compacted while the daemon runs
                await wait_until(lambda: _compacted(traces), 10)
        got = 0
        while got < 200:
            got += len(await client.receive("Q2", timeout=5, top=200))
        await client.close()
        await asyncio.sleep(0.6)  # three flushes: every event emitted is written

    with running(d):
        asyncio.run(sends())
        assert any(p.name.endswith(".parquet") for p in traces.iterdir())  # closed ones
        d.kill("solo")
        left_open = list(traces.glob("*.jsonl.open"))
        events = list(read_events(segment_files([traces])))
        sent = [e["seq"] for e in events if e["event"] == "message_sent"]
        received = [e["seq"] for e in events if e["event"] == "received"]
        assert sent == list(range(1, 201)) and sorted(received) == sent
        last = events[-1]
        d.start("solo")
        assert not any(p.exists() for p in left_open)
        restarted = [e for e in read_events(segment_files([traces])) if e["event"] == "started"][-1]
        assert restarted["clean"] is False and restarted["last_n"] == last["n"]
    assert not list(traces.glob("*.jsonl.open"))


async def test_retention_deletes_the_oldest_closed_segments_never_the_open_one(
    tmp_path: Path,
) -> None:
    """Segments older than ``max_age_hours`` go, then the oldest while this instance's
    segments exceed ``max_total_mb``; another instance's files and the open segment stay."""
    traces = tmp_path / "traces"
    traces.mkdir(mode=0o700)
    now = time.time()

    def segment(name: str, size: int, hours_ago: float) -> Path:
        path = traces / name
        path.write_bytes(os.urandom(size))
        os.utime(path, (now - hours_ago * 3600, now - hours_ago * 3600))
        return path

    ancient = segment("solo-20260101T000000-1-00001.jsonl.gz", 1000, 50)
    older = segment("solo-20261101T000000-1-00001.parquet", 700_000, 3)
    newer = segment("solo-20261102T000000-1-00001.jsonl.gz", 700_000, 2)
    foreign = segment("other-20260101T000000-1-00001.jsonl.gz", 1000, 50)
    extra = f'[trace]\ndirectory = "{traces}"\nmax_total_mb = 1\nmax_age_hours = 24\n'
    async with solo_broker(tmp_path, HOST, extra) as broker:
        client = await client_of(broker)
        try:

            async def tidied() -> bool:
                stats = await stats_with(client, "trace_segments_deleted")
                return bool(stats["trace_segments_deleted"] == 2)

            await wait_until(tidied, 10)
        finally:
            await client.close()
        assert not ancient.exists() and not older.exists()
        assert newer.exists() and foreign.exists()
        (opened,) = traces.glob("solo-*.jsonl.open")  # counted, never deleted
        assert opened.stat().st_size > 0


async def test_a_full_trace_disk_never_stops_delivery(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With the trace directory on a full tmpfs, SENDs and RECEIVEs go on (the durability
    barrier does not wait for a write that failed); the dropped events are counted and
    logged once; once there is room the trace says so with ``trace_resumed``, naming the
    last event written before, and the numbers skip the dropped lines."""
    caplog.set_level(logging.ERROR, "brokerd.traces.writer")
    with small_tmpfs(tmp_path / "traces", "512k") as traces:
        extra = f'[trace]\ndirectory = "{traces}"\nflush_interval = 0.05\n'
        async with solo_broker(tmp_path / "daemon", HOST, extra) as broker:
            client = await client_of(broker)
            try:
                handle = await client.begin_dialog("//solo/S1", "//solo/S2")
                await client.send(handle, body=b"before")
                await client.receive("Q2", timeout=5)
                filler = fill(traces)
                for n in range(50):
                    await client.send(handle, body=f"full {n}".encode() * 20)
                got = [m for _ in range(50) for m in await client.receive("Q2", timeout=5)]
                assert len(got) == 50  # delivery went on
                full = await stats_with(client, "trace_")
                assert full["trace_events_lost"] > 0 and full["trace_write_failures"] >= 1
                filler.unlink()
                await client.send(handle, body=b"after")
                await client.receive("Q2", timeout=5)

                async def resumed() -> bool:
                    stats = await stats_with(client, "trace_incomplete")
                    return stats["trace_incomplete"] is False

                await wait_until(resumed, 10)
                final = await stats_with(client, "trace_")
            finally:
                await client.close()
        events = list(read_events(segment_files([traces])))
    markers = [e for e in events if e["event"] == "trace_resumed"]
    # One episode of failing writes per marker (a write that fits in a page the segment
    # already holds may end one early), each logged once.
    errors = [r for r in caplog.records if r.getMessage().startswith("cannot write trace")]
    assert len(markers) == final["trace_write_failures"] == len(errors) >= 1
    assert sum(m["dropped"] for m in markers) == final["trace_events_lost"]
    for marker in markers:
        before = events[events.index(marker) - 1]
        assert marker["last_n"] == before["n"] and marker["last_event"] == before["event"]
        assert marker["n"] > before["n"] + marker["dropped"]  # the dropped lines' numbers
        assert "No space left" in marker["reason"]
    sent = [e["seq"] for e in events if e["event"] == "message_sent"]
    assert sent[0] == 1 and sent[-1] == 52 and len(sent) < 52, sent  # the window is missing


def test_a_segment_closed_while_the_segments_are_listed_is_listed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-TRACE-3: a reader of a running daemon's traces (``brokerd analyze``, the process
    list) lists its segments by name while the daemon closes and compacts them. An open
    segment closed between two looks of the listing is found under one of its names and
    read once; a listing of one segment's three names keeps the latest."""
    open_segment = tmp_path / "alpha-20261201T220000-7-00001.jsonl.open"
    open_segment.write_text(
        '{"v":1,"instance":"alpha","ts":"2026-12-01T22:00:00.000000Z","event":"started","n":1}\n'
    )
    closed = open_segment.with_name("alpha-20261201T220000-7-00001.jsonl")
    looks: list[str] = []
    rglob = Path.rglob

    def closing_after_the_first_look(self: Path, pattern: str) -> object:
        found = list(rglob(self, pattern))
        looks.append(pattern)
        if len(looks) == 1:
            open_segment.rename(closed)  # the daemon's rotation, between two looks
        return iter(found)

    monkeypatch.setattr(Path, "rglob", closing_after_the_first_look)
    listed = segment_files([tmp_path])
    monkeypatch.undo()
    assert listed == [closed]
    assert [e["event"] for e in read_events(listed)] == ["started"]
    stem = tmp_path / "beta-20261201T220000-8-00001"
    names = [stem.with_name(stem.name + s) for s in (".jsonl.open", ".jsonl", ".parquet")]
    assert latest_names(names) == [names[2]]
    assert latest_names(names[:2]) == [names[1]]
