"""The committer thread of a database file, and the group commit it runs.

Owns (SPEC R-DLG-13; docs/design.md "Storage"):

* :class:`Committer`, the thread that owns the only connection to the file
  (:mod:`brokerd.storage.connection`) and the database's segment files of large bodies
  (:class:`~brokerd.storage.body_files.BodyFiles`, handed to the jobs that read them).
  It runs *calls* (start-up reads and writes, one at a time) and *jobs* (:class:`Job`):
  it gathers every job handed over while the previous commit ran and commits them as
  one transaction (group commit), then tells the event loop about the finished batch
  at once;
* the commit of a batch (:func:`commit_batch`, the SQL made by
  :mod:`brokerd.storage.batch_sql`). If a batch fails, its jobs are retried one by one
  in the same thread call so only the failing job reports the error (a full disk, or a lock
  another process holds past the busy timeout, fails them all, with a clear
  :class:`~brokerd.errors.StoreError`); a job extending a
  broken chain is refused untried (:mod:`brokerd.storage.chains`); a mirrored
  database's transaction is recorded as a numbered unit (:mod:`brokerd.storage.replica`);
  each batch's duration is counted in a histogram (:mod:`brokerd.storage.latency`).

**Why a thread of our own, not aiosqlite.** aiosqlite's public API crosses
from the event loop to its thread and back once per statement (a future and a
``call_soon_threadsafe`` each), and a batch is many statement groups. The
committer thread here receives a whole batch and runs it, from ``BEGIN`` to
``COMMIT``, in one call, then wakes the event loop once. It owns the only
connection to the file; start-up reads and the reads of RECEIVE run in it too,
ordered with the writes.

The event loop's side, submitting jobs and running their callbacks once committed, is
:class:`brokerd.storage.store.Store`'s.

May import: ``brokerd.errors``, ``brokerd.storage.schema``,
``brokerd.storage.connection``, ``brokerd.storage.batch_sql``,
``brokerd.storage.body_files``, ``brokerd.storage.chains``,
``brokerd.storage.latency`` and ``brokerd.storage.replica``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brokerd.errors import StoreError
from brokerd.storage import body_files
from brokerd.storage.batch_sql import Part, apply_batch
from brokerd.storage.body_files import BodyFiles
from brokerd.storage.chains import BrokenChains, Token
from brokerd.storage.connection import connect, rollback
from brokerd.storage.latency import CommitLatency
from brokerd.storage.replica import (
    FencedWrite,
    Recorder,
    Replica,
    Unit,
    Unshippable,
    contents,
    written_tables,
)
from brokerd.storage.schema import WRITE_META, Statement

log = logging.getLogger("brokerd.storage.store")
"""The store's log (its modules share it)."""
Fn = Callable[[sqlite3.Connection], Any]
"""A function of the connection, run in the committer thread."""
Done = Callable[[Any, BaseException | None], None]
"""Told, in the committer thread, a call's result or error."""


@dataclass(slots=True)
class Job:
    """What a store job is: statements and/or a function of the connection, with what
    to tell, on the event loop, once its transaction has committed or failed."""

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


def describe_sqlite_error(database: str, exc: BaseException) -> str:
    text = str(exc)
    if "full" in text.lower() or body_files.disk_full(exc):
        return f"database {database!r}: the disk is full ({text}); nothing was committed"
    return f"database {database!r}: {type(exc).__name__}: {text}"


class Committer:
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
        on_batch: Callable[[list[Job], list[Unit], int], None],
        replica: Replica | None,
        page_cache_mb: int,
        latency: CommitLatency | None = None,
    ) -> None:
        self.path = path
        self.name = name
        self.page_cache_mb = page_cache_mb
        self._on_batch = on_batch
        self.replica = replica
        self.latency = latency or CommitLatency()
        """How long each group commit took (read by the admin port's metrics)."""
        self.bodies: BodyFiles | None = None
        """The database's segment files of large bodies, once open (:meth:`Store.open`
        sets them in this thread); None for a mirrored database."""
        self.chains = BrokenChains()
        """Chains a failed job broke (:mod:`brokerd.storage.chains`); this thread only."""
        self._lock = threading.Lock()
        self._jobs: list[Job] = []
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

    def add(self, jobs: list[Job]) -> None:
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
                batch: list[Job] = []
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
                        started = time.perf_counter()
                        try:
                            _commit(
                                conn,
                                batch,
                                self.name,
                                self.chains,
                                self.bodies,
                                self.replica,
                                units,
                            )
                            self.latency.observe(time.perf_counter() - started)
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
                        self._compact(conn, self.bodies)
                else:
                    self._idle(conn)
        finally:
            if self.bodies is not None:
                self.bodies.close()
            if conn is not None:
                conn.close()

    def _idle(self, conn: sqlite3.Connection | None) -> None:
        """Wait for work; meanwhile, collect the segments of bodies a commit left for
        later and compact those few live bodies keep (:meth:`BodyFiles.housekeep`)."""
        bodies = self.bodies
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


def _commit(
    conn: sqlite3.Connection,
    batch: list[Job],
    database: str,
    chains: BrokenChains,
    bodies: BodyFiles | None,
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
            commit_batch(conn, batch, bodies)
        else:
            _recorded_transaction(conn, batch, replica, units if units is not None else [])
    except Exception as exc:  # one bad job must not sink the others: retry one by one
        rollback(conn)
        if bodies is not None:
            bodies.discard()
        if len(batch) == 1 or _disk_full(exc) or _locked(exc):
            if isinstance(exc, FencedWrite):
                error = StoreError(
                    f"database {database!r} is the mirror partner: its file changes only by "
                    "what the principal ships (R-ROUTE-16)"
                )
            elif isinstance(exc, Unshippable):
                error = StoreError(
                    f"database {database!r}: nothing was committed: the transaction's writes "
                    f"are beyond what its mirror partner takes in one unit of work ({exc}, "
                    "R-ROUTE-16)"
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
        _commit(conn, [job], database, chains, bodies, replica, units)


def _admitted(batch: list[Job], chains: BrokenChains) -> list[Job]:
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


def commit_batch(conn: sqlite3.Connection, batch: Sequence[Part], bodies: BodyFiles | None) -> None:
    """``batch`` in one transaction, as the committer commits it (``apply_batch``): the
    large bodies it stores (in ``bodies``, the database's segment files) made durable
    before the COMMIT (R-DLG-5), then the segments no row points into any more
    collected. Raises what failed; the caller then rolls back and discards the bodies
    written (:meth:`BodyFiles.discard`)."""
    conn.execute("BEGIN IMMEDIATE")
    apply_batch(conn, batch, bodies)
    if bodies is not None and bodies.dirty:
        bodies.sync()  # the bodies are durable before the rows that point at them
    conn.execute("COMMIT")
    if bodies is not None:
        try:
            bodies.committed(conn)
        except Exception:  # committed, whatever fails here: never taken for the batch's
            # failure (its jobs would be tried again one by one); a segment left behind
            # is collected later
            log.exception("collecting segments of bodies failed")
            bodies.owed = False


def _recorded_transaction(
    conn: sqlite3.Connection, batch: list[Job], replica: Replica, units: list[Unit]
) -> None:
    """A mirrored database's transaction: its writes recorded as a unit numbered with the
    next LSN (stored in the same transaction), or refused on the mirror; a unit beyond what
    a mirror takes raises :class:`Unshippable` before anything is committed."""
    recorder = Recorder(conn, replica, fenced=replica.role() != "principal")
    conn.execute("BEGIN IMMEDIATE")
    apply_batch(recorder, batch)  # type: ignore[arg-type]  # the connection's write surface
    if not recorder.encoder.count:
        conn.execute("COMMIT")
        return
    units.append(_numbered(conn, recorder, replica))


def _numbered(conn: sqlite3.Connection, recorder: Recorder, replica: Replica) -> Unit:
    """Commit the recorded transaction in progress as the unit numbered with the next LSN
    (stored in the same transaction, with the epoch)."""
    data = recorder.encoder.finish()  # before the COMMIT: a failure rolls back
    lsn, epoch = replica.lsn + 1, replica.epoch()
    conn.execute(WRITE_META, ("mirror_lsn", str(lsn)))
    conn.execute(WRITE_META, ("mirror_lsn_epoch", str(epoch)))
    conn.execute("COMMIT")
    replica.lsn, replica.lsn_epoch = lsn, epoch
    return Unit(lsn, epoch, data)


def record_now(
    conn: sqlite3.Connection, statements: Sequence[Statement], replica: Replica
) -> Unit | None:
    """A mirrored database's start-up write (its configuration's catalog), outside the group
    commit: run in one transaction, in order, and recorded as a unit numbered as the group
    commit numbers its own, for the partner to ship (R-ROUTE-16). A transaction that leaves
    the tables it writes as they were is rolled back: no unit, so an unchanged
    configuration costs a returning mirror nothing. On a mirror it raises
    :class:`FencedWrite`; beyond what a mirror takes, :class:`Unshippable`."""
    tables = written_tables(statements)
    recorder = Recorder(conn, replica, fenced=replica.role() != "principal")
    conn.execute("BEGIN IMMEDIATE")
    try:
        before = contents(conn, tables)
        for sql, params in statements:
            recorder.execute(sql, params)
        if not recorder.encoder.count or contents(conn, tables) == before:
            rollback(conn)
            return None
        return _numbered(conn, recorder, replica)
    except BaseException:
        rollback(conn)
        raise


def _locked(exc: BaseException) -> bool:
    """The file's lock is held elsewhere (``SQLITE_BUSY`` / ``SQLITE_LOCKED`` once the busy
    timeout ran out): no job of the batch is at fault, and trying each alone would wait
    out the timeout once per job, holding every later commit up (R-DLG-13)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.Error)
        and isinstance(code, int)
        and (code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED))
    )


def _disk_full(exc: BaseException) -> bool:
    return (isinstance(exc, sqlite3.Error) and "full" in str(exc).lower()) or body_files.disk_full(
        exc
    )
