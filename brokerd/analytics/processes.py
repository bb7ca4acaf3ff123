"""The daemon processes behind a trace set: when each instance started, stopped or died.

A trace writer names its segments ``<instance>-<UTC start>-<pid>-<n>.jsonl``
(docs/traces.md): the segments of one process share its pid, and an instance
whose segments carry several pids was restarted. A daemon that is its container's
first process has the same pid at every start: a new writer numbers its segments from
1 again and begins with its ``started`` marker, so a segment whose number does not
follow the one before (or that began in the same second) and begins with that marker
begins a process of its own. :func:`processes` reads only the segment names and, per
process, the first and last lines of its first and last segments (a bounded read from
each end, never a whole file; when the last segment holds no whole line, the segments
before it, newest first, until one does; and the first lines of a segment that may begin
a new writer), so it runs on the driver without Spark and costs about the same for any
size of trace set.

How a process ended is what its traces show:

* ``restarted``: a later process of the same instance wrote traces, and this one's
  last segment ends cleanly;
* ``killed``: its last segment ends in a torn line (a crash in the middle of a
  write: ``kill -9``, a power cut; a segment holding nothing but a torn line too), or
  the next process's ``started`` event says the previous stop was not clean (writers
  that record their starts);
* ``stopped``: its last event is a ``stopped`` event (a graceful stop, by writers
  that record it);
* ``running``: the instance's latest process; it may still be running.

A process killed between two writes leaves no torn line: it shows as
``restarted`` (or ``running``), and the audit's findings around its restart
tell the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokerd.traces import columnar
from brokerd.traces.names import open_regular
from brokerd.traces.segments import (
    SEGMENT_NAME,
    SEGMENT_SUFFIXES,
    is_columnar,
    is_compressed,
    open_segment,
)

TAIL_BYTES = 64 * 1024
"""How much of a segment's end is read to find its last line (a line is far shorter)."""
READ_BYTES = 1 << 20
"""A gzip segment is read through in pieces of this size, its end kept."""
HEAD_BYTES = 64 * 1024
"""How much of a segment's start is read to find its first line."""
EDGE_ROWS = 256
"""The rows of a compacted segment's start or end read to find its first or last line."""

_TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z$")


@dataclass(frozen=True)
class Process:
    """One daemon process of an instance, as its segments show it."""

    instance: str
    pid: int
    first_ts: str
    last_ts: str
    ended: str
    """``restarted``, ``killed``, ``stopped`` or ``running`` (module docstring)."""
    segments: int

    def view(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "pid": self.pid,
            "first_event": self.first_ts,
            "last_event": self.last_ts,
            "ended": self.ended,
            "segments": self.segments,
        }


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        event = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    ts = event.get("ts")
    return event if isinstance(ts, str) and _TS.match(ts) else None


def _edge(path: Path, *, last: bool) -> list[bytes]:
    """The first or last lines of a compacted segment; none when it does not read (the
    analysis names it, and leaves it out)."""
    try:
        return columnar.edge_lines(path, EDGE_ROWS, last=last)
    except (OSError, ValueError):  # Arrow's errors
        return []


def _head(path: Path) -> list[dict[str, Any]]:
    """The events among the first lines of the segment."""
    if is_columnar(path):  # its first rows alone
        lines = _edge(path, last=False)
    else:
        with open_segment(path) as f:
            lines = f.read(HEAD_BYTES).split(b"\n")[:-1]
    return [e for raw in lines if (e := _parse(raw)) is not None]


def _first_event(path: Path) -> dict[str, Any] | None:
    """The earliest event among the first lines of the segment."""
    events = _head(path)
    return min(events, key=lambda e: str(e["ts"])) if events else None


def _writers(segments: list[tuple[str, int, Path]]) -> list[list[tuple[str, int, Path]]]:
    """The segments of one (instance, pid), in order, cut where a new writer began: a
    daemon started again under the same pid (its container's first process) writes
    segments numbered from 1 again, the first beginning with its ``started`` marker. Only a
    segment whose number does not follow the one before (or that began in the same
    second, where a new writer skips the names taken) is read for the marker."""
    runs: list[list[tuple[str, int, Path]]] = []
    for segment in segments:
        if runs:
            stamp, n, _ = runs[-1][-1]
            follows = segment[1] == n + 1 and segment[0] != stamp
            if follows or not any(e.get("event") == "started" for e in _head(segment[2])):
                runs[-1].append(segment)
                continue
        runs.append([segment])
    return runs


def _tail(path: Path) -> tuple[bytes, int]:
    """The last :data:`TAIL_BYTES` of a plain or gzip segment's lines, and their size."""
    if is_compressed(path):  # gzip, of an earlier version: decompressed as it is read
        tail = b""
        size = 0
        with open_segment(path) as f:
            while chunk := f.read(READ_BYTES):
                tail = (tail + chunk)[-TAIL_BYTES:]
                size += len(chunk)
        return tail, size
    with open_regular(path) as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - TAIL_BYTES))
        return f.read(), size


def _last_event(path: Path) -> tuple[dict[str, Any] | None, bool]:
    """The segment's last readable event (its time the latest of the last lines), and
    whether the segment ends in a torn line."""
    if is_columnar(path):  # its last rows alone (a closed segment is whole)
        lines = _edge(path, last=True)
        torn = bool(lines) and not lines[-1].endswith(b"\n")
    else:
        tail, size = _tail(path)
        torn = bool(tail) and not tail.endswith(b"\n")
        lines = tail.split(b"\n")
        if size > TAIL_BYTES:
            lines = lines[1:]  # the first piece may be cut by the read
    events = [e for raw in lines if (e := _parse(raw)) is not None]
    if not events:
        return None, torn
    latest = max(str(e["ts"]) for e in events)
    return {**events[-1], "ts": latest}, torn


_Span = tuple[str, int, dict[str, Any], dict[str, Any], bool, int]
"""A process as :func:`processes` orders it: instance, pid, first and last events, whether
its last segment ends in a torn line, and its segments."""


def _span(instance: str, pid: int, segments: list[tuple[str, int, Path]]) -> _Span | None:
    """The process that wrote ``segments`` (in order), none when they hold no event."""
    first = next(
        (e for _, _, p in segments if (e := _first_event(p)) is not None),
        None,
    )
    # killed right after rotating, its last segment may hold no whole line (none, or
    # a torn one): its last event is in an earlier segment, its tear in the last
    last, torn = _last_event(segments[-1][2])
    if last is None:
        last = next(
            (e for _, _, p in reversed(segments[:-1]) if (e := _last_event(p)[0]) is not None),
            None,
        )
    if first is None or last is None:
        return None
    return (instance, pid, first, last, torn, len(segments))


def processes(files: Iterable[Path]) -> list[Process]:
    """Every process whose segments are among ``files``, by instance and start time."""
    groups: dict[tuple[str, int], list[tuple[str, int, Path]]] = {}
    for path in files:
        m = SEGMENT_NAME.match(path.name)
        if m is None or m["suffix"] not in SEGMENT_SUFFIXES:
            continue  # a file named otherwise: its events count, its process is unknown
        key = (m["instance"], int(m["pid"]))
        groups.setdefault(key, []).append((m["stamp"], int(m["n"]), path))
    spans: list[_Span] = []
    for (instance, pid), found in groups.items():
        for segments in _writers(sorted(found)):
            if (span := _span(instance, pid, segments)) is not None:
                spans.append(span)
    spans.sort(key=lambda s: (s[0], s[2]["ts"]))
    out: list[Process] = []
    for n, (instance, pid, first, last, torn, count) in enumerate(spans):
        following = spans[n + 1][2] if n + 1 < len(spans) and spans[n + 1][0] == instance else None
        if last.get("event") == "stopped":
            ended = "stopped"
        elif torn or (
            following is not None
            and following.get("event") == "started"
            and following.get("clean") is False
        ):
            ended = "killed"
        elif following is not None:
            ended = "restarted"
        else:
            ended = "running"
        out.append(Process(instance, pid, first["ts"], last["ts"], ended, count))
    return out


def restarts(found: list[Process]) -> int:
    """How many processes began after an earlier one of the same instance."""
    instances = {p.instance for p in found}
    return len(found) - len(instances)
