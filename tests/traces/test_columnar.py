"""Compaction into Parquet (docs/traces.md "Compaction"): a closed segment's lines come
back as they were, its bad lines are kept as bad lines, and each event's time is parsed
once, as the analytics parse a line's ``ts`` (R-TRACE-3)."""

from __future__ import annotations

import gzip
import json
import logging
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from brokerd.config import TraceConfig
from brokerd.traces import columnar
from brokerd.traces.segments import (
    SegmentKeeper,
    compaction_command,
    segment_lines,
    unreadable,
)
from brokerd.traces.writer import read_events

GOOD = [
    {"v": 1, "instance": "alpha", "ts": "2026-11-21T09:09:57.668116Z", "event": "started", "n": 1},
    {
        "v": 1,
        "instance": "alpha",
        "ts": "2026-11-21T09:09:57.700000Z",
        "event": "message_sent",
        "n": 2,
        "conversation_id": "0a1b2c3d-0000-4000-8000-000000000001",
        "initiator": True,
        "seq": 1,
        "size": 200,
        "wait": 0.25,
        "service": "//shop/Orders",
    },
]


def _segment(tmp_path: Path, *extra: bytes) -> Path:
    path = tmp_path / "alpha-20261121T090957-7-00001.jsonl"
    path.write_bytes(b"".join(json.dumps(e).encode() + b"\n" for e in GOOD) + b"".join(extra))
    return path


def test_a_clean_segment_comes_back_line_for_line(tmp_path: Path) -> None:
    source = _segment(tmp_path)
    target = tmp_path / "out.parquet"
    assert columnar.write(source, target) == 2
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [json.loads(line) for line in columnar.lines(target)] == GOOD
    table = pq.read_table(target)
    assert table.column("t").to_pylist() == [1795252197668116, 1795252197700000]
    assert table.column("_corrupt").null_count == 2


def test_a_segment_compacted_before_fields_were_added_is_still_read(tmp_path: Path) -> None:
    """A compacted file holds the columns of the version that wrote it: one written before
    a field was added to the schema comes back line for line, without that field."""
    source = _segment(tmp_path)
    target = tmp_path / "out.parquet"
    columnar.write(source, target)
    older = tmp_path / "older.parquet"
    pq.write_table(pq.read_table(target).drop_columns(["rollbacks", "dropped", "_extra"]), older)
    assert [json.loads(line) for line in columnar.lines(older)] == GOOD
    assert columnar.rows(older) == 2


def test_bad_lines_stay_bad_and_a_torn_tail_keeps_its_missing_newline(tmp_path: Path) -> None:
    """A field of the wrong type, a line that is not an object and a torn tail each make
    one row of their own text (the readers skip them as they skip them in JSON Lines); a
    field of another schema version is kept; a time of another form has no ``t``."""
    source = _segment(
        tmp_path,
        b'{"v":1,"instance":"alpha","ts":"2026-11-21T09:09:58.000000Z","event":"x","seq":"7"}\n',
        b"[1, 2]\n",
        b"\n",
        b'{"v":1,"instance":"alpha","ts":"yesterday","event":"late","future":3}\n',
        b'{"v":1,"instance":"alpha","ts":"2026-11-21T09:4',
    )
    target = tmp_path / "out.parquet"
    assert columnar.write(source, target) == 6
    back = list(columnar.lines(target))
    assert [json.loads(line) for line in back[0:2]] == GOOD
    assert back[2] == (
        b'{"v":1,"instance":"alpha","ts":"2026-11-21T09:09:58.000000Z","event":"x","seq":"7"}\n'
    )
    assert back[3] == b"[1, 2]\n"
    assert json.loads(back[4]) == {
        "v": 1,
        "instance": "alpha",
        "ts": "yesterday",
        "event": "late",
        "future": 3,
    }
    assert back[5] == b'{"v":1,"instance":"alpha","ts":"2026-11-21T09:4'  # torn: no newline
    assert pq.read_table(target).column("t").to_pylist()[4] is None
    # the events a reader takes from it are the plain segment's
    assert list(read_events([target])) == list(read_events([source]))


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        ("2026-11-21T09:09:57.668116Z", 1795252197668116),
        ("2026-11-21T10:09:57.668116+0100", 1795252197668116),
        ("2026-11-21T10:09:57.668116+01", 1795252197668116),
        ("2026-11-21T09:09:57Z", None),  # no microseconds: not the writer's form
        ("2026-11-21 09:09:57.668116Z", None),
        ("2026-13-21T09:09:57.668116Z", None),
        (None, None),
    ],
)
def test_times_are_parsed_as_the_analytics_parse_them(ts: str | None, expected: int | None) -> None:
    assert columnar.micros(ts) == expected


TIMES = [
    "2026-11-21T09:09:57.668116Z",
    "2026-11-21T10:09:57.668116+0100",
    "2026-11-21T09:09:57Z",
    "2026-13-21T09:09:57.668116Z",
    None,
]


@pytest.mark.parametrize("times", [TIMES[:1] * 3, TIMES[:1] + TIMES[3:], TIMES])
def test_a_segment_s_times_are_the_analytics_times_whatever_their_forms(
    tmp_path: Path, times: list[str | None]
) -> None:
    """A column of the writer's own form is converted at once, any other (an offset, no
    microseconds, a month 13, no time) a line at a time: the same ``t`` either way."""
    source = tmp_path / "alpha-20261121T090957-7-00001.jsonl"
    lines = [{"v": 1, "instance": "alpha", "ts": ts, "event": "started", "n": 1} for ts in times]
    source.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    target = tmp_path / "out.parquet"
    columnar.write(source, target)
    assert pq.read_table(target).column("t").to_pylist() == [columnar.micros(t) for t in times]


def test_a_compaction_runs_below_its_daemon_s_priority(tmp_path: Path) -> None:
    """The keeper's compaction process (``python -m brokerd.traces.columnar``) lowers its
    own priority by :data:`columnar.NICENESS` before it works: on a busy machine the
    daemon's delivery goes first (W4's p99, docs/performance.md)."""
    source = _segment(tmp_path)
    target = tmp_path / "out.parquet"
    probe = (
        "import os, sys; from brokerd.traces import columnar; "
        "code = columnar.main(sys.argv[1:]); print(os.nice(0)); raise SystemExit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(source), str(target)],
        capture_output=True,
        check=True,
        text=True,
    )
    assert int(done.stdout) == min(os.nice(0) + columnar.NICENESS, 19)
    assert columnar.rows(target) == 2


def test_the_keeper_compacts_in_a_process_of_its_own_and_a_crash_leaves_one_copy(
    tmp_path: Path,
) -> None:
    source = _segment(tmp_path)
    before = list(segment_lines(source))
    keeper = SegmentKeeper(TraceConfig(directory=tmp_path), tmp_path, "alpha")
    (tmp_path / "alpha-20261121T090957-7-00001.parquet.partial").write_bytes(b"cut short")
    keeper.recover()
    assert not list(tmp_path.glob("*.partial"))
    keeper.tidy(stopping=True)  # a small segment at a stop: left for the next start
    assert source.exists() and not list(tmp_path.glob("*.parquet"))
    keeper.tidy()
    (compacted,) = tmp_path.glob("*.parquet")
    assert not source.exists()
    assert [json.loads(line) for line in segment_lines(compacted)] == [
        json.loads(line) for line in before
    ]
    view = keeper.view()
    assert view["trace_segments_compacted"] == 1
    assert view["trace_compacted_bytes_after"] > 0


def test_a_stop_cuts_a_running_compaction_short_and_the_next_start_does_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A graceful stop compacts for a few seconds at most (``stop_by``): a compaction
    running at its deadline is ended, leaving the segment whole and no partial file, and
    the segments after it are not begun; the stop's own pass says once how many were
    left; the next start compacts them all."""
    many = json.dumps(GOOD[1]).encode() + b"\n"
    first = _segment(tmp_path, many * 4_000)
    second = first.with_name("alpha-20261121T091957-7-00002.jsonl")
    second.write_bytes(first.read_bytes())
    begun: list[Path] = []

    def slow(path: Path, partial: Path) -> list[str]:
        """The compaction, begun a second late: still running when the stop comes."""
        begun.append(path)
        return ["sh", "-c", 'sleep 1 && exec "$@"', "compact", *compaction_command(path, partial)]

    monkeypatch.setattr("brokerd.traces.segments.compaction_command", slow)
    monkeypatch.setattr("brokerd.traces.segments.STOP_COMPACT_BYTES", 0)  # none left as small
    caplog.set_level(logging.INFO, logger="brokerd.traces.segments")
    keeper = SegmentKeeper(TraceConfig(directory=tmp_path), tmp_path, "alpha")
    tidying = threading.Thread(target=keeper.tidy)
    tidying.start()
    while keeper.compacting is None and tidying.is_alive():
        time.sleep(0.005)
    keeper.stop_by(time.monotonic())
    tidying.join(60)
    assert not tidying.is_alive()
    assert begun == [first]  # the second was not begun
    assert first.exists() and second.exists()
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("*.parquet"))
    assert keeper.view()["trace_segments_compacted"] == 0
    # the stop's pass after the cut one (TraceWriter.stop): one line for both segments
    keeper.tidy(stopping=True)
    left = [r.getMessage() for r in caplog.records if "not compacted" in r.getMessage()]
    assert left == [
        "2 trace segment(s) not compacted by the stop's deadline, left for the next start"
    ]
    assert first.exists() and second.exists()
    # a compaction called on its own (a tool's) is not bound by the stop
    assert keeper.compact(second) is not None
    assert keeper.view()["trace_segments_compacted"] == 1

    after = SegmentKeeper(TraceConfig(directory=tmp_path), tmp_path, "alpha")
    after.recover()
    after.tidy()
    assert not first.exists() and not second.exists()
    assert len(list(tmp_path.glob("*.parquet"))) == 2
    assert sum(1 for _ in read_events(sorted(tmp_path.glob("*.parquet")))) == 2 * (2 + 4_000)


def test_a_damaged_page_or_footer_is_found_and_named(tmp_path: Path) -> None:
    """Compaction writes page checksums: a byte changed in a page is found when the file
    is read through (``check``), as a footer cut short is; a sound file has no finding."""
    source = _segment(tmp_path)
    target = tmp_path / "out.parquet"
    columnar.write(source, target)
    assert columnar.check(target) is None
    data = bytearray(target.read_bytes())
    chunk = pq.read_metadata(target).row_group(0).column(0)
    # the last byte of the first column's chunk: its last page's data, under the checksum
    page = (
        (chunk.dictionary_page_offset or chunk.data_page_offset) + chunk.total_compressed_size - 1
    )
    flipped = tmp_path / "flipped.parquet"
    flipped.write_bytes(bytes(data[:page]) + bytes([data[page] ^ 0xFF]) + bytes(data[page + 1 :]))
    assert columnar.check(flipped)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(bytes(data[: len(data) // 2]))
    assert "magic bytes" in (columnar.check(cut) or "")


def test_the_analysis_finds_damaged_compressed_segments_and_only_those(tmp_path: Path) -> None:
    """A compressed segment that does not read is found (``brokerd analyze`` names it and
    leaves it out): a compacted one damaged, or a gzip one of an earlier version cut
    short; plain JSON Lines and sound files are read (their bad lines skipped one by one)."""
    sound = tmp_path / "sound.parquet"
    columnar.write(_segment(tmp_path), sound)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(sound.read_bytes()[:100])
    plain = _segment(tmp_path, b'{"torn')
    whole = tmp_path / "whole.jsonl.gz"
    whole.write_bytes(gzip.compress(plain.read_bytes()))
    short = tmp_path / "short.jsonl.gz"
    short.write_bytes(whole.read_bytes()[:-12])
    found = {p: e for p in (sound, cut, plain, whole, short) if (e := unreadable(p)) is not None}
    assert sorted(found) == [cut, short]
    assert "magic bytes" in found[cut] and found[short]


def _children(pid: int) -> list[int]:
    """The processes ``pid``'s threads started (``/proc``), none once it is gone."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_compaction_dies_with_the_process_that_runs_it(tmp_path: Path) -> None:
    """R-TRACE-3: a daemon killed (SIGKILL) while a compaction runs leaves no compaction
    behind: one that went on would write the ``.partial`` file the next start deletes, and
    then compacts into again, at the same time as the next start's own compaction."""
    segment = tmp_path / "alpha-20261121T090957-1-00001.jsonl"
    os.mkfifo(segment)  # a compaction that does not end by itself: its source never opens
    keeper = (
        "from pathlib import Path\n"
        "from brokerd.config import TraceConfig\n"
        "from brokerd.traces.segments import SegmentKeeper\n"
        f"d = Path({str(tmp_path)!r})\n"
        "SegmentKeeper(TraceConfig(directory=d), d, 'alpha').compact(\n"
        f"    d / {segment.name!r})\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", keeper], cwd=os.getcwd())
    compaction = None
    try:
        deadline = time.monotonic() + 20
        while compaction is None and time.monotonic() < deadline:
            for child in _children(parent.pid):
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
                if b"brokerd.traces.columnar" in cmdline:
                    compaction = child
            time.sleep(0.02)
        assert compaction is not None, "the compaction did not start"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while _alive(compaction) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(compaction), "the compaction outlived the daemon"
    finally:
        parent.kill()
        parent.wait()
        if compaction is not None and _alive(compaction):
            os.kill(compaction, 9)
