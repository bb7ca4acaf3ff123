"""Delivery traces at rest and across starts, and `brokerctl trace`, with real daemons and
real files (docs/traces.md "Files", "Retention", "Write errors", "Following one message";
R-TRACE-1, R-TRACE-3, R-TRACE-4, R-REPORT-2)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import Counter
from pathlib import Path

import pytest

from brokerd.admin.ctl import main
from brokerd.tools.launcher import Deployment
from brokerd.traces.writer import read_events, segment_files
from tests.daemons import SOLO_DATABASE as SOLO
from tests.daemons import client_of, running, solo_broker, wait_until
from tests.disks import fill, small_tmpfs

HOST = "127.0.0.231"
OTHER = "127.0.0.232"


async def _send_and_receive(d: Deployment, name: str, count: int) -> None:
    client = await d.daemons[name].client()
    try:
        handle = await client.begin_dialog("//solo/S1", "//solo/S2")
        for n in range(count):
            await client.send(handle, body=f"m{n}".encode())
        got = 0
        while got < count:
            got += len(await client.receive("Q2", timeout=5, top=100))
    finally:
        await client.close()


def test_a_start_that_fails_keeps_the_crash_window_and_the_numbers(tmp_path: Path) -> None:
    """R-TRACE-1: every event's ``n`` goes on from one start to the next, and each start's
    ``started`` names the last event found on disk, ``clean`` only after a graceful stop.
    A daemon killed (SIGKILL), then a start that fails before it serves (its admin port is
    taken), then a start that succeeds: the crash window of the kill must still show, and
    no event id may be used twice."""
    d = Deployment(tmp_path)
    d.add("solo", HOST, SOLO)
    traces = tmp_path / "solo" / "data" / "traces"
    with running(d):
        asyncio.run(_send_and_receive(d, "solo", 3))
        time.sleep(0.6)  # flushed
        d.kill("solo")
        before = list(read_events(segment_files([traces])))
        last = before[-1]
        assert last["event"] != "stopped"
        with socket.create_server((HOST, 8022)), pytest.raises(RuntimeError):
            d.start("solo")  # cannot bind its admin port: exits
        d.start("solo")
        d.stop("solo")
    events = list(read_events(segment_files([traces])))
    started = [e for e in events if e["event"] == "started"][-1]
    assert started["clean"] is False, started
    assert started["last_n"] == last["n"], started
    ids = Counter(e["n"] for e in events)
    assert [n for n, c in ids.items() if c > 1] == []


async def test_retention_leaves_an_instance_whose_name_begins_with_ours(tmp_path: Path) -> None:
    """R-TRACE-3, docs/traces.md "Retention": retention deletes only this instance's
    segments, never another instance's files in a shared directory. Instance ``solo``
    must not take ``solo-b``'s segments for its own."""
    traces = tmp_path / "traces"
    traces.mkdir(mode=0o700)
    then = time.time() - 50 * 3600

    def segment(name: str) -> Path:
        path = traces / name
        path.write_bytes(os.urandom(1000))
        os.utime(path, (then, then))
        return path

    ours = segment("solo-20260101T000000-1-00001.jsonl.gz")
    foreign = segment("solo-b-20260101T000000-1-00001.jsonl.gz")
    extra = f'[trace]\ndirectory = "{traces}"\nmax_age_hours = 24\n'
    async with solo_broker(tmp_path / "d", HOST, extra) as broker:
        client = await client_of(broker)
        try:

            async def tidied() -> bool:
                return not ours.exists()

            await wait_until(tidied, 10)
            await asyncio.sleep(0.5)
        finally:
            await client.close()
    assert foreign.exists()


def test_a_daemon_sharing_the_directory_keeps_its_open_segment(tmp_path: Path) -> None:
    """R-TRACE-1, R-TRACE-3: two daemons writing to one trace directory, ``alpha-2``
    started before ``alpha``. ``alpha``'s start closes only the segments *its* crash left
    open: ``alpha-2``'s open segment, still being written, is neither closed, compacted
    nor deleted under it, so every event ``alpha-2`` writes afterwards (its SENDs, its
    ``stopped``) is on disk, and ``alpha-2`` stops cleanly."""
    traces = tmp_path / "shared"
    extra = f'[trace]\ndirectory = "{traces}"\n'
    d = Deployment(tmp_path)
    d.add("alpha-2", OTHER, SOLO, extra=extra)
    d.add("alpha", HOST, SOLO, extra=extra)
    with running(d, "alpha-2"):
        asyncio.run(_send_and_receive(d, "alpha-2", 2))
        d.start("alpha")
        time.sleep(3)  # alpha's keeper has run
        asyncio.run(_send_and_receive(d, "alpha-2", 3))
        time.sleep(0.5)
        code = d.stop("alpha-2")
        d.stop("alpha")
    events = [e for e in read_events(segment_files([traces])) if e["instance"] == "alpha-2"]
    sent = [e["seq"] for e in events if e["event"] == "message_sent"]
    assert sent == [1, 2, 1, 2, 3], sent
    assert events[-1]["event"] == "stopped"
    assert code == 0, d.daemons["alpha-2"].log_tail()


def test_a_start_on_a_full_trace_disk_still_marks_the_crash_window(tmp_path: Path) -> None:
    """R-TRACE-1, R-TRACE-4: a daemon killed (SIGKILL), then started again while its trace
    disk is full. The start goes on (delivery never waits for the trace); its ``started``
    marker cannot be written, so the first write that succeeds again must say what is
    missing: a marker naming the last event on disk before the kill (``last_n``,
    ``last_ts``), which is what opens the crash window for the audit."""
    with small_tmpfs(tmp_path / "traces", "512k") as traces:
        d = Deployment(tmp_path / "d")
        d.add("solo", HOST, SOLO, extra=f'[trace]\ndirectory = "{traces}"\nflush_interval = 0.05\n')
        with running(d):
            asyncio.run(_send_and_receive(d, "solo", 3))
            time.sleep(0.3)
            d.kill("solo")
            last = list(read_events(segment_files([traces])))[-1]
            filler = fill(traces)
            d.start("solo")
            asyncio.run(_send_and_receive(d, "solo", 2))
            filler.unlink()
            asyncio.run(_send_and_receive(d, "solo", 1))
            time.sleep(0.3)
            d.stop("solo")
        events = list(read_events(segment_files([traces])))
    markers = [
        e for e in events if e["event"] in ("started", "trace_resumed") and e["n"] > last["n"]
    ]
    assert markers, [e["event"] for e in events if e["n"] > last["n"]]
    assert markers[0].get("last_n") == last["n"], markers
    assert markers[0].get("last_ts") == last["ts"], markers


def test_one_message_of_a_long_conversation_can_be_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-REPORT-2, docs/traces.md "Following one message": at most 100,000 events of one
    conversation are kept, and past that the command asks for one SEQ. Given one SEQ, the
    path of that message is printed: the advice must work."""
    d = Deployment(tmp_path)
    d.add("solo", HOST, SOLO, extra="[trace]\nflush_interval = 0.05\n")
    count = 34_000  # SEND, delivered, RECEIVE: three events a message

    async def long_dialog() -> str:
        client = await d.daemons["solo"].client()
        try:
            handle = await client.begin_dialog("//solo/S1", "//solo/S2")
            for _ in range(0, count, 1000):
                pending = [client.send_nowait(handle, body=b"x") for _n in range(1000)]
                await asyncio.gather(*pending)
                got = 0
                while got < 1000:
                    got += len(await client.receive("Q2", timeout=5, top=1000))
            (endpoint, *_) = await client.view("conversation_endpoints")
            return str(endpoint["conversation_id"])
        finally:
            await client.close()

    with running(d):
        conversation = asyncio.run(long_dialog())
    config = str(d.daemons["solo"].config_path)
    status = main(["trace", conversation, "7", "--config", config])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.startswith(f"conversation {conversation} message 7 ")
