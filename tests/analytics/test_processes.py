"""The daemons' processes read from the segments' names (brokerd/analytics/processes.py,
R-REPORT-1): restarts, kills (a torn last line, or a successor's start marker saying the
stop was not clean) and graceful stops, without Spark."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from brokerd.analytics.processes import processes, restarts
from brokerd.traces import columnar


def _segment(
    root: Path, instance: str, pid: int, lines: list[tuple[str, str]], tail: str = ""
) -> Path:
    """A segment of ``lines`` (time, event); "started+clean" is a clean start marker."""
    path = root / f"{instance}-20261129T070000-{pid}-00001.jsonl"
    out = []
    for ts, event in lines:
        line: dict[str, object] = {"v": 1, "instance": instance, "ts": ts, "event": event}
        if event.startswith("started"):
            line.update(event="started", clean=event == "started+clean")
        out.append(json.dumps(line) + "\n")
    path.write_text("".join(out) + tail)
    return path


def _as(form: str, path: Path) -> Path:
    """The segment as a daemon of this version (``parquet``) or an earlier one (``gz``)
    leaves it once closed, or as it is (``jsonl``)."""
    if form == "jsonl":
        return path
    stem = path.name.removesuffix(".jsonl")
    if form == "parquet":
        out = path.with_name(stem + ".parquet")
        columnar.write(path, out)
    else:
        out = path.with_name(stem + ".jsonl.gz")
        out.write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    return out


@pytest.mark.parametrize("form", ["jsonl", "parquet", "gz"])
def test_restarts_kills_and_stops_from_the_segments(tmp_path: Path, form: str) -> None:
    """The same processes from plain, compacted and gzip segments (a compacted one's first
    and last rows are read, not the whole file)."""
    t = "2026-11-29T07:00:0{}.000000Z".format
    files = [
        _segment(tmp_path, "alpha", 1, [(t(0), "message_sent"), (t(1), "delivered")]),
        _segment(tmp_path, "alpha", 2, [(t(3), "message_sent")]),
        _segment(tmp_path, "beta-1", 3, [(t(0), "delivered")], tail='{"v":1,"inst'),  # torn
        _segment(tmp_path, "beta-1", 4, [(t(5), "delivered")]),
        _segment(tmp_path, "gamma", 5, [(t(0), "delivered"), (t(2), "stopped")]),
        _segment(tmp_path, "gamma", 6, [(t(4), "started+clean")]),
        _segment(tmp_path, "delta", 7, [(t(0), "delivered")]),
        _segment(tmp_path, "delta", 8, [(t(6), "started")]),  # clean: false
    ]
    files = [_as(form, f) for f in files]
    stray = tmp_path / "notes.jsonl"
    stray.write_text('{"ts": "2026-11-29T07:00:00Z"}\n')
    found = processes([*files, stray])
    ended = {(p.instance, p.pid): p.ended for p in found}
    assert ended == {
        ("alpha", 1): "restarted",
        ("alpha", 2): "running",
        ("beta-1", 3): "killed",
        ("beta-1", 4): "running",
        ("delta", 7): "killed",
        ("delta", 8): "running",
        ("gamma", 5): "stopped",
        ("gamma", 6): "running",
    }
    alpha = [p for p in found if p.instance == "alpha"]
    assert (alpha[0].first_ts, alpha[0].last_ts) == (t(0), t(1))
    assert restarts(found) == 4
