"""Trace segment files at rest: their names, reading them back, compaction and retention.

A segment is written as plain JSON Lines (``.jsonl.open``, renamed ``.jsonl`` when
closed: :mod:`brokerd.traces.writer`); a closed one is compacted in the background into
one columnar file (``.parquet``: :mod:`brokerd.traces.columnar`), whose columns Spark
reads without parsing JSON; gzip files (``.jsonl.gz``) that earlier versions compacted
are still read. Retention deletes the oldest closed segments past ``trace.max_total_mb`` or
``trace.max_age_hours``, never the newest (docs/traces.md "Compaction" and "Retention";
R-TRACE-3).

Files are created 0600 and the trace directory is kept 0700: segments name services and
carry timings (R-TRACE-3).

May import: ``brokerd.config``, ``brokerd.parent_death``, ``brokerd.traces.columnar``.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import io
import logging
import os
import re
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from brokerd.config import TraceConfig
from brokerd.directories import make_directory, sync_directory
from brokerd.parent_death import DIES_WITH_PARENT
from brokerd.traces import columnar
from brokerd.traces.names import (
    CLOSED_SUFFIX,
    COMPACT_SUFFIX,
    COMPACT_SUFFIXES,
    GZIP_SUFFIX,
    NOT_REGULAR,
    OPEN_SUFFIX,
    is_regular,
    open_regular,
    require_regular,
    stem,
)

PARTIAL_SUFFIX = ".parquet.partial"
"""A compaction being written: deleted at the next start if a crash left it."""
PARTIAL_SUFFIXES = (PARTIAL_SUFFIX, ".jsonl.gz.partial")
SEGMENT_SUFFIXES = (CLOSED_SUFFIX, OPEN_SUFFIX, *COMPACT_SUFFIXES)
STOP_COMPACT_BYTES = 1024 * 1024
"""Below this a segment a graceful stop closes is compacted at the next start instead: the
compaction's process costs about half a second to start, more than such a segment saves."""
COMPACTION_TIMEOUT = 600.0
"""Seconds a compaction's process may take (a 64 MB segment takes a few)."""
STOP_COMPACT_SECONDS = 3.0
"""A graceful stop compacts for at most this long: a compaction still running then is cut
short, and it and the segments not yet compacted are left for the next start. A stop is
waited for by an init system or a container engine (Docker's, 10 s) before a SIGKILL, and
a compaction runs below the daemon's priority, so on a busy machine it may take long."""
_POLL_SECONDS = 0.1
"""How often a compaction's wait looks at the stop's deadline."""
FILE_MODE = 0o600
DIRECTORY_MODE = 0o700

SEGMENT_NAME = re.compile(
    r"^(?P<instance>.+)-(?P<stamp>\d{8}T\d{6})-(?P<pid>\d+)-(?P<n>\d+)(?P<suffix>\..+)$"
)
"""A segment's name: ``<instance>-<UTC start>-<pid>-<n><suffix>`` (the writer's
``_open_segment``); the instance is whatever comes before the last such tail, so an
instance whose name begins with another's (``alpha``, ``alpha-2``) is told apart."""

log = logging.getLogger("brokerd.traces.segments")


def instance_segments(directory: Path, instance: str, suffix: str) -> list[Path]:
    """The files of ``instance`` in ``directory`` whose names end in ``suffix``, oldest name
    first: the instance read from each name exactly, never matched as a prefix (another
    instance sharing the directory keeps its files, R-TRACE-3). What is not a regular file
    (a FIFO named like a segment) is noted and left out: never read, compacted nor deleted."""
    found = []
    for path in directory.glob(f"{glob.escape(instance)}-*{suffix}"):
        m = SEGMENT_NAME.match(path.name)
        if m is not None and m["instance"] == instance:
            if is_regular(path):
                found.append(path)
            else:
                log.warning("trace file %s skipped: %s", path, NOT_REGULAR)
    return sorted(found)


def private_directory(directory: Path) -> None:
    """Create ``directory`` (and its parents) if need be, their names durable, and make it
    0700."""
    make_directory(directory, DIRECTORY_MODE)
    if directory.stat().st_mode & 0o777 != DIRECTORY_MODE:
        os.chmod(directory, DIRECTORY_MODE)


def create_private(path: Path) -> BinaryIO:
    """``path`` opened for appending, unbuffered, created 0600 (and made 0600 if it was not)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    if os.fstat(fd).st_mode & 0o777 != FILE_MODE:
        os.fchmod(fd, FILE_MODE)
    return os.fdopen(fd, "ab", buffering=0)


def is_compressed(path: Path) -> bool:
    """A closed segment compressed at rest (R-TRACE-3): columnar (:func:`is_columnar`),
    or gzip (written by earlier versions)."""
    return path.name.endswith(COMPACT_SUFFIXES)


def is_columnar(path: Path) -> bool:
    """A segment compacted into one Parquet file (:mod:`brokerd.traces.columnar`)."""
    return path.name.endswith(COMPACT_SUFFIX)


def open_segment(path: Path) -> BinaryIO:
    """A segment's bytes as JSON Lines (a ``.gz`` segment is decompressed as it is read, a
    ``.parquet`` one turned back into lines); ``OSError`` for a file that is not a regular
    one, never opened (:func:`brokerd.traces.names.open_regular`)."""
    if is_columnar(path):
        require_regular(path)
        return io.BytesIO(b"".join(columnar.lines(path)))
    if path.name.endswith(".gz"):
        require_regular(path)
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open_regular(path)


def unreadable(path: Path) -> str | None:
    """Why a compressed segment does not read to its end (a compacted one's footer, page
    checksum or compression damaged; a gzip one cut short), or None (a plain segment
    always reads: its bad lines are skipped one by one). It is read through. Closed
    segments are compressed at rest (R-TRACE-3); a reader names one that does not read
    and reads the others. A file that is not a regular one is not read: that is why."""
    if not is_regular(path):
        return NOT_REGULAR
    if is_columnar(path):
        return columnar.check(path)
    if not path.name.endswith(GZIP_SUFFIX):
        return None
    try:
        with gzip.open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    except (OSError, EOFError, zlib.error) as exc:
        return " ".join(str(exc).split()) or type(exc).__name__
    return None


def segment_lines(path: Path) -> Iterator[bytes]:
    """A segment's lines; a compacted segment that ends early or does not read (it cannot:
    compaction renames only a whole file) ends the lines, never raises."""
    try:
        if is_columnar(path):
            require_regular(path)
            yield from columnar.lines(path)
            return
        with open_segment(path) as f:
            yield from f
    except (EOFError, OSError, zlib.error, ValueError) as exc:  # Arrow's errors are ValueErrors
        log.warning("trace segment %s ends early: %s", path, exc)


def without_duplicates(paths: list[Path]) -> list[Path]:
    """``paths`` less each ``.jsonl`` whose compacted file is there too (a compaction done
    but for deleting its source): it holds the same lines."""
    compacted = {(p.parent, stem(p)) for p in paths if is_compressed(p)}
    return [
        p
        for p in paths
        if not (p.name.endswith(CLOSED_SUFFIX) and (p.parent, stem(p)) in compacted)
    ]


def compaction_command(path: Path, partial: Path) -> list[str]:
    """The command that compacts ``path`` into ``partial``, dying with the process that
    runs it (:mod:`brokerd.parent_death`): a compaction left running by a daemon killed
    (SIGKILL) would write the ``.partial`` the next start deletes and compacts into again,
    at the same time as that start's own compaction of the same segment."""
    command = [sys.executable, "-m", "brokerd.traces.columnar", str(path), str(partial)]
    return [*DIES_WITH_PARENT, *command]


class SegmentKeeper:
    """Compaction and retention of one instance's closed segments in its trace directory.

    Runs in a worker thread (:meth:`tidy`); the writer's open segment is never touched:
    only closed (``.jsonl``) and compacted files of this instance are compacted or deleted.
    """

    def __init__(self, config: TraceConfig, directory: Path, instance: str) -> None:
        self.config = config
        self.directory = directory
        self.instance = instance
        self.segments_compacted = 0
        self.segments_deleted = 0
        self.bytes_before = 0
        """Plain bytes of the segments compacted so far ..."""
        self.bytes_after = 0
        """... and their compacted bytes."""
        self._deadline: float | None = None
        self.compacting: Path | None = None
        """The segment whose compaction runs now, if one does."""
        self.holding: str | None = None
        """The name (without its suffix) of the segment that holds the instance's last
        event: the one its writer opened last, or before that the one a start found it in
        (:mod:`brokerd.traces.last_event`). Retention never deletes it, whatever its file
        time says (set by the writer's thread, read by the keeper's)."""

    def stop_by(self, deadline: float) -> None:
        """Compact no more after ``deadline`` (``time.monotonic``): a graceful stop.
        :meth:`tidy` begins no compaction past it, and one it runs then, in its worker
        thread, is cut short. A compaction called on its own (:meth:`compact`, a tool's)
        always runs whole."""
        self._deadline = deadline

    def _out_of_time(self) -> bool:
        deadline = self._deadline  # read once: written by another thread
        return deadline is not None and time.monotonic() >= deadline

    def _mine(self, suffix: str) -> list[Path]:
        return instance_segments(self.directory, self.instance, suffix)

    def recover(self) -> None:
        """At a start: drop compactions a crash cut short, and the sources of those that
        were whole (renamed) but not yet deleted; make every segment of ours 0600."""
        for suffix in PARTIAL_SUFFIXES:
            for partial in self._mine(suffix):
                partial.unlink(missing_ok=True)
        mine = [p for suffix in SEGMENT_SUFFIXES for p in self._mine(suffix)]
        kept = set(without_duplicates(mine))
        for path in mine:
            if path not in kept:
                path.unlink(missing_ok=True)
                continue
            if path.stat().st_mode & 0o777 != FILE_MODE:
                os.chmod(path, FILE_MODE)

    def tidy(self, now: float | None = None, *, stopping: bool = False) -> None:
        """Compact the closed segments (with ``trace.compress``), then apply retention.
        Errors (a full disk) are logged; what could not be compacted stays as it is.
        ``stopping`` (a graceful stop): a segment under :data:`STOP_COMPACT_BYTES` is left
        for the next start, which compacts it in the background; the stop does not wait
        for a compaction's process to start. Past the deadline of :meth:`stop_by`, what is
        not compacted is left for the next start, and the stop's pass (``stopping``) logs
        how many segments that is: once, however many passes the deadline cut."""
        if self.config.compress:
            waiting = [
                path
                for path in self._mine(CLOSED_SUFFIX)
                if not (stopping and path.stat().st_size < STOP_COMPACT_BYTES)
            ]
            for done, path in enumerate(waiting):
                try:
                    if self._out_of_time() or self.compact(path, cut_short=True) is None:
                        if stopping:  # the stop's own pass, after any cut here, says it once
                            log.info(
                                "%d trace segment(s) not compacted by the stop's deadline,"
                                " left for the next start",
                                len(waiting) - done,
                            )
                        break
                except (OSError, subprocess.SubprocessError) as exc:
                    log.warning("cannot compact trace segment %s: %s", path, exc)
                    break
        try:
            self.retain(time.time() if now is None else now)
        except OSError as exc:
            log.warning("trace retention in %s: %s", self.directory, exc)

    def compact(self, path: Path, *, cut_short: bool = False) -> Path | None:
        """``path`` (a closed ``.jsonl``) as one Parquet file, written by a process of its
        own (``python -m brokerd.traces.columnar``: Arrow stays out of the daemon) beside
        it as ``.partial``, fsynced, renamed ``.parquet`` (with the source's times, so the
        newest segment stays the newest), then the source deleted. A crash at any point
        leaves one whole copy (:meth:`recover`). ``cut_short``: ended at a stop's deadline
        (:meth:`stop_by`), which returns None, the segment left as it was."""
        target = path.with_name(stem(path) + COMPACT_SUFFIX)
        partial = path.with_name(stem(path) + PARTIAL_SUFFIX)
        source = path.stat()
        self.compacting = path
        try:
            if not self._run_compaction(path, partial, cut_short):
                partial.unlink(missing_ok=True)
                return None
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        finally:
            self.compacting = None
        os.utime(partial, ns=(source.st_atime_ns, source.st_mtime_ns))
        partial.rename(target)
        sync_directory(self.directory)
        path.unlink()
        self.segments_compacted += 1
        self.bytes_before += source.st_size
        self.bytes_after += target.stat().st_size
        return target

    def _run_compaction(self, path: Path, partial: Path, cut_short: bool) -> bool:
        """Run the compaction's process; False if a stop's deadline cut it short."""
        started = time.monotonic()
        with subprocess.Popen(
            compaction_command(path, partial),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        ) as process:
            while True:
                try:
                    _, stderr = process.communicate(timeout=_POLL_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    if process.poll() is not None:
                        continue  # it has just ended: its output is read, its work kept
                    cut = cut_short and self._out_of_time()
                    if cut or time.monotonic() - started > COMPACTION_TIMEOUT:
                        process.kill()
                        process.communicate()
                        if cut:
                            return False
                        raise subprocess.TimeoutExpired(process.args, COMPACTION_TIMEOUT) from None
        if process.returncode != 0:
            why = stderr.decode("utf-8", "replace").strip().splitlines()
            raise OSError(f"compaction exited {process.returncode}: {why[-1] if why else ''}")
        return True

    def retain(self, now: float) -> None:
        """Delete this instance's oldest closed segments while the directory's segments of
        this instance (the open one counted) exceed ``trace.max_total_mb``, and every
        closed segment last written more than ``trace.max_age_hours`` ago; never the
        newest (by last write, then name): the open one while one is open, else the one
        last closed, which holds the last event a graceful stop (its ``stopped`` marker)
        or a rotation left, the event the next start names and numbers on from
        (R-TRACE-1). Nor the segment that holds the last event (:attr:`holding`), when a
        clock set back made it look older than others. Under a limit below one segment's
        size, that one stays over it."""
        limit = self.config.max_total_mb * 1024 * 1024
        max_age = self.config.max_age_hours * 3600
        if not limit and not max_age:
            return
        segments = []
        total = 0
        for path in self._mine(""):
            name = path.name
            if not name.endswith(SEGMENT_SUFFIXES):  # a partial compaction is not counted
                continue
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                total += stat.st_size
                segments.append((stat.st_mtime, name, path, stat.st_size))
        segments.sort()
        # the newest is kept, and so is an open one (being written, it is the newest), and
        # the one that holds the last event
        holding = self.holding
        closed = [
            s for s in segments[:-1] if not s[1].endswith(OPEN_SUFFIX) and stem(s[2]) != holding
        ]
        for mtime, _, path, size in closed:
            too_old = bool(max_age) and now - mtime > max_age
            too_big = bool(limit) and total > limit
            if not (too_old or too_big):
                break
            path.unlink(missing_ok=True)
            total -= size
            self.segments_deleted += 1
            log.info(
                "trace retention deleted %s (%s)",
                path.name,
                "older than max_age_hours" if too_old else "over max_total_mb",
            )

    def view(self) -> dict[str, int]:
        return {
            "trace_segments_compacted": self.segments_compacted,
            "trace_segments_deleted": self.segments_deleted,
            "trace_compacted_bytes_before": self.bytes_before,
            "trace_compacted_bytes_after": self.bytes_after,
        }
