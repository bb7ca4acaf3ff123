"""One SQLite file per database: opening and migrating it, and its single committer.

Owns (SPEC R-OBJ-6, R-DLG-13; docs/design.md "Storage"):

* opening the file: the numbered migrations of :mod:`brokerd.storage.schema`,
  the persisted broker instance identifier and the ``AutoCreatedLocal`` route;
* :class:`Store`, whose committer gathers every job submitted while the
  previous commit ran and commits them as one transaction (group commit).
  A job is statements and/or a function of the connection, with callbacks that
  run on the event loop once the transaction has committed (or failed). If a
  batch fails, its jobs are retried one by one in the same thread call so only
  the failing job reports the error (a full disk fails them all, with a clear
  :class:`~brokerd.errors.StoreError`).

**Why a thread of our own, not aiosqlite.** aiosqlite's public API crosses
from the event loop to its thread and back once per statement (a future and a
``call_soon_threadsafe`` each), and a batch is many statement groups. The
committer thread here receives a whole batch and runs it, from ``BEGIN`` to
``COMMIT``, in one call, then wakes the event loop once. It owns the only
connection to the file; start-up reads and the reads of RECEIVE run in it too,
ordered with the writes.

WAL journal, ``synchronous=FULL``: a committed job survives ``kill -9`` and power loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from brokerd.errors import StoreError
from brokerd.storage import body_files, queries, schema
from brokerd.storage.batch_sql import Part, apply_batch
from brokerd.storage.body_files import TABLES, BodyFiles
from brokerd.storage.chains import BrokenChains, Token
from brokerd.storage.replica import FencedWrite, Recorder, Replica, Unit
from brokerd.storage.schema import AUTO_CREATED_LOCAL, SCHEMA_VERSION, WRITE_META, Statement

__all__ = ["AUTO_CREATED_LOCAL", "SCHEMA_VERSION", "Statement", "Store", "describe_sqlite_error"]

T = TypeVar("T")
log = logging.getLogger("brokerd.storage.store")
Fn = Callable[[sqlite3.Connection], Any]
Done = Callable[[Any, BaseException | None], None]
"""Told, in the committer thread, a call's result or error."""


@dataclass(slots=True)
class _Job:
    statements: Sequence[Statement] = ()
    fn: Fn | None = None
    future: asyncio.Future[Any] | None = None
    on_commit: Callable[[], None] | None = None
    on_failure: Callable[[BaseException], None] | None = None
    result: Any = None
    error: BaseException | None = field(default=None)
    weight: int = 0
    joins: object = None
    """The key :meth:`Store.submit_joined` gave it (None: a job of its own)."""
    chains: Sequence[Token] = ()
    """The chains it extends (:mod:`brokerd.storage.chains`): refused untried once one broke."""


class _Callbacks(list[Callable[[], None]]):
    """The commit callbacks of the parts of one joined job, run in their order."""

    __slots__ = ()

    def __call__(self) -> None:
        for callback in self:
            try:
                callback()
            except Exception:  # one part's bug must not cost the others their callbacks
                log.exception("store: a commit callback failed")


def describe_sqlite_error(database: str, exc: BaseException) -> str:
    text = str(exc)
    if "full" in text.lower() or body_files.disk_full(exc):
        return f"database {database!r}: the disk is full ({text}); nothing was committed"
    return f"database {database!r}: {type(exc).__name__}: {text}"


class _Committer:
    """The thread that owns the connection.

    It runs *calls* (start-up reads and writes, one at a time) and *jobs* (the
    group commit). The store hands jobs over once per turn of the event loop (at
    once when the thread waits): after each commit the thread takes every job
    handed over meanwhile and begins the next transaction at once, without
    waiting for the event loop, and tells the loop about the finished batch with
    one ``call_soon_threadsafe``.
    """

    def __init__(
        self,
        path: Path,
        name: str,
        on_batch: Callable[[list[_Job], list[Unit], int], None],
        replica: Replica | None,
        page_cache_mb: int,
    ) -> None:
        self.path = path
        self.name = name
        self.page_cache_mb = page_cache_mb
        self._on_batch = on_batch
        self.replica = replica
        self.chains = BrokenChains()
        """Chains a failed job broke (:mod:`brokerd.storage.chains`); this thread only."""
        self._lock = threading.Lock()
        self._jobs: list[_Job] = []
        self._calls: deque[tuple[Fn, Done]] = deque()
        self._stopping = False
        self._waiting = False
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"store-{name}", daemon=True)
        self._thread.start()

    def call(self, fn: Fn, done: Done) -> None:
        """Run ``fn(connection)`` in the thread; ``done(result, error)`` is called there."""
        with self._lock:
            self._calls.append((fn, done))
            wake, self._waiting = self._waiting, False
        if wake:
            self._wake.put(None)

    @property
    def waiting(self) -> bool:
        """Whether the thread waits for work (read without the lock: a hint)."""
        return self._waiting

    def add(self, jobs: list[_Job]) -> None:
        """Queue jobs, in order, for the next group commit."""
        with self._lock:
            self._jobs += jobs
            wake, self._waiting = self._waiting, False
        if wake:
            self._wake.put(None)

    def stop(self) -> None:
        """Finish what is queued, then close the connection and end the thread."""
        with self._lock:
            self._stopping = True
            wake, self._waiting = self._waiting, False
        if wake:
            self._wake.put(None)

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                call: tuple[Fn, Done] | None = None
                batch: list[_Job] = []
                with self._lock:
                    if self._calls:
                        call = self._calls.popleft()
                    elif self._jobs:
                        batch, self._jobs = self._jobs, []
                    elif self._stopping:
                        return
                    else:
                        self._waiting = True
                if call is not None:
                    fn, done = call
                    try:
                        if conn is None:
                            conn = connect(self.path, self.page_cache_mb)
                        result = fn(conn)
                    except BaseException as exc:  # reported to the caller on the event loop
                        done(None, exc)
                    else:
                        done(result, None)
                elif batch:
                    units: list[Unit] = []
                    if conn is None:
                        error = StoreError(f"database {self.name!r} is not open")
                        for job in batch:
                            job.error = error
                    else:
                        try:
                            _commit(conn, batch, self.name, self.chains, self.replica, units)
                        except BaseException as exc:  # a bug, not a database error
                            log.exception("store %s: the commit failed", self.name)
                            error = StoreError(f"database {self.name!r}: the commit failed: {exc}")
                            error.__cause__ = exc
                            for job in batch:
                                job.error = job.error or error
                                if job.chains:
                                    self.chains.failed(job.chains, job.error)
                    replica = self.replica
                    self._on_batch(batch, units, replica.lsn if replica is not None else 0)
                    if conn is not None:
                        self._compact(conn, getattr(conn, "bodies", None))
                else:
                    self._idle(conn)
        finally:
            if conn is not None:
                bodies = getattr(conn, "bodies", None)
                if bodies is not None:
                    bodies.close()
                conn.close()

    def _idle(self, conn: sqlite3.Connection | None) -> None:
        """Wait for work; meanwhile, collect the segments of bodies a commit left for
        later and compact those few live bodies keep (:meth:`BodyFiles.housekeep`)."""
        bodies: BodyFiles | None = getattr(conn, "bodies", None)
        timeout = bodies.idle_timeout() if bodies is not None else None
        if conn is None or bodies is None or timeout is None:
            self._wake.get()
            return
        try:
            self._wake.get(timeout=timeout)
        except queue.Empty:
            try:
                bodies.housekeep(conn)
            except Exception:  # the committer goes on: its jobs must not wait for ever
                log.exception("store %s: collecting or compacting segments failed", self.name)
                bodies.owed = False

    def _compact(self, conn: sqlite3.Connection, bodies: BodyFiles | None) -> None:
        """Between two group commits, compact the segments of bodies when a pass is due
        (:meth:`BodyFiles.compact`); a failure is logged, and the next pass tries again."""
        if bodies is None:
            return
        try:
            bodies.compact(conn)
        except Exception:  # the committer goes on: its jobs must not wait for ever
            log.exception("store %s: compacting segments of bodies failed", self.name)


PAGE_SIZE = 16 * 1024
"""Page size of a database file brokerd creates (an existing file keeps its own). A
body longer than a page spills into a chain of overflow pages, each a WAL frame of
its own with a checksum when committed, copied again by the checkpoint, and read one
by one when its row is deleted: a 1 MiB body is 256 pages at SQLite's default 4 KiB
and 64 at 16 KiB (docs/performance.md, "Large bodies")."""


PAGE_CACHE_MB = 2
"""The page cache of a database's connection by default (``limits.page_cache_mb``):
SQLite's own default. docs/performance.md measures 64 MB ("The floor under W3, and the
page cache"): large messages gain a little, a large backlog's RSS grows by the cache."""


class StoreConnection(sqlite3.Connection):
    """The committer's connection, with the database's segment files of large bodies
    (None for a mirrored database, which keeps them in its rows)."""

    bodies: BodyFiles | None = None


def connect(path: Path, page_cache_mb: int = PAGE_CACHE_MB) -> StoreConnection:
    """A connection to ``path`` with the store's settings: page size, WAL,
    ``synchronous=FULL``, and a page cache of ``page_cache_mb``."""
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, factory=StoreConnection
    )
    conn.row_factory = sqlite3.Row
    # Only takes effect while the file is still empty (before its first table).
    conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=OFF")
    conn.execute(f"PRAGMA cache_size=-{page_cache_mb * 1024}")  # negative: in KiB
    return conn


class Store:
    """The SQLite file of one database and its single group-commit writer."""

    def __init__(
        self,
        path: Path,
        database: str,
        page_cache_mb: int = PAGE_CACHE_MB,
        segment_bytes: int | None = None,
        compact_after: float | None = None,
    ) -> None:
        self.path = path
        self.database = database
        self.page_cache_mb = page_cache_mb
        self.segment_bytes = segment_bytes
        """Bytes of a segment file of large bodies (``limits.body_segment_mb``; None:
        :data:`body_files.SEGMENT_BYTES`)."""
        self.compact_after = compact_after
        """Seconds before a closed segment may be compacted (``limits.body_compact_after``;
        None: :data:`body_files.COMPACT_AFTER`)."""
        self.bodies: BodyFiles | None = None
        """The segment files of large bodies, once open (None for a mirrored database):
        the committer's; the event loop only reads :meth:`BodyFiles.view`."""
        self._committer: _Committer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outstanding = 0
        """Jobs submitted whose callbacks have not run yet."""
        self.pending_weight = 0
        """Bytes carried by jobs submitted and not yet committed (``submit(weight=...)``)."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self.commits = 0
        self.jobs_committed = 0
        self.replica: Replica | None = None
        """Set before :meth:`open` for a mirrored database (R-ROUTE-16); None otherwise."""
        self._turn: list[_Job] = []
        """Jobs submitted in this turn of the event loop, handed to the committer at its end."""

    # -- opening and closing --------------------------------------------------

    async def open(self, broker_instance: uuid.UUID | None = None) -> uuid.UUID:
        """Open (creating or migrating if needed) the file; return its broker instance id."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot open {self.path}: {exc}") from exc
        self._loop = loop = asyncio.get_running_loop()

        def on_batch(batch: list[_Job], units: list[Unit], release: int) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(self._committed, batch, units, release)

        self._committer = _Committer(
            self.path, self.database, on_batch, self.replica, self.page_cache_mb
        )
        try:
            instance: uuid.UUID = await self._call(
                lambda conn: _open_file(conn, self.path, self.database, broker_instance)
            )
            mirrored = self.replica is not None
            self.bodies = await self._call(
                lambda conn: _open_bodies(
                    conn, self.path, mirrored, self.segment_bytes, self.compact_after
                )
            )
        except BaseException:
            await self._shutdown()
            raise
        if self.replica is not None:
            stored = {str(k): str(v) for k, v in await self.fetchall(schema.READ_META)}
            self.replica.lsn = int(stored.get("mirror_lsn", "0"))
            self.replica.lsn_epoch = int(stored.get("mirror_lsn_epoch", "0"))
        return instance

    async def close(self) -> None:
        """Commit what is pending, then close. Idempotent."""
        if self._committer is None:
            return
        self._closing = True
        await self._idle.wait()
        await self._shutdown()

    async def _shutdown(self) -> None:
        committer, self._committer = self._committer, None
        if committer is not None:
            committer.stop()
            await asyncio.to_thread(committer.join)

    # -- calls into the committer thread ------------------------------------------

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in the committer thread now (start-up, before traffic flows)."""
        committer = self._running()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def done(result: Any, error: BaseException | None) -> None:
            loop.call_soon_threadsafe(_resolve, future, result, error)

        committer.call(fn, done)
        try:
            return await future
        except sqlite3.Error as exc:
            raise StoreError(describe_sqlite_error(self.database, exc)) from exc
        except OSError as exc:
            raise StoreError(f"cannot open {self.path}: {exc}") from exc

    def _running(self) -> _Committer:
        if self._committer is None:
            raise StoreError(f"database {self.database!r} is closed")
        return self._committer

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """A read outside the group commit; only for start-up, before traffic flows."""
        return await self._call(lambda conn: conn.execute(sql, params).fetchall())

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Several reads in one call of the committer thread; only for start-up."""
        return await self._call(fn)

    async def execute_now(self, statements: Iterable[Statement]) -> None:
        """Run statements in one transaction immediately, in their order; only for start-up.

        Unlike the group commit, nothing is regrouped: the catalog is rewritten as
        deletes followed by inserts.
        """
        batch = list(statements)

        def run(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in batch:
                    conn.execute(sql, params)
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

        await self._call(run)

    # -- the group commit -------------------------------------------------------------

    def submit(
        self,
        statements: Sequence[Statement],
        *,
        fn: Fn | None = None,
        on_commit: Callable[[], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        wait: bool = False,
        weight: int = 0,
        chains: Sequence[Token] = (),
    ) -> asyncio.Future[Any] | None:
        """Queue statements for the next group commit.

        ``fn(connection)`` runs in the committer thread inside the transaction,
        after the statements. ``on_commit`` runs on the event loop right after
        the commit; ``wait=True`` returns a future that resolves then, with
        ``fn``'s result (or fails with StoreError). ``weight`` (bytes the job carries)
        counts in :attr:`pending_weight` until the job's commit ends. ``chains``: the
        chains the job extends; it is refused untried if one of them broke
        (:mod:`brokerd.storage.chains`).
        """
        if self._closing:
            raise StoreError(f"database {self.database!r} is shutting down")
        committer = self._running()
        future: asyncio.Future[Any] | None = None
        if wait:
            assert self._loop is not None
            future = self._loop.create_future()
        self._outstanding += 1
        self.pending_weight += weight
        self._idle.clear()
        turn = self._turn
        turn.append(
            _Job(statements, fn, future, on_commit, on_failure, None, None, weight, None, chains)
        )
        self._handed(committer, turn)
        return future

    def _handed(self, committer: _Committer, turn: list[_Job]) -> None:
        """Hand this turn's jobs over now if the committer waits (its commit ended: do not
        let it idle until the turn ends), else once at the end of the turn."""
        if committer.waiting:
            self._hand_over(committer)
        elif len(turn) == 1:
            assert self._loop is not None
            self._loop.call_soon(self._hand_over, committer)

    def submit_joined(
        self,
        key: object,
        statements: Sequence[Statement],
        on_commit: Callable[[], None],
        on_failure: Callable[[BaseException], None],
        weight: int = 0,
        chains: Sequence[Token] = (),
    ) -> None:
        """Like :meth:`submit`, but the job joins the previous one of this turn of the
        event loop if that was submitted here with the same ``key``: its statements
        follow the previous ones, its ``on_commit`` runs after theirs. A joined job
        commits or fails as a whole, and its ``on_failure`` is the first part's, so only
        parts whose failure means the same thing share a key (the messages one link
        delivers to a database in one turn, say). Order is kept: a part joins only the
        job submitted last, never one with another job after it. The job extends the
        ``chains`` of all its parts.
        """
        turn = self._turn
        if turn:
            last = turn[-1]
            if last.joins is not None and last.joins == key:
                assert isinstance(last.on_commit, _Callbacks)
                last.on_commit.append(on_commit)
                if chains:
                    assert isinstance(last.chains, list)
                    last.chains += chains
                self._grow(last, statements, weight)
                return
        if self._closing:
            raise StoreError(f"database {self.database!r} is shutting down")
        committer = self._running()
        self._outstanding += 1
        self.pending_weight += weight
        self._idle.clear()
        callbacks = _Callbacks()
        callbacks.append(on_commit)
        turn.append(
            _Job(
                list(statements),
                None,
                None,
                callbacks,
                on_failure,
                None,
                None,
                weight,
                key,
                list(chains),
            )
        )
        self._handed(committer, turn)

    def join_last(
        self,
        key: object,
        on_commit: Callable[[], None],
        statements: Sequence[Statement],
        weight: int = 0,
        replace_last: bool = False,
    ) -> bool:
        """Add ``statements`` to the job :meth:`submit_joined` made with ``key`` in this
        turn of the event loop, if it is still the last one and ``on_commit`` is still
        its last callback (no other part joined since): True. Then nothing new runs
        after the commit; ``on_commit`` itself covers what was added (a run of messages
        of one conversation with one callback). ``replace_last`` drops the job's last
        statement first (a whole-row snapshot the new one supersedes)."""
        turn = self._turn
        if not turn:
            return False
        last = turn[-1]
        callbacks = last.on_commit
        if (
            last.joins is None
            or last.joins != key
            or not isinstance(callbacks, _Callbacks)
            or callbacks[-1] is not on_commit
        ):
            return False
        if replace_last:
            assert isinstance(last.statements, list)
            del last.statements[-1]
        self._grow(last, statements, weight)
        return True

    def _grow(self, job: _Job, statements: Sequence[Statement], weight: int) -> None:
        """More statements for ``job``, still in this turn (the committer has not seen it):
        then it goes at once if the committer waits."""
        assert isinstance(job.statements, list)
        job.statements += statements
        job.weight += weight
        self.pending_weight += weight
        committer = self._running()
        if committer.waiting:
            self._hand_over(committer)

    def _hand_over(self, committer: _Committer) -> None:
        """While a commit runs, the jobs of one turn of the event loop go to the committer
        at once: one lock per turn, not per job (each crossing can cost a GIL hand-off).
        Once the committer waits, what is queued goes at once (it starts a commit)."""
        jobs, self._turn = self._turn, []
        if jobs:
            committer.add(jobs)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` inside the next batch's transaction; its result after commit."""
        future = self.submit((), fn=fn, wait=True)
        assert future is not None
        result: T = await future
        return result

    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """A read ordered after every job submitted before it."""
        return await self.run(lambda conn: conn.execute(sql, params).fetchall())

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def _committed(self, batch: list[_Job], units: list[Unit], release: int) -> None:
        """Back on the event loop: each job's callbacks, in submission order (for a
        mirrored database, once the mirroring service releases the batch)."""
        failed = sum(1 for job in batch if job.error is not None)
        if failed < len(batch):
            self.commits += 1
            self.jobs_committed += len(batch) - failed
        replica = self.replica
        if replica is not None and replica.sink is not None:
            try:
                replica.sink(
                    units,
                    release,
                    lambda: self._settle(batch, None),
                    lambda exc: self._settle(batch, exc),
                )
            except Exception as exc:  # a bug: the outcome must still reach the callers
                log.exception("store %s: the mirroring of a commit failed", self.database)
                self._settle(batch, StoreError(f"database {self.database!r}: {exc}"))
            return
        self._settle(batch, None)

    def _settle(self, batch: list[_Job], error: BaseException | None) -> None:
        for job in batch:
            self.pending_weight -= job.weight
            _finish(job, job.error or error)
        self._outstanding -= len(batch)
        if not self._outstanding:
            self._idle.set()

    # -- mirroring (R-ROUTE-16) ---------------------------------------------------------------

    async def apply_unit(self, unit: Unit) -> None:
        """On the mirror: replay a unit shipped by the principal, in one transaction with
        the LSN it reached; ordered before every group commit queued after it."""
        replica = self.replica
        assert replica is not None

        def run(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in unit.statements:
                    conn.execute(sql, params)
                conn.execute(WRITE_META, ("mirror_lsn", str(unit.lsn)))
                conn.execute(WRITE_META, ("mirror_lsn_epoch", str(unit.epoch)))
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            replica.lsn, replica.lsn_epoch = unit.lsn, unit.epoch

        await self._call(run)

    async def snapshot(self) -> tuple[bytes, int, int]:
        """On the principal: the whole file as bytes, with the LSN and epoch it holds
        (taken between two group commits)."""
        replica = self.replica
        assert replica is not None

        def run(conn: sqlite3.Connection) -> tuple[bytes, int, int]:
            return bytes(conn.serialize()), replica.lsn, replica.lsn_epoch

        return await self._call(run)

    async def install_snapshot(self, data: bytes, own: Sequence[Statement]) -> None:
        """On the mirror: replace the file's content by a copy of the principal's, then
        write back this partner's own ``meta`` keys (``own``: its role and epoch)."""
        replica = self.replica
        assert replica is not None

        def run(conn: sqlite3.Connection) -> None:
            source = sqlite3.connect(":memory:")
            try:
                source.deserialize(_rollback_journal_image(data))
                _backup(source, conn)
            finally:
                source.close()
            conn.execute("BEGIN IMMEDIATE")
            for sql, params in own:
                conn.execute(sql, params)
            conn.execute("COMMIT")
            meta = {str(k): str(v) for k, v in conn.execute(schema.READ_META).fetchall()}
            replica.lsn = int(meta.get("mirror_lsn", "0"))
            replica.lsn_epoch = int(meta.get("mirror_lsn_epoch", "0"))

        await self._call(run)


def _backup(source: sqlite3.Connection, conn: sqlite3.Connection) -> None:
    """Copy ``source`` over ``conn``'s file. A file in WAL mode refuses a copy of another
    page size (partners whose files were created by versions with different page
    sizes, :data:`PAGE_SIZE`; SQLite reports it as a write to a read-only database,
    and ``PRAGMA page_size`` does not tell, since :func:`connect` asked for ours):
    the copy then goes in rollback-journal mode, which takes the source's page size,
    and the file returns to WAL."""
    try:
        source.backup(conn)
        return
    except sqlite3.OperationalError:
        conn.execute("PRAGMA journal_mode=DELETE")
    try:
        source.backup(conn)
    finally:
        conn.execute("PRAGMA journal_mode=WAL")


def _rollback_journal_image(data: bytes) -> bytes:
    """A serialized database image whose header says rollback journal (bytes 18-19 = 1).

    The principal's file is in WAL mode, and so is the image ``serialize`` gives of it
    (header bytes 18-19 = 2); an in-memory database cannot open a WAL image ("unable to
    open database file"), so a mirror could never install a copy. The backup into the
    mirror's own file keeps that file in WAL mode."""
    if len(data) >= 20 and data[18:20] == b"\x02\x02":
        return data[:18] + b"\x01\x01" + data[20:]
    return data


# -- in the committer thread ---------------------------------------------------------------


def _open_file(
    conn: sqlite3.Connection, path: Path, database: str, broker_instance: uuid.UUID | None
) -> uuid.UUID:
    conn.execute(schema.CREATE_META)
    meta = {str(k): str(v) for k, v in conn.execute(schema.READ_META).fetchall()}
    version = int(meta.get("schema_version", "0"))
    if version > SCHEMA_VERSION:
        raise StoreError(f"{path}: schema version {version}, this brokerd reads {SCHEMA_VERSION}")
    for step in schema.MIGRATIONS:
        if step.version > version:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for sql in step.script.split(";"):
                    if sql.strip():
                        conn.execute(sql)
                conn.execute(schema.WRITE_META, ("schema_version", str(step.version)))
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            log.info("%s: schema step %d applied (%s)", path, step.version, step.what)
    stored = meta.get("broker_instance")
    if stored is not None:
        instance = uuid.UUID(stored)
        if broker_instance is not None and broker_instance != instance:
            raise StoreError(
                f"{path}: holds broker instance {instance}, but the configuration "
                f"says {broker_instance}"
            )
        return instance
    instance = broker_instance or uuid.uuid4()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        schema.WRITE_META, [("broker_instance", str(instance)), ("database", database)]
    )
    conn.execute(schema.ADD_AUTO_CREATED_LOCAL, (AUTO_CREATED_LOCAL,))
    conn.execute("COMMIT")
    return instance


def _commit(
    conn: sqlite3.Connection,
    batch: list[_Job],
    database: str,
    chains: BrokenChains,
    replica: Replica | None = None,
    units: list[Unit] | None = None,
) -> None:
    """Commit ``batch`` as one transaction; if it fails, each job alone (errors on the jobs).

    A job extending a broken chain is refused untried, and a job that fails breaks its
    chains (:mod:`brokerd.storage.chains`). With a ``replica`` (a mirrored database),
    each committed transaction's writes are appended to ``units``, numbered."""
    batch = _admitted(batch, chains)
    if not batch:
        return
    try:
        if replica is None:
            commit_batch(conn, batch)
        else:
            _recorded_transaction(conn, batch, replica, units if units is not None else [])
    except Exception as exc:  # one bad job must not sink the others: retry one by one
        _rollback(conn)
        bodies = getattr(conn, "bodies", None)
        if bodies is not None:
            bodies.discard()
        if len(batch) == 1 or _disk_full(exc):
            if isinstance(exc, FencedWrite):
                error = StoreError(
                    f"database {database!r} is the mirror partner: its file changes only by "
                    "what the principal ships (R-ROUTE-16)"
                )
            else:
                error = StoreError(describe_sqlite_error(database, exc))
            error.__cause__ = exc
            for job in batch:
                job.error = error
                if job.chains:
                    chains.failed(job.chains, error)
            return
    else:
        if len(chains):  # something broke: a newer generation committing mends it
            for job in batch:
                if job.chains:
                    chains.committed(job.chains)
        return
    for job in batch:
        _commit(conn, [job], database, chains, replica, units)


def _admitted(batch: list[_Job], chains: BrokenChains) -> list[_Job]:
    """The jobs of ``batch`` to try: the others extend a broken chain and get its error."""
    if not len(chains):
        return batch
    admitted = []
    for job in batch:
        refusal = chains.refusal(job.chains) if job.chains else None
        if refusal is None:
            admitted.append(job)
        else:
            job.error = refusal
            chains.failed(job.chains, refusal)
    return admitted


def commit_batch(conn: sqlite3.Connection, batch: Sequence[Part]) -> None:
    """``batch`` in one transaction, as the committer commits it (``apply_batch``): the
    large bodies it stores made durable before the COMMIT, then the segments no row
    points into any more collected. Raises what failed; the caller then rolls back
    and discards the bodies written (:meth:`BodyFiles.discard`)."""
    bodies: BodyFiles | None = getattr(conn, "bodies", None)
    conn.execute("BEGIN IMMEDIATE")
    apply_batch(conn, batch, bodies)
    if bodies is not None and bodies.dirty:
        bodies.sync()  # the bodies are durable before the rows that point at them
    conn.execute("COMMIT")
    if bodies is not None:
        try:
            bodies.committed(conn)
        except (OSError, sqlite3.Error):  # committed: a segment left behind is collected later
            log.exception("collecting segments of bodies failed")
            bodies.owed = False


def _recorded_transaction(
    conn: sqlite3.Connection, batch: list[_Job], replica: Replica, units: list[Unit]
) -> None:
    """A mirrored database's transaction: its writes recorded as a unit numbered with the
    next LSN (stored in the same transaction), or refused on the mirror."""
    recorder = Recorder(conn, replica, fenced=replica.role() != "principal")
    conn.execute("BEGIN IMMEDIATE")
    apply_batch(recorder, batch)  # type: ignore[arg-type]  # the connection's write surface
    if not recorder.statements:
        conn.execute("COMMIT")
        return
    lsn, epoch = replica.lsn + 1, replica.epoch()
    conn.execute(WRITE_META, ("mirror_lsn", str(lsn)))
    conn.execute(WRITE_META, ("mirror_lsn_epoch", str(epoch)))
    conn.execute("COMMIT")
    replica.lsn, replica.lsn_epoch = lsn, epoch
    units.append(Unit(lsn, epoch, recorder.statements))


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            log.exception("store: rollback failed")


def _disk_full(exc: BaseException) -> bool:
    return (isinstance(exc, sqlite3.Error) and "full" in str(exc).lower()) or body_files.disk_full(
        exc
    )


def _open_bodies(
    conn: sqlite3.Connection,
    path: Path,
    mirrored: bool,
    segment_bytes: int | None = None,
    compact_after: float | None = None,
) -> BodyFiles | None:
    """Give the committer's connection its segment files of large bodies, deleting the
    segments no row refers to; a mirrored database (R-ROUTE-16) has none, and takes
    back into its rows the bodies it stored before it was mirrored."""
    directory = body_files.directory_of(path)
    if not mirrored:
        bodies = BodyFiles(directory, segment_bytes, compact_after)
        bodies.open(conn)
        conn.bodies = bodies  # type: ignore[attr-defined]  # a StoreConnection
        return bodies
    rows = {table: conn.execute(queries.stored_rows(table)).fetchall() for table in TABLES}
    if not any(rows.values()):
        return None
    files = BodyFiles(directory)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for table, stored in rows.items():
                for rowid, stored_at, length in stored:
                    body = files.read(stored_at, length)
                    conn.execute(queries.inline_row(table), (body, rowid))
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        files.open(conn)  # every segment is now unreferenced
    finally:
        files.close()
    return None


# -- back on the event loop -------------------------------------------------------------------


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _finish(job: _Job, error: BaseException | None) -> None:
    try:
        _settle(job, error)
    except Exception:  # a callback bug must not stop the committer
        log.exception("store: a commit callback failed")


def _settle(job: _Job, error: BaseException | None) -> None:
    if error is None:
        if job.on_commit is not None:
            job.on_commit()
        if job.future is not None and not job.future.done():
            job.future.set_result(job.result)
        return
    if job.on_failure is not None:
        job.on_failure(error)
    if job.future is not None and not job.future.done():
        job.future.set_exception(error)
