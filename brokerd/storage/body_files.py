"""Large bodies kept beside a database's SQLite file, in append-only segment files.

A body of :data:`STORED_FROM` bytes or more that a transmission-queue row (a message
sent) or a ``message_fragments`` row (a fragment received) would carry goes instead
into the current segment of ``<file>-bodies/``; the row keeps where
(``stored_at``: the segment's number times 2**40 plus the offset) and how long
(``stored_length``), with an empty ``body``. SQLite then writes a row of a few dozen
bytes, not a chain of overflow pages that goes to the WAL, is copied again by the
checkpoint and is read back page by page when the row is deleted
(docs/performance.md, "What bounds W3").

Durability (R-DLG-5) is the file's as much as the row's: the committer writes the
bodies of a batch while its transaction runs and makes them durable
(``fdatasync``; the directory too, when a segment was created) before the COMMIT that
points at them. A crash between the two leaves bytes no row refers to. A segment is
never appended to again once the committer has moved on to a newer one (a restart
always begins a new one), and it is deleted once no row refers to it
(:meth:`BodyFiles.collect`: after commits, by the idle committer when a collection was
put off, and at start-up).

Only the committer thread of the database uses a :class:`BodyFiles`. A mirrored
database (R-ROUTE-16) keeps its bodies in its rows: the units it ships and the copies
it installs are SQL and SQLite images.

May import: nothing of brokerd (the standard library only).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import time
from pathlib import Path

STORED_FROM = 32 * 1024
"""Bodies at least this long go to a segment file: two or more overflow pages at
16 KiB pages. Smaller ones stay in their row, where a commit writes them with the
row's own page."""

SEGMENT_BYTES = 64 * 1024 * 1024
"""A segment is closed for appends once it holds this much (a longer body gets a new
segment of its own)."""

OFFSET_BITS = 40
"""``stored_at`` is ``segment << OFFSET_BITS | offset``: offsets up to 1 TiB."""

COLLECT_EVERY = 1.0
"""Seconds between two looks for segments no row refers to any more."""

SUFFIX = "-bodies"
"""The directory of a database file's segments: its file name with this suffix."""

TABLES = ("transmission_queue", "message_fragments")
"""The tables whose rows may point into the segments (each has ``stored_at`` and
``stored_length`` columns, and a partial index on ``stored_at``)."""


class BodyFileError(OSError):
    """A stored body cannot be read back as it was written."""


def directory_of(database_file: Path) -> Path:
    return database_file.with_name(database_file.name + SUFFIX)


def position(segment: int, offset: int) -> int:
    return segment << OFFSET_BITS | offset


def split(stored_at: int) -> tuple[int, int]:
    return stored_at >> OFFSET_BITS, stored_at & ((1 << OFFSET_BITS) - 1)


def _segment_name(segment: int) -> str:
    return f"{segment:010d}.seg"


def _segment_number(name: str) -> int | None:
    stem, dot, suffix = name.partition(".")
    if dot and suffix == "seg" and stem.isdigit():
        return int(stem)
    return None


class BodyFiles:
    """The segment files of one database: append, make durable, read back, collect."""

    def __init__(self, directory: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self._segment = 0
        """The segment appended to (0: none yet)."""
        self._fd = -1
        self._offset = 0
        self._synced = 0
        """The current segment's length made durable."""
        self._unsynced: list[int] = []
        """Descriptors of segments left during this batch, to sync and close."""
        self._new_file = False
        """A segment was created since the last sync: the directory must be synced too."""
        self._new_directory = False
        """The directory was created since the last sync: its parent must be synced too."""
        self._readers: dict[int, int] = {}
        self._sealed: set[int] = set()
        """Segments no longer appended to that may still hold live bodies."""
        self._last_collect = 0.0
        self.owed = False
        """A collection was put off (:data:`COLLECT_EVERY`): the committer runs it when idle."""
        self.bodies_stored = 0
        self.bytes_stored = 0
        self.segments_deleted = 0

    # -- start-up ---------------------------------------------------------------------

    def open(self, conn: sqlite3.Connection) -> None:
        """Find the segments a previous run left, delete those no row refers to, and
        begin after the newest (a segment is never appended to after a restart)."""
        names = [p.name for p in self.directory.iterdir()] if self.directory.is_dir() else []
        numbers = [n for n in map(_segment_number, names) if n is not None]
        self._segment = max(numbers, default=0)
        self._sealed = set(numbers)
        self.collect(conn, force=True)

    # -- writing (inside the committer's transaction) ----------------------------------

    def store(self, body: bytes | memoryview) -> int:
        """Append ``body`` to the current segment (not yet durable: :meth:`sync`); its
        ``stored_at``."""
        size = len(body)
        if self._fd < 0 or (self._offset and self._offset + size > self.segment_bytes):
            self._next_segment()
        offset = self._offset
        written = 0
        view = memoryview(body)
        while written < size:
            written += os.pwrite(self._fd, view[written:], offset + written)
        self._offset = offset + size
        self.bodies_stored += 1
        self.bytes_stored += size
        return position(self._segment, offset)

    def _next_segment(self) -> None:
        if self._fd >= 0:
            self._unsynced.append(self._fd)
            self._sealed.add(self._segment)
            self._readers.pop(self._segment, None)
        self._segment += 1
        if not self.directory.is_dir():
            self.directory.mkdir(parents=True, exist_ok=True)
            self._new_directory = True
        path = self.directory / _segment_name(self._segment)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._offset = self._synced = 0
        self._new_file = True

    @property
    def dirty(self) -> bool:
        """Bodies were written since the last :meth:`sync`."""
        return bool(self._unsynced) or self._offset > self._synced

    def sync(self) -> None:
        """Make every body written so far durable, and the names of new segments. A sync
        that fails leaves its segment for good: what the kernel kept of it is unknown,
        so nothing more is appended to it (and the caller's transaction rolls back)."""
        for fd in self._unsynced:
            os.fdatasync(fd)
        for fd in self._unsynced:
            os.close(fd)
        self._unsynced = []
        if self._fd >= 0 and self._offset > self._synced:
            try:
                os.fdatasync(self._fd)
            except OSError:
                self._leave_segment()
                raise
            self._synced = self._offset
        if self._new_file:
            _sync_directory(self.directory)
            self._new_file = False
        if self._new_directory:
            _sync_directory(self.directory.parent)
            self._new_directory = False

    def discard(self) -> None:
        """The transaction that wrote the bodies since the last sync rolled back: nothing
        refers to them. The current segment is given back its durable length (after a
        failed write, a full disk say); if that fails too, or the sync failed
        (:meth:`sync`), appends go to a new segment."""
        for fd in self._unsynced:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._unsynced = []
        if self._fd < 0 or self._offset == self._synced:
            return
        try:
            os.ftruncate(self._fd, self._synced)
            self._offset = self._synced
        except OSError:
            self._leave_segment()

    def _leave_segment(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._readers.pop(self._segment, None)
        self._sealed.add(self._segment)
        self._fd = -1

    # -- reading ----------------------------------------------------------------------

    def read(self, stored_at: int, length: int) -> bytes:
        """The body stored at ``stored_at``, of ``length`` bytes."""
        segment, offset = split(stored_at)
        fd = self._fd if segment == self._segment and self._fd >= 0 else self._reader(segment)
        data = os.pread(fd, length, offset)
        if len(data) != length:
            raise BodyFileError(
                errno.EIO,
                f"{self.directory / _segment_name(segment)}: a body of {length} bytes at "
                f"{offset} is cut short ({len(data)} bytes)",
            )
        return data

    def _reader(self, segment: int) -> int:
        fd = self._readers.get(segment)
        if fd is None:
            if len(self._readers) >= 16:
                _, old = self._readers.popitem()
                os.close(old)
            path = self.directory / _segment_name(segment)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise BodyFileError(
                    errno.ENOENT, f"{path}: a stored body's segment is missing"
                ) from None
            self._readers[segment] = fd
        return fd

    # -- collecting -------------------------------------------------------------------

    def collect(self, conn: sqlite3.Connection, force: bool = False) -> int:
        """Delete the segments that no row refers to, the one appended to included once
        every body in it is gone (at most every :data:`COLLECT_EVERY` seconds unless
        ``force``); how many. Run between transactions."""
        now = time.monotonic()
        current = self._fd >= 0 and self._offset > 0
        if not (self._sealed or current):
            return 0
        if not force and now - self._last_collect < COLLECT_EVERY:
            self.owed = True
            return 0
        self._last_collect, self.owed = now, False
        deleted = 0
        if current and not self.dirty and not referred(conn, self._segment):
            self._leave_segment()  # every body in it is gone: the next one begins another
        for segment in sorted(self._sealed):
            if referred(conn, segment):
                continue
            fd = self._readers.pop(segment, None)
            if fd is not None:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                (self.directory / _segment_name(segment)).unlink()
            self._sealed.discard(segment)
            deleted += 1
        self.segments_deleted += deleted
        return deleted

    def close(self) -> None:
        for fd in [*self._unsynced, *self._readers.values()]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._unsynced, self._readers = [], {}
        if self._fd >= 0:
            self._leave_segment()


def _sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_REFERRED = {
    table: f"SELECT 1 FROM {table} WHERE stored_at BETWEEN ? AND ? LIMIT 1" for table in TABLES
}
"""Whether a row of the table points into a segment (its partial index on ``stored_at``)."""


def referred(conn: sqlite3.Connection, segment: int) -> bool:
    """Whether a row points into ``segment``."""
    low, high = position(segment, 0), position(segment + 1, 0) - 1
    return any(conn.execute(sql, (low, high)).fetchone() is not None for sql in _REFERRED.values())


def disk_full(exc: BaseException) -> bool:
    """An error that says the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def read_stored(conn: sqlite3.Connection, stored_at: int, length: int) -> bytes:
    """A body a row of ``conn``'s database says is stored at ``stored_at``: through the
    committer's segment files (its connection carries them), else, for a connection
    opened elsewhere (a tool, a test), from the segment beside the file."""
    bodies = getattr(conn, "bodies", None)
    if isinstance(bodies, BodyFiles):
        return bodies.read(stored_at, length)
    for _, name, file in conn.execute("PRAGMA database_list"):
        if name == "main" and file:
            once = BodyFiles(directory_of(Path(file)))
            try:
                return once.read(stored_at, length)
            finally:
                once.close()
    raise BodyFileError(errno.ENOENT, "a stored body, but the database has no file")
