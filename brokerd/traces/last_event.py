"""The last event of an instance on disk: the one a start names in its ``started`` marker
and numbers on from (R-TRACE-1; docs/traces.md "Event numbers and restarts").

Event numbers ``n`` only grow, from one start to the next, so the last event is the one
with the highest ``n`` among the segments' last events, whatever the files' times or
names say: both come from the wall clock, which may have been set back between two runs
(their segments then look older than the ones before them). Each segment tells its
highest ``n`` cheaply: a plain one by its last whole line (read backwards,
:data:`TAIL_BYTES` at a time), a compacted one by the statistics its footer keeps of the
``n`` column (no page is read, so a page damaged on disk does not hide its numbers). A
start thus reads a footer or a tail per segment that retention keeps, and the last rows
of the one that wins. Gzip segments, compacted by earlier versions, are read whole: only
the newest of them by file time is looked at, as those versions did (all were written
before any segment of this version).

May import: ``brokerd.traces.columnar``, ``brokerd.traces.names``,
``brokerd.traces.segments``.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokerd.traces import columnar
from brokerd.traces.names import CLOSED_SUFFIX, COMPACT_SUFFIX, GZIP_SUFFIX, open_regular
from brokerd.traces.segments import instance_segments, is_columnar, segment_lines

TAIL_BYTES = 64 * 1024
"""How much of a plain segment a start reads back at a time to find its last event
(further back while none of its lines is whole) ..."""

TAIL_LINES = 1000
"""... and how many last lines of a compacted one (its last row groups, or the whole of a
gzip one, read through to its end)."""

log = logging.getLogger("brokerd.traces.writer")


@dataclass(frozen=True)
class LastEvent:
    """The last event of an instance on disk, and the segment that holds it."""

    event: dict[str, Any]
    """As its line holds it; of a compacted segment whose last rows do not read, only its
    ``n`` and ``ts`` (the highest its footer knows of: no ``event``, so not ``clean``)."""
    segment: Path


def last_event(directory: Path, instance: str) -> LastEvent | None:
    """The event of ``instance`` with the highest ``n`` in ``directory``'s closed and
    compacted segments (see the module docstring); None without any. Segments whose
    events carry no ``n`` count only when none does: then the newest by file time."""
    found: list[tuple[float, str, Path]] = []
    for suffix in (CLOSED_SUFFIX, COMPACT_SUFFIX, GZIP_SUFFIX):
        paths = instance_segments(directory, instance, suffix)
        dated = [(path.stat().st_mtime, path.name, path) for path in paths]
        found += [max(dated)] if suffix == GZIP_SUFFIX and dated else dated
    best: tuple[int, float, str, Path] | None = None
    read: dict[Path, dict[str, Any]] = {}
    for mtime, name, path in found:
        n, event = _highest(path, instance)
        if event is not None:
            read[path] = event
        if n is not None and (best is None or (n, mtime, name) > best[:3]):
            best = (n, mtime, name, path)
    if best is not None:
        n, _, _, path = best
        event = read.get(path)
        if event is None or event.get("n") != n:
            event = _event_numbered(path, instance, n)
        return LastEvent(event, path)
    for _, _, path in sorted(found, reverse=True):  # no n anywhere: the newest by file time
        event = read.get(path) or _last_line(_last_first(path), instance)
        if event is not None:
            return LastEvent(event, path)
    return None


def _highest(path: Path, instance: str) -> tuple[int | None, dict[str, Any] | None]:
    """A segment's highest ``n``, and its last event when that was read to find it."""
    if is_columnar(path):
        try:
            return _number(columnar.highest(path, "n")), None
        except (OSError, ValueError) as exc:  # Arrow's errors are OSErrors or ValueErrors
            log.warning("trace segment %s: its footer does not read: %s", path, exc)
            return None, None
    event = _last_line(_last_first(path), instance)
    return (None if event is None else _number(event.get("n"))), event


def _event_numbered(path: Path, instance: str, n: int) -> dict[str, Any]:
    """The event numbered ``n`` among a compacted segment's last rows; if they do not read
    (a damaged page), ``n`` with the latest ``ts`` its footer knows of."""
    try:
        lines = columnar.edge_lines(path, TAIL_LINES, last=True)
    except (OSError, ValueError) as exc:
        log.warning("trace segment %s: its last events do not read: %s", path, exc)
        try:
            ts = columnar.highest(path, "ts")
        except (OSError, ValueError):
            ts = None
        return {"n": n, "ts": ts}
    for event in _events(reversed(lines), instance):
        if event.get("n") == n:
            return event
    return {"n": n}


def _number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _last_first(path: Path) -> Iterable[bytes]:
    """A segment's lines, the last first: a plain one's read backwards; of a gzip or a
    compacted one, the last :data:`TAIL_LINES`."""
    if is_columnar(path):
        try:
            return reversed(columnar.edge_lines(path, TAIL_LINES, last=True))
        except (OSError, ValueError) as exc:
            log.warning("trace segment %s: its last events do not read: %s", path, exc)
            return ()
    if path.name.endswith(GZIP_SUFFIX):
        return reversed(collections.deque(segment_lines(path), maxlen=TAIL_LINES))
    return _lines_from_the_end(path)


def _events(lines: Iterable[bytes], instance: str) -> Iterator[dict[str, Any]]:
    """The events of ``instance`` among ``lines``, those that do not parse (torn) skipped."""
    for raw in lines:
        try:
            event = json.loads(raw)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("instance") == instance:
            yield event


def _last_line(lines: Iterable[bytes], instance: str) -> dict[str, Any] | None:
    """The first event of ``instance`` among ``lines`` (the last first); a plain segment's
    file is closed once it is found."""
    try:
        return next(_events(lines, instance), None)
    finally:
        if isinstance(lines, Generator):
            lines.close()


def _lines_from_the_end(path: Path) -> Iterator[bytes]:
    """A plain segment's lines, the last first, read backwards :data:`TAIL_BYTES` at a time:
    a line longer than that (a ``discarded`` listing thousands of messages) is read whole,
    never taken for a torn one."""
    with open_regular(path) as f:
        end = f.seek(0, os.SEEK_END)
        # the end of a line that begins before the chunk being read, its last chunk first
        # (joined once the line's start is found: a long line is copied once)
        rest: list[bytes] = []
        while end > 0:
            start = max(0, end - TAIL_BYTES)
            f.seek(start)
            chunk = f.read(end - start)
            end = start
            if start > 0 and b"\n" not in chunk:  # inside one long line
                rest.append(chunk)
                continue
            pieces = chunk.split(b"\n")
            if rest:
                pieces[-1] += b"".join(reversed(rest))
            rest = [pieces.pop(0)] if start > 0 else []  # may begin before this chunk
            yield from reversed(pieces)
