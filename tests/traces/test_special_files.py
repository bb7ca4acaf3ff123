"""Files in a trace directory that are named like segments but are not regular files (a
FIFO someone made there): every reader skips them with a note, before opening them, so
no read waits on a writer that never comes (docs/traces.md "Segments that are not
files"; R-TRACE-3, R-REPORT-2): ``read_events`` and its listing, ``brokerd analyze``'s
listing and the reads done while Spark starts, ``brokerctl trace``, and a daemon's own
writer at its start."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from brokerd.admin import trace
from brokerd.admin.ctl import main
from brokerd.config import TraceConfig
from brokerd.errors import AnalyticsError
from brokerd.traces.names import NOT_REGULAR
from brokerd.traces.writer import TraceWriter, read_events, segment_files

T = TypeVar("T")

WAIT = 10.0
"""Seconds a reader may take over a few small files before it counts as blocked."""

CID = str(uuid.uuid4())


def _line(instance: str, n: int, event: str, **fields: object) -> str:
    return json.dumps(
        {
            "v": 1,
            "instance": instance,
            "n": n,
            "ts": f"2026-11-29T07:00:00.{n:06d}Z",
            "event": event,
            **fields,
        }
    )


@pytest.fixture
def traces(tmp_path: Path) -> Iterator[Path]:
    """A trace directory: one real segment of ``alpha`` holding a message of :data:`CID`,
    and FIFOs named as alpha's plain, open and compacted segments (one in a folder
    below). Whatever still waits on a FIFO when the test ends is let go."""
    directory = tmp_path / "traces"
    (directory / "below").mkdir(parents=True, mode=0o700)
    os.chmod(directory, 0o700)
    (directory / "alpha-20261129T070000-1-00001.jsonl").write_text(
        _line("alpha", 1, "started")
        + "\n"
        + _line("alpha", 2, "message_sent", conversation_id=CID, initiator=True, seq=1)
        + "\n"
        + _line("alpha", 3, "stopped")
        + "\n"
    )
    fifos = [
        directory / "alpha-20261129T080000-1-00002.jsonl",
        directory / "alpha-20261129T080000-1-00003.jsonl.open",
        directory / "alpha-20261129T060000-1-00004.parquet",
        directory / "below" / "alpha-20261129T060000-1-00005.jsonl.gz",
    ]
    for fifo in fifos:
        os.mkfifo(fifo, 0o600)
    yield directory
    for fifo in fifos:  # a reader blocked in open() gets an end of file
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def _in_time(call: Callable[[], T]) -> T:
    """``call()``'s result, which must come within :data:`WAIT` seconds (a read of a FIFO
    would wait for ever)."""
    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive(), "blocked reading a trace file that is not a regular file"
    if errors:
        raise errors[0]
    return out[0]


def test_read_events_skips_what_is_not_a_file(
    traces: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    files = _in_time(lambda: segment_files([traces]))
    assert [f.name for f in files] == ["alpha-20261129T070000-1-00001.jsonl"]
    assert caplog.text.count("not a regular file") == 4, caplog.text
    fifo = traces / "alpha-20261129T080000-1-00002.jsonl"
    events = _in_time(lambda: list(read_events([fifo, *files])))
    assert [e["event"] for e in events] == ["started", "message_sent", "stopped"]


def test_analyze_lists_and_checks_files_alone(traces: Path) -> None:
    from brokerd.analytics.load import damaged_segments, plain_bytes, trace_files
    from brokerd.analytics.processes import processes

    files = _in_time(lambda: trace_files([traces]))
    assert [f.name for f in files] == ["alpha-20261129T070000-1-00001.jsonl"]
    assert _in_time(lambda: damaged_segments(files)) == {}
    assert _in_time(lambda: plain_bytes(files)) > 0
    (process,) = _in_time(lambda: processes(files))
    assert process.instance == "alpha"
    fifo = traces / "alpha-20261129T060000-1-00004.parquet"
    assert _in_time(lambda: damaged_segments([fifo])) == {fifo: NOT_REGULAR}
    with pytest.raises(AnalyticsError, match="not a regular file"):
        _in_time(lambda: trace_files([fifo]))


def test_brokerctl_trace_skips_what_is_not_a_file(
    traces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-REPORT-2."""
    status = _in_time(lambda: main(["trace", CID, "1", "--traces", str(traces)]))
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "message_sent" in out
    assert err.count("not a regular file") == 4, err
    fifo = traces / "alpha-20261129T080000-1-00002.jsonl"
    events = _in_time(lambda: list(trace._lines(fifo)))
    assert events == []
    assert "not a regular file" in capsys.readouterr().err


async def test_a_writer_starts_past_fifos_named_as_its_segments(traces: Path) -> None:
    """R-TRACE-1: the start finds the last event on disk in alpha's real segment."""
    writer = TraceWriter(TraceConfig(directory=traces), "alpha")
    last = _in_time(writer._last_event)
    assert last is not None and last["event"] == "stopped"
    _in_time(writer.keeper.recover)
    _in_time(writer._recover_open_segments)
    assert (traces / "alpha-20261129T080000-1-00003.jsonl.open").exists()  # left as it is
