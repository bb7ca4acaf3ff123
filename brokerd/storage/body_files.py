"""Large bodies kept beside a database's SQLite file, in append-only segment files.

A body of :data:`STORED_FROM` bytes or more that a transmission-queue row (a message
sent), a ``message_fragments`` row (a fragment received) or a ``queue_messages`` row (a
message delivered whole) would carry goes instead into the current segment of
``<file>-bodies/``; the row keeps where
(``stored_at``: the segment's number times 2**40 plus the offset) and how long
(``stored_length``), with an empty ``body``. SQLite then writes a row of a few dozen
bytes, not a chain of overflow pages that goes to the WAL, is copied again by the
checkpoint and is read back page by page when the row is deleted
(docs/performance.md, "What bounds W3").

Durability (R-DLG-5) is the file's as much as the row's: the committer writes the
bodies of a batch while its transaction runs and makes them durable
(``fdatasync``; the directory too, when a segment was created, and the directory's own
name when it was created, :mod:`brokerd.directories`) before the COMMIT that
points at them. A crash between the two leaves bytes no row refers to. A segment is
never appended to again once the committer has moved on to a newer one (a restart
always begins a new one), and it is deleted once no row refers to it
(:meth:`BodyFiles.collect`: after commits, by the idle committer when a collection was
put off, and at start-up).

A body that stays while the ones around it go (a message to a broker that is down, a
message no one RECEIVEs) would keep its whole segment. A segment closed for
:data:`COMPACT_AFTER` seconds whose live bodies fill less than half of it is
compacted (:meth:`BodyFiles.compact`): they are copied, in one transaction of their
own, to the survivors' segment, which only moved bodies are appended to, so they do
not mix again with the short-lived ones. Once compaction has caught up, the segments
hold at most about twice the live bytes, besides the two segments being appended to and
what was written in the last :data:`COMPACT_AFTER` seconds.

Only the committer thread of the database uses a :class:`BodyFiles`, but for
:meth:`BodyFiles.view`, which the event loop reads. A mirrored
database (R-ROUTE-16) keeps its bodies in its rows: the units it ships and the copies
it installs are SQL and SQLite images.

May import: :mod:`brokerd.directories` only (and the standard library).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import time
from pathlib import Path

from brokerd.directories import make_directory, sync_directory

STORED_FROM = 32 * 1024
"""Bodies at least this long go to a segment file (eight or more overflow pages at the
4 KiB pages of a file brokerd creates, :data:`brokerd.storage.connection.PAGE_SIZE`).
Smaller ones stay in their row, where a commit writes them with the row's own page
and its overflow pages, as many bytes as the body has, without a segment file's sync."""

SEGMENT_BYTES = 64 * 1024 * 1024
"""A segment is closed for appends once it holds this much (a longer body gets a new
segment of its own)."""

OFFSET_BITS = 40
"""``stored_at`` is ``segment << OFFSET_BITS | offset``: offsets up to 1 TiB."""

COLLECT_EVERY = 1.0
"""Seconds between two looks for segments no row refers to any more."""

COMPACT_AFTER = 30.0
"""Seconds a segment is left alone after it is closed for appends before its live bodies
may be moved: on a busy link most bodies are acknowledged, and freed, sooner."""

COMPACT_EVERY = 5.0
"""Seconds between two looks for segments to compact."""

MOVED_PER_PASS = 16 * 1024 * 1024
"""Bytes one compaction moves at most (more when one segment alone holds more): a pass
runs between two group commits and holds the next one up while it runs. A pass that
stopped there is followed by the next after :data:`COMPACT_AGAIN` seconds."""

COMPACT_AGAIN = 0.5
"""Seconds to the next pass when one stopped at :data:`MOVED_PER_PASS`."""

FILE_MODE = 0o600
"""A segment file's mode: it holds message bodies (docs/design.md, Security defaults)."""

DIRECTORY_MODE = 0o700
"""The mode of the directory of segments, made with the first segment."""

SUFFIX = "-bodies"
"""The directory of a database file's segments: its file name with this suffix."""

TABLES = ("transmission_queue", "message_fragments", "queue_messages")
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


class _Tail:
    """A segment being appended to: its number (0: none yet), descriptor, length, and the
    length made durable."""

    __slots__ = ("fd", "offset", "segment", "synced")

    def __init__(self) -> None:
        self.segment = 0
        self.fd = -1
        self.offset = 0
        self.synced = 0

    @property
    def open(self) -> bool:
        return self.fd >= 0


class BodyFiles:
    """The segment files of one database: append, make durable, read back, collect,
    compact."""

    def __init__(
        self,
        directory: Path,
        segment_bytes: int | None = None,
        compact_after: float | None = None,
    ) -> None:
        self.directory = directory
        self.segment_bytes = SEGMENT_BYTES if segment_bytes is None else segment_bytes
        self.compact_after = COMPACT_AFTER if compact_after is None else compact_after
        self._last = 0
        """The highest segment number made or found."""
        self._new = _Tail()
        """Where bodies being stored go."""
        self._kept = _Tail()
        """Where compaction moves the bodies that outlived their segment."""
        self._unsynced: list[tuple[int, int]] = []
        """Segments left during this batch, to sync and close: their descriptors, and the
        lengths made durable before (:meth:`discard` gives them back)."""
        self._new_file = False
        """A segment was created since the last sync: the directory must be synced too."""
        self._readers: dict[int, int] = {}
        self._closed: dict[int, float] = {}
        """Segments no longer appended to that may still hold live bodies, with when
        (``time.monotonic``) they were closed (for one found at start-up, when it was
        last written)."""
        self._unreadable: set[int] = set()
        """Segments whose live bodies could not be read back to be moved: left where
        they are until a restart (reading them fails the same way for their rows)."""
        self._last_collect = 0.0
        self._last_compact = 0.0
        self.owed = False
        """A collection was put off (:data:`COLLECT_EVERY`): the committer runs it when idle."""
        self._unsettled = False
        """Rows may have left closed segments since the last full compaction pass."""
        self.bodies_stored = 0
        self.bytes_stored = 0
        self.segments_deleted = 0
        self.segments_compacted = 0
        self.bytes_moved = 0

    # -- start-up ---------------------------------------------------------------------

    def open(self, conn: sqlite3.Connection) -> None:
        """Find the segments a previous run left, delete those no row refers to, and
        begin after the newest (a segment is never appended to after a restart)."""
        names = [p.name for p in self.directory.iterdir()] if self.directory.is_dir() else []
        numbers = [n for n in map(_segment_number, names) if n is not None]
        # Above every segment a row points to, found or not: a new segment under the
        # name of a missing one would give its rows another body's bytes.
        self._last = max(*numbers, highest_referred(conn), 0)
        now, wall = time.monotonic(), time.time()
        for number in numbers:  # aged by their files: a daemon restarted often still compacts
            try:
                written = (self.directory / _segment_name(number)).stat().st_mtime
            except FileNotFoundError:
                continue
            self._closed[number] = now - max(0.0, wall - written)
        self._unsettled = bool(numbers)
        self.collect(conn, force=True)

    # -- writing (inside the committer's transaction) ----------------------------------

    def store(self, body: bytes | memoryview) -> int:
        """Append ``body`` to the current segment (not yet durable: :meth:`sync`); its
        ``stored_at``."""
        self.bodies_stored += 1
        self.bytes_stored += len(body)
        return self._append(self._new, body)

    def _append(self, tail: _Tail, body: bytes | memoryview) -> int:
        size = len(body)
        if not tail.open or (tail.offset and tail.offset + size > self.segment_bytes):
            self._next_segment(tail)
        offset = tail.offset
        written = 0
        view = memoryview(body)
        while written < size:
            written += os.pwrite(tail.fd, view[written:], offset + written)
        tail.offset = offset + size
        return position(tail.segment, offset)

    def _next_segment(self, tail: _Tail) -> None:
        """Begin a new segment for ``tail``. The segment it leaves is handed to
        :meth:`sync` only once the new one is open: if that fails (no descriptor left, a
        full disk), ``tail`` keeps its segment and descriptor as they were, so no
        descriptor is closed twice or written to after it was closed (the process may
        have reused its number for another file)."""
        self._last += 1  # a number tried is never tried again, whatever came of it
        segment = self._last
        if not self.directory.is_dir():
            make_directory(self.directory, DIRECTORY_MODE)  # its name durable at once
        path = self.directory / _segment_name(segment)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, FILE_MODE)
        if tail.open:
            self._unsynced.append((tail.fd, tail.synced))
            self._closed[tail.segment] = time.monotonic()
            self._close_reader(tail.segment)
        tail.segment, tail.fd = segment, fd
        tail.offset = tail.synced = 0
        self._new_file = True

    @property
    def dirty(self) -> bool:
        """Bodies were written since the last :meth:`sync` (a segment left, :meth:`_leave`,
        has nothing more to sync: what a failed sync wrote to it is given up)."""
        return bool(self._unsynced) or any(
            t.open and t.offset > t.synced for t in (self._new, self._kept)
        )

    def sync(self) -> None:
        """Make every body written so far durable, and the names of new segments. A sync
        that fails leaves its segment for good: what the kernel kept of it is unknown,
        so nothing more is appended to it (and the caller's transaction rolls back)."""
        for fd, _ in self._unsynced:
            os.fdatasync(fd)
        for fd, _ in self._unsynced:
            os.close(fd)
        self._unsynced = []
        for tail in (self._new, self._kept):
            if tail.open and tail.offset > tail.synced:
                try:
                    os.fdatasync(tail.fd)
                except OSError:
                    self._leave(tail)
                    raise
                tail.synced = tail.offset
        if self._new_file:
            sync_directory(self.directory)
            self._new_file = False

    def discard(self) -> None:
        """The transaction that wrote the bodies since the last sync rolled back: nothing
        refers to them. The segments being appended to are given back their durable
        lengths (after a failed write, a full disk say); if that fails too, or the sync
        failed (:meth:`sync`), appends go to a new segment. A write cut short (a body
        that did not fit) leaves bytes beyond the length it was written at: the file's
        own length is looked at, so that they are given back too and a full disk is not
        kept full by them; the segments left during the transaction lose what it wrote
        to them the same way."""
        for fd, synced in self._unsynced:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, synced)
            with contextlib.suppress(OSError):
                os.close(fd)
        self._unsynced = []
        for tail in (self._new, self._kept):
            if not tail.open:
                continue
            try:
                if tail.offset != tail.synced or os.fstat(tail.fd).st_size != tail.synced:
                    os.ftruncate(tail.fd, tail.synced)
                tail.offset = tail.synced
            except OSError:
                self._leave(tail)

    def _leave(self, tail: _Tail) -> None:
        """Append no more to ``tail``'s segment: it is closed like a full one."""
        with contextlib.suppress(OSError):
            os.close(tail.fd)
        self._close_reader(tail.segment)
        self._closed[tail.segment] = time.monotonic()
        tail.fd = -1

    def _close_reader(self, segment: int) -> None:
        fd = self._readers.pop(segment, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- reading ----------------------------------------------------------------------

    def read(self, stored_at: int, length: int) -> bytes:
        """The body stored at ``stored_at``, of ``length`` bytes."""
        segment, offset = split(stored_at)
        if segment == self._new.segment and self._new.open:
            fd = self._new.fd
        elif segment == self._kept.segment and self._kept.open:
            fd = self._kept.fd
        else:
            fd = self._reader(segment)
        size = os.fstat(fd).st_size  # a damaged row's length is checked before use
        if length < 0 or offset + length > size:
            raise BodyFileError(
                errno.EIO,
                f"{self.directory / _segment_name(segment)}: a body of {length} bytes at "
                f"{offset} is cut short (the segment holds {size} bytes)",
            )
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
        """Delete the segments that no row refers to, those appended to included once
        every body in them is gone (at most every :data:`COLLECT_EVERY` seconds unless
        ``force``); how many. Run between transactions."""
        now = time.monotonic()
        tails = [t for t in (self._new, self._kept) if t.open and t.offset > 0]
        if not (self._closed or tails):
            return 0
        if not force and now - self._last_collect < COLLECT_EVERY:
            self.owed = True
            return 0
        self._last_collect, self.owed = now, False
        deleted = 0
        if tails and not self.dirty:
            for tail in tails:
                if not referred(conn, tail.segment):
                    self._leave(tail)  # every body in it is gone: the next one begins another
        for segment in sorted(self._closed):
            if referred(conn, segment):
                continue
            self._delete(segment)
            deleted += 1
        self.segments_deleted += deleted
        return deleted

    def _delete(self, segment: int) -> None:
        self._close_reader(segment)
        with contextlib.suppress(FileNotFoundError):
            (self.directory / _segment_name(segment)).unlink()
        self._closed.pop(segment, None)

    def committed(self, conn: sqlite3.Connection) -> None:
        """A transaction committed: rows may have left segments (:meth:`collect`, and a
        compaction pass may find more to do)."""
        self._unsettled = True
        self.collect(conn)

    def idle_timeout(self) -> float | None:
        """How long the idle committer may wait for work before it has housekeeping to do
        (:meth:`housekeep`): None when nothing is owed."""
        if self.owed:
            return COLLECT_EVERY
        if self._unsettled and self._closed:
            return COMPACT_EVERY
        return None

    def housekeep(self, conn: sqlite3.Connection) -> None:
        """What the idle committer does when :meth:`idle_timeout` has passed."""
        if self.owed:
            self.collect(conn, force=True)
        self.compact(conn)

    # -- compacting -------------------------------------------------------------------

    def compact(self, conn: sqlite3.Connection, force: bool = False) -> int:
        """Move the live bodies of segments closed for :attr:`compact_after` seconds that
        they fill less than half of to the survivors' segment, one transaction per
        segment, and delete those segments; at most every :data:`COMPACT_EVERY` seconds
        unless ``force``, about :data:`MOVED_PER_PASS` bytes a pass. How many bytes it
        moved. Run between transactions. A segment that cannot be moved is left as it
        was: after a failed write (a full disk), tried again after :attr:`compact_after`
        seconds; with a body that cannot be read back, not again until a restart. The
        last such error is raised once the others are done."""
        now = time.monotonic()
        if not self._closed or not self._unsettled:
            return 0
        if not force and now - self._last_compact < COMPACT_EVERY:
            return 0
        self._last_compact = now
        moved = 0
        settled = True
        failure: BaseException | None = None
        for segment, closed in sorted(self._closed.items()):
            if segment in self._unreadable:
                continue
            if now - closed < self.compact_after:
                settled = False  # to be looked at again once it is old enough
                continue
            live = live_bytes(conn, segment)
            if live == 0:
                continue  # the collector deletes it
            if 2 * live >= self._size(segment):
                continue
            if moved and moved + live > MOVED_PER_PASS:
                settled = False
                self._last_compact = now - COMPACT_EVERY + COMPACT_AGAIN
                break
            try:
                self._move(conn, segment)
            except BodyFileError as exc:
                self._unreadable.add(segment)
                failure = exc
                continue
            except (OSError, sqlite3.Error) as exc:  # tried again once it is old enough again
                self._closed[segment], settled, failure = time.monotonic(), False, exc
                continue
            except Exception as exc:  # a row that cannot be right: trying again cannot help
                self._unreadable.add(segment)
                failure = exc
                continue
            moved += live
        self._unsettled = not settled
        if failure is not None:
            raise failure
        return moved

    def _size(self, segment: int) -> int:
        try:
            return (self.directory / _segment_name(segment)).stat().st_size
        except FileNotFoundError:
            return 0

    def _move(self, conn: sqlite3.Connection, segment: int) -> None:
        """Copy ``segment``'s live bodies to the survivors' segment and point their rows
        there, durable before the COMMIT as any stored body; then delete ``segment``."""
        moved = 0
        conn.execute("BEGIN IMMEDIATE")
        try:
            for table in TABLES:
                for rowid, stored_at, length in live_rows(conn, table, segment):
                    moved_to = self._append(self._kept, self.read(stored_at, length))
                    conn.execute(MOVE_ROW[table], (moved_to, rowid))
                    moved += length
            if self.dirty:
                self.sync()
            conn.execute("COMMIT")
        except BaseException:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            finally:
                self.discard()  # nothing refers to what was copied, even if ROLLBACK failed
            raise
        self._delete(segment)
        self.segments_compacted += 1
        self.bytes_moved += moved

    def view(self) -> dict[str, int]:
        """The segments and what was done with them, for the ``databases`` view (read
        from the event loop while the committer works: a snapshot)."""
        tails = [t.segment for t in (self._new, self._kept) if t.open]
        segments = {*list(self._closed), *tails}  # one may be in both while it closes
        size = 0
        for segment in segments:
            size += self._size(segment)
        return {
            "body_segments": len(segments),
            "body_segment_bytes": size,
            "bodies_stored": self.bodies_stored,
            "body_bytes_stored": self.bytes_stored,
            "body_segments_deleted": self.segments_deleted,
            "body_segments_compacted": self.segments_compacted,
            "body_bytes_moved": self.bytes_moved,
            "body_segments_unreadable": len(self._unreadable),
        }

    def close(self) -> None:
        for fd in [*(fd for fd, _ in self._unsynced), *self._readers.values()]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._unsynced, self._readers = [], {}
        for tail in (self._new, self._kept):
            if tail.open:
                self._leave(tail)


_REFERRED = {
    table: f"SELECT 1 FROM {table} WHERE stored_at BETWEEN ? AND ? LIMIT 1" for table in TABLES
}
"""Whether a row of the table points into a segment (its partial index on ``stored_at``)."""


_HIGHEST = {
    table: f"SELECT max(stored_at) FROM {table} WHERE stored_at IS NOT NULL" for table in TABLES
}
"""The highest position a row of the table points at (its partial index on ``stored_at``)."""


def highest_referred(conn: sqlite3.Connection) -> int:
    """The highest segment a row points into (0: none)."""
    highest = 0
    for sql in _HIGHEST.values():
        (at,) = conn.execute(sql).fetchone()
        if at is not None:
            highest = max(highest, split(int(at))[0])
    return highest


def referred(conn: sqlite3.Connection, segment: int) -> bool:
    """Whether a row points into ``segment``."""
    low, high = position(segment, 0), position(segment + 1, 0) - 1
    return any(conn.execute(sql, (low, high)).fetchone() is not None for sql in _REFERRED.values())


_LIVE_BYTES = {
    table: f"SELECT total(stored_length) FROM {table} WHERE stored_at BETWEEN ? AND ?"
    for table in TABLES
}
_LIVE_ROWS = {
    table: f"SELECT rowid, stored_at, stored_length FROM {table} "
    "WHERE stored_at BETWEEN ? AND ? ORDER BY stored_at"
    for table in TABLES
}
MOVE_ROW = {table: f"UPDATE {table} SET stored_at = ? WHERE rowid = ?" for table in TABLES}
"""Points a row (by rowid) at where compaction moved its body."""


def live_rows(conn: sqlite3.Connection, table: str, segment: int) -> list[tuple[int, int, int]]:
    """The rows of ``table`` whose bodies are in ``segment``: rowid, where, how long."""
    low, high = position(segment, 0), position(segment + 1, 0) - 1
    return conn.execute(_LIVE_ROWS[table], (low, high)).fetchall()


def live_bytes(conn: sqlite3.Connection, segment: int) -> int:
    """The bytes of ``segment`` that rows still point at."""
    low, high = position(segment, 0), position(segment + 1, 0) - 1
    return sum(int(conn.execute(sql, (low, high)).fetchone()[0]) for sql in _LIVE_BYTES.values())


def disk_full(exc: BaseException) -> bool:
    """An error that says the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def read_stored(
    conn: sqlite3.Connection, bodies: BodyFiles | None, stored_at: int, length: int
) -> bytes:
    """A body a row of ``conn``'s database says is stored at ``stored_at``: through
    ``bodies``, the committer's segment files (``Store.bodies``), or without them (a
    connection opened elsewhere: a tool, a test) from the segment beside the file."""
    if bodies is not None:
        return bodies.read(stored_at, length)
    for _, name, file in conn.execute("PRAGMA database_list"):
        if name == "main" and file:
            once = BodyFiles(directory_of(Path(file)))
            try:
                return once.read(stored_at, length)
            finally:
                once.close()
    raise BodyFileError(errno.ENOENT, "a stored body, but the database has no file")
