"""The trace writer (docs/traces.md): format, rotation, sampling, torn tails, off switch."""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from pathlib import Path

import pytest

from brokerd.config import TraceConfig
from brokerd.traces.segments import segment_lines, unreadable
from brokerd.traces.writer import (
    DURABLE,
    EVENTS,
    TraceWriter,
    iso_micros,
    read_events,
    segment_files,
)


async def test_a_compaction_after_the_stop_runs_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graceful stop compacts for a few seconds at most; past the stop, a compaction (a
    tool's, of the segment the stop left) runs whole."""
    monkeypatch.setattr("brokerd.traces.writer.STOP_COMPACT_SECONDS", 0.0)
    writer = TraceWriter(TraceConfig(directory=tmp_path), "alpha")
    await writer.start()
    writer.emit("message_sent", uuid.uuid4(), seq=1, size=200, initiator=True)
    await writer.stop()
    (path,) = segment_files([tmp_path])
    assert path.name.endswith(".jsonl")  # closed by the stop, not compacted
    compacted = writer.keeper.compact(path)
    assert compacted is not None and compacted.name.endswith(".parquet")
    assert [e["event"] for e in read_events([compacted])] == ["started", "message_sent", "stopped"]


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.25

    def __call__(self) -> float:
        return self.now


async def test_events_are_json_lines_with_the_documented_fields(tmp_path: Path) -> None:
    clock = Clock()
    writer = TraceWriter(TraceConfig(directory=tmp_path), "alpha", clock)
    await writer.start()
    conversation = uuid.uuid4()
    writer.emit("message_sent", conversation, seq=1, size=200, service='//x "q"', initiator=True)
    writer.emit("connection_opened", peer="beta@127.0.0.2:4022", encrypted=True, reason=None)
    await writer.stop()
    (path,) = segment_files([tmp_path])
    # closed at the stop; too small to be compacted then (the next start does it)
    assert path.name.startswith("alpha-") and path.name.endswith(".jsonl")
    lines = b"".join(segment_lines(path)).decode().splitlines()
    started, first, second, stopped = (json.loads(line) for line in lines)
    assert started["event"] == "started" and stopped["event"] == "stopped"
    assert "last_n" not in started  # the first start: nothing on disk before
    assert first == {
        "v": 1,
        "instance": "alpha",
        "n": 2,
        "ts": "2027-01-15T08:00:00.250000Z",
        "event": "message_sent",
        "conversation_id": str(conversation),
        "seq": 1,
        "size": 200,
        "service": '//x "q"',
        "initiator": True,
    }
    assert "reason" not in second and second["encrypted"] is True
    assert {"message_sent", "connection_opened", "dropped", "forwarded"} <= set(EVENTS)


async def test_emit_each_writes_the_lines_emit_would_one_per_value(tmp_path: Path) -> None:
    """The messages one commit delivers are buffered as one entry: the lines and the
    counters are those of one ``emit`` per message, at the same time."""
    clock = Clock()
    conversation = uuid.uuid4()
    each = TraceWriter(TraceConfig(directory=tmp_path / "each"), "beta", clock)
    one = TraceWriter(TraceConfig(directory=tmp_path / "one"), "beta", clock)
    for writer in (each, one):
        await writer.start()
    each.emit_each(
        "delivered", conversation, "seq", [3, 4, 5], database="w", initiator=True, hop=None
    )
    each.emit_each("received", conversation, "seq", [], database="w")  # nothing at all
    for seq in (3, 4, 5):
        one.emit("delivered", conversation, database="w", initiator=True, hop=None, seq=seq)
    assert each.view()["trace_events_buffered"] == 3
    for writer in (each, one):
        await writer.stop()
    assert each.events_written == one.events_written == 3 + 2  # and started, stopped
    lines = {
        name: [json.loads(line) for line in read_lines(tmp_path / name)] for name in ("each", "one")
    }
    assert lines["each"] == lines["one"]
    assert [line["seq"] for line in lines["each"]] == [3, 4, 5]
    assert "hop" not in lines["each"][0]


async def test_emit_grouped_folds_the_events_of_a_batch_into_one_entry(tmp_path: Path) -> None:
    """An event joins the last entry of its name and conversation, or else the latest entry
    of its name (another conversation's: each line then names its own), when its other
    fields are the same and that entry is less than a millisecond old: the lines are those
    of one ``emit`` each, at the entry's time. Other fields, a later time or a flush in
    between start a new entry."""
    clock = Clock()
    conversation, other = uuid.uuid4(), uuid.uuid4()
    grouped = TraceWriter(TraceConfig(directory=tmp_path / "grouped"), "alpha", clock)
    await grouped.start()

    def sent(seq: int, size: int, conversation: uuid.UUID = conversation) -> None:
        grouped.emit_grouped("enqueued", conversation, "seq", seq, size=size, route=None)

    sent(1, 200)
    clock.now += 0.0004
    sent(2, 200)  # joins 1
    sent(3, 90)  # other fields: a new entry
    sent(4, 90, conversation=other)  # another conversation joins 3
    clock.now += 0.0004
    sent(5, 90)  # joins 3 and 4
    sent(6, 200, conversation=other)  # other fields than the latest entry: a new entry
    clock.now += 0.002
    sent(7, 90)  # too late to join 3
    assert len(grouped._buffer) == 4 and grouped.view()["trace_events_buffered"] == 7
    await grouped.flush()
    sent(8, 90)  # after a flush: a new entry
    await grouped.stop()
    assert grouped.events_written == 8 + 2  # and started, stopped
    lines = [json.loads(line) for line in read_lines(tmp_path / "grouped")]
    assert [(line["seq"], line["size"], line["ts"][-8:]) for line in lines] == [
        (1, 200, ".250000Z"),
        (2, 200, ".250000Z"),
        (3, 90, ".250400Z"),
        (4, 90, ".250400Z"),
        (5, 90, ".250400Z"),
        (6, 200, ".250800Z"),
        (7, 90, ".252800Z"),
        (8, 90, ".252800Z"),
    ]
    assert [line["conversation_id"] == str(other) for line in lines] == [
        False, False, False, True, False, True, False, False
    ]  # fmt: skip
    assert all("route" not in line and line["event"] == "enqueued" for line in lines)


async def test_lines_without_a_conversation_and_conversations_over_flushes(
    tmp_path: Path,
) -> None:
    """An entry begun without a conversation that lines of a conversation join writes
    each line with its own (or none); a conversation's piece of a line is kept from one
    flush to the next and stays right."""
    clock = Clock()
    conversation, other = uuid.uuid4(), uuid.uuid4()
    writer = TraceWriter(TraceConfig(directory=tmp_path), "alpha", clock)
    await writer.start()
    writer.emit_each("dropped", None, "seq", [1], reason="r")
    writer.emit_each("dropped", conversation, "seq", [2], reason="r")
    await writer.flush()
    writer.emit_each("dropped", other, "seq", [3], reason="r")
    writer.emit_each("dropped", conversation, "seq", [4], reason="r")
    writer.emit("dropped", None, seq=5, reason="r")
    await writer.stop()
    lines = [json.loads(line) for line in read_lines(tmp_path)]
    assert [(line["seq"], line.get("conversation_id")) for line in lines] == [
        (1, None),
        (2, str(conversation)),
        (3, str(other)),
        (4, str(conversation)),
        (5, None),
    ]


def read_lines(directory: Path) -> list[str]:
    """The lines of the one segment in ``directory``, but the writer's own (started, stopped)."""
    (path,) = segment_files([directory])
    own = ('"event":"started"', '"event":"stopped"')
    text = b"".join(segment_lines(path)).decode()
    return [line for line in text.splitlines() if not any(o in line for o in own)]


def test_iso_micros_rounds_to_the_microsecond() -> None:
    assert iso_micros(0.0000004) == "1970-01-01T00:00:00.000000Z"
    assert iso_micros(59.9999996) == "1970-01-01T00:01:00.000000Z"


async def test_segments_rotate_by_size_and_age(tmp_path: Path) -> None:
    clock = Clock()
    config = TraceConfig(directory=tmp_path, segment_mb=1, segment_seconds=60)
    writer = TraceWriter(config, "alpha", clock)
    await writer.start()
    big = "x" * 1000
    for _ in range(1100):  # about 1.1 MB: the second flush starts a new segment
        writer.emit("dropped", reason=big)
    await writer.flush()
    writer.emit("dropped", reason="after size")
    await writer.flush()
    clock.now += 61
    writer.emit("dropped", reason="after age")
    await writer.flush()
    await writer.stop()
    files = segment_files([tmp_path])
    assert len(files) == 3 and writer.segments_closed == 3
    events = [e for e in read_events(files) if e["event"] == "dropped"]
    assert len(events) == 1102 and events[-1]["reason"] == "after age"


async def test_a_torn_last_line_is_skipped_and_open_segments_are_recovered(
    tmp_path: Path,
) -> None:
    writer = TraceWriter(TraceConfig(directory=tmp_path), "alpha", Clock())
    await writer.start()
    writer.emit("dropped", reason="whole")
    await writer.flush()
    (open_path,) = tmp_path.glob("*.jsonl.open")
    with open_path.open("ab") as f:  # a crash in the middle of a line
        f.write(b'{"v":1,"instance":"alpha","ts":"2027-01-15T08:0')
    # The process dies here; a new writer starts later.
    later = TraceWriter(TraceConfig(directory=tmp_path), "alpha", Clock())
    await later.start()
    assert not open_path.exists() and open_path.with_suffix("").exists()
    events = list(read_events(segment_files([tmp_path])))
    assert [e["event"] for e in events] == ["started", "dropped", "started"]
    assert events[1]["reason"] == "whole"
    # The restart names the last whole event on disk: the crash window begins there.
    assert events[2]["last_n"] == events[1]["n"] == 2 and events[2]["clean"] is False
    assert events[2]["last_ts"] == events[1]["ts"] and events[2]["n"] == 3
    await later.stop()


async def test_sampling_keeps_whole_conversations(tmp_path: Path) -> None:
    writer = TraceWriter(TraceConfig(directory=tmp_path, sample=0.25), "alpha", Clock())
    await writer.start()
    conversations = [uuid.uuid4() for _ in range(2000)]
    for c in conversations:
        writer.emit("message_sent", c, seq=1)
        writer.emit("delivered", c, seq=1)
    writer.emit("connection_opened", peer="x")
    await writer.stop()
    events = list(read_events(segment_files([tmp_path])))
    per: dict[str, int] = {}
    for e in events:
        if "conversation_id" in e:
            per[e["conversation_id"]] = per.get(e["conversation_id"], 0) + 1
    assert all(n == 2 for n in per.values())  # both events of a traced conversation
    assert 350 < len(per) < 650  # about a quarter of 2000
    assert sum(writer.sampled(c) for c in conversations) == len(per)
    assert any(e["event"] == "connection_opened" for e in events)


async def test_disabled_writes_nothing(tmp_path: Path) -> None:
    writer = TraceWriter(TraceConfig(directory=tmp_path / "t", enabled=False), "alpha")
    await writer.start()
    writer.emit("dropped", reason="x")
    await writer.stop()
    assert not (tmp_path / "t").exists()


async def test_a_write_error_is_counted_not_raised(tmp_path: Path) -> None:
    target = tmp_path / "file-not-dir"
    writer = TraceWriter(TraceConfig(directory=tmp_path), "alpha", Clock())
    await writer.start()
    writer.directory = target  # segments cannot be created under a regular file
    target.write_text("")
    writer.clock.now += 301  # the next write begins a segment
    writer.emit("dropped", reason="x")
    await writer.flush()
    assert writer.events_lost == 1 and writer.events_written == 1  # started, before
    await writer.stop()


async def test_emit_each_of_several_conversations_shares_an_entry(tmp_path: Path) -> None:
    """The messages one commit delivers on many dialogs (W4's 10,000) share one entry: every
    line names its own conversation, in the order the events were recorded."""
    clock = Clock()
    first, second = uuid.uuid4(), uuid.uuid4()
    writer = TraceWriter(TraceConfig(directory=tmp_path / "each"), "beta", clock)
    await writer.start()
    writer.emit_each("delivered", first, "seq", [1, 2], database="warehouse")
    writer.emit_each("delivered", second, "seq", [7], database="warehouse")
    writer.emit_grouped("delivered", first, "seq", 3, database="warehouse")
    assert len(writer._buffer) == 1
    await writer.stop()
    lines = [json.loads(line) for line in read_lines(tmp_path / "each")]
    assert [(line["conversation_id"], line["seq"]) for line in lines] == [
        (str(first), 1),
        (str(first), 2),
        (str(second), 7),
        (str(first), 3),
    ]


async def test_a_conversations_lines_keep_their_order_across_shared_entries(
    tmp_path: Path,
) -> None:
    """A conversation that joined another conversation's entry never goes back to an older
    entry of its own: its lines stay in the order of its events."""
    clock = Clock()
    a, b = uuid.uuid4(), uuid.uuid4()
    writer = TraceWriter(TraceConfig(directory=tmp_path / "order"), "alpha", clock)
    await writer.start()
    writer.emit_grouped("message_sent", b, "seq", 5, size=100)
    writer.emit_grouped("message_sent", a, "seq", 1, size=200)
    writer.emit_grouped("message_sent", b, "seq", 6, size=200)  # joins a's entry
    writer.emit_grouped("message_sent", b, "seq", 7, size=100)  # not b's first entry
    await writer.stop()
    lines = [json.loads(line) for line in read_lines(tmp_path / "order")]
    assert [line["seq"] for line in lines if line["conversation_id"] == str(b)] == [5, 6, 7]


async def test_numbers_go_on_after_a_graceful_stop_and_a_clean_start_says_so(
    tmp_path: Path,
) -> None:
    """Every line has ``n``, one more than the line before it on this instance, across
    restarts; a start after a graceful stop names the ``stopped`` event: clean."""
    first = TraceWriter(TraceConfig(directory=tmp_path), "alpha", Clock())
    await first.start()
    first.emit_each("delivered", uuid.uuid4(), "seq", [1, 2, 3])
    await first.stop()
    second = TraceWriter(TraceConfig(directory=tmp_path), "alpha", Clock())
    await second.start()
    await second.stop()
    events = list(read_events(segment_files([tmp_path])))
    assert [e["n"] for e in events] == list(range(1, 8))
    restart = events[5]
    assert restart["event"] == "started" and restart["clean"] is True
    assert restart["last_event"] == "stopped" and restart["last_n"] == 5


async def test_a_barrier_is_done_once_the_events_before_it_are_fsynced(tmp_path: Path) -> None:
    """``trace.durable``: a barrier waits for a durable flush of every event emitted before
    it; barriers asked for together share one flush; with nothing buffered there is
    nothing to wait for, and with ``durable = false`` never."""
    writer = TraceWriter(TraceConfig(directory=tmp_path / "d", flush_interval=60), "alpha")
    await writer.start()
    assert writer.barrier() is None  # started is on disk already
    conversation = uuid.uuid4()
    writer.emit("message_sent", conversation, seq=1)
    one = writer.barrier()
    writer.emit("message_sent", conversation, seq=2)
    two = writer.barrier()
    assert one is not None and two is not None and not one.done()
    await two
    assert one.done() and writer.barriers == 1
    on_disk = [e["seq"] for e in read_events(segment_files([tmp_path / "d"])) if "seq" in e]
    assert on_disk == [1, 2]
    await writer.stop()

    loose = TraceWriter(TraceConfig(directory=tmp_path / "l", durable=False), "alpha")
    await loose.start()
    loose.emit("message_sent", conversation, seq=1)
    assert loose.barrier() is None
    await loose.stop()


async def test_no_barrier_is_skipped_while_a_flush_waits_for_the_one_before_it(
    tmp_path: Path,
) -> None:
    """R-TRACE-1: a commit's outcome reaches the application only once the events emitted
    before it are on disk. While a flush that took them waits for another flush to end,
    the barrier asked then must wait for it too, also in the loop step between the first
    flush letting go of the segment and the second one taking it."""
    writer = TraceWriter(TraceConfig(directory=tmp_path, flush_interval=60), "alpha")
    await writer.start()
    conversation = uuid.uuid4()
    emitted = writer.events_written
    skipped: list[tuple[int, int]] = []
    running = True
    loop = asyncio.get_running_loop()

    def look() -> None:  # every step of the loop: a barrier of None means all is on disk
        if writer.barrier() is None and writer.events_written < emitted:
            skipped.append((emitted, writer.events_written))
        if running:
            loop.call_soon(look)

    loop.call_soon(look)
    for seq in range(1, 201):
        writer.emit("message_sent", conversation, seq=seq)
        emitted += 1
        first = asyncio.create_task(writer.flush())
        await asyncio.sleep(0)
        writer.emit("enqueued", conversation, seq=seq)
        emitted += 1
        second = asyncio.create_task(writer.flush())
        await asyncio.gather(first, second)
        if skipped:
            break
    running = False
    await writer.stop()
    assert skipped == []


def test_the_documented_events_are_the_writers_with_their_durability() -> None:
    """docs/traces.md lists every event of :data:`EVENTS`, and marks durable exactly those of
    :data:`DURABLE`."""
    doc = (Path(__file__).parents[2] / "docs" / "traces.md").read_text()
    rows = re.findall(r"^\| (`\w+`(?:, `\w+`)*) \| (true|false) \|", doc, flags=re.MULTILINE)
    documented = {
        name: flag == "true" for names, flag in rows for name in re.findall(r"\w+", names)
    }
    assert set(EVENTS) <= set(documented)
    assert {name for name, durable in documented.items() if durable} == DURABLE


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "compacted"])
async def test_retention_keeps_the_segment_a_stop_wrote_under_a_smaller_limit(
    tmp_path: Path, compress: bool
) -> None:
    """R-TRACE-1, R-TRACE-3: ``max_total_mb`` below one segment's size deletes older
    segments, never the newest: it holds the instance's last event (the ``stopped``
    marker a graceful stop writes), which the next start names and numbers on from."""
    config = TraceConfig(directory=tmp_path, max_total_mb=1, compress=compress)
    noise = os.urandom(1_500_000).hex()  # 3 MB that compaction cannot make small
    first = TraceWriter(config, "alpha")
    await first.start()
    first.emit("message_sent", uuid.uuid4(), seq=1, pad=noise)
    await first.stop()
    (kept,) = tmp_path.iterdir()
    assert kept.stat().st_size > 1024 * 1024 and kept.name.endswith(
        ".parquet" if compress else ".jsonl"
    )
    second = TraceWriter(config, "alpha")
    await second.start()
    second.emit("message_sent", uuid.uuid4(), seq=1, pad=noise)
    await second.stop()
    assert not kept.exists()  # the older one goes: the newest is over the limit alone
    events = list(read_events(segment_files([tmp_path])))
    assert [e["event"] for e in events] == ["started", "message_sent", "stopped"]
    restart = events[0]
    assert restart["clean"] is True and restart["last_event"] == "stopped"
    assert restart["last_n"] == 3 and [e["n"] for e in events] == [4, 5, 6]


async def _run(directory: Path, clock: Clock, events: int, *, compact: bool) -> Path:
    """One start and graceful stop of instance ``alpha`` at ``clock``'s time, with
    ``events`` events between; the segment it wrote, compacted with ``compact`` (without,
    ``trace.compress`` is off: no segment is compacted)."""
    before = set(segment_files([directory]))
    writer = TraceWriter(TraceConfig(directory=directory, compress=compact), "alpha", clock)
    await writer.start()
    writer.emit_each("delivered", uuid.uuid4(), "seq", list(range(1, events + 1)))
    await writer.stop()
    (path,) = set(segment_files([directory])) - before
    return (writer.keeper.compact(path) or path) if compact else path


def _set_back(path: Path, seconds: float) -> None:
    stat = path.stat()
    os.utime(path, (stat.st_atime - seconds, stat.st_mtime - seconds))


@pytest.mark.parametrize("compact", [False, True], ids=["plain", "compacted"])
async def test_numbers_go_on_from_the_highest_after_the_clock_went_back(
    tmp_path: Path, compact: bool
) -> None:
    """R-TRACE-1: an event's id (``instance#n``) is never used twice, and a start names
    the last event written before it. The wall clock set back an hour between two runs
    gives the second run's segment an earlier name and file time than the first's: the
    third start still numbers on from the second run's events, the highest, whatever the
    files' times say."""
    clock = Clock()
    first = await _run(tmp_path, clock, 3, compact=compact)
    clock.now -= 3600
    second = await _run(tmp_path, clock, 2, compact=compact)
    _set_back(second, 3600)
    assert second.stat().st_mtime < first.stat().st_mtime and second.name < first.name
    await _run(tmp_path, clock, 1, compact=compact)
    events = list(read_events(segment_files([tmp_path])))
    numbers = sorted(e["n"] for e in events)
    assert numbers == list(range(1, len(events) + 1))  # each once
    # runs of 1 + 3 + 1 and 1 + 2 + 1 events (started, delivered, stopped) before it
    (restart,) = [e for e in events if e["event"] == "started" and e["n"] == 10]
    assert (restart["last_n"], restart["last_event"], restart["clean"]) == (9, "stopped", True)


async def test_numbers_go_on_past_a_newest_compacted_segment_whose_rows_do_not_read(
    tmp_path: Path,
) -> None:
    """R-TRACE-1, R-TRACE-3: a compacted segment whose pages are damaged on disk (its
    footer whole) still tells its highest ``n``: the next start numbers on past it
    rather than from the segment before it."""
    clock = Clock()
    await _run(tmp_path, clock, 3, compact=True)
    clock.now += 60
    newest = await _run(tmp_path, clock, 2, compact=True)
    data = bytearray(newest.read_bytes())
    data[8:200] = bytes(192)  # the first column's pages, far from the footer at the end
    newest.write_bytes(bytes(data))
    assert unreadable(newest) is not None
    clock.now += 60
    last = await _run(tmp_path, clock, 1, compact=False)
    events = list(read_events([last]))
    assert [e["n"] for e in events] == [10, 11, 12]  # after 5 events, then 4
    # what its last event was does not read: a crash window is assumed
    assert events[0]["last_n"] == 9 and events[0]["clean"] is False


async def test_retention_keeps_the_segment_of_the_last_event_whatever_its_file_time(
    tmp_path: Path,
) -> None:
    """R-TRACE-1, R-TRACE-3: under a ``max_total_mb`` below one segment's size, the
    segment a graceful stop wrote is kept although an older one was last written at a
    later time (the clock was ahead then): it holds the last event, which the next start
    names and numbers on from."""
    config = TraceConfig(directory=tmp_path, max_total_mb=1, compress=False)
    noise = os.urandom(1_500_000).hex()  # 3 MB
    first = TraceWriter(config, "alpha")
    await first.start()
    first.emit("message_sent", uuid.uuid4(), seq=1, pad=noise)
    await first.stop()
    (ahead,) = segment_files([tmp_path])
    _set_back(ahead, -3600)  # written an hour ahead of the clock as it is now
    second = TraceWriter(config, "alpha")
    await second.start()
    second.emit("message_sent", uuid.uuid4(), seq=1, pad=noise)
    await second.stop()
    assert len(segment_files([tmp_path])) == 2  # over the limit, neither may go
    third = TraceWriter(config, "alpha")
    await third.start()
    await third.stop()
    events = list(read_events(segment_files([tmp_path])))
    numbers = [e["n"] for e in events]
    assert len(set(numbers)) == len(numbers)  # each once (the second's segment has gone now)
    restart = max(events, key=lambda e: e["n"] if e["event"] == "started" else 0)
    assert (restart["n"], restart["last_n"], restart["last_event"]) == (7, 6, "stopped")
