"""One SQLite file per database, as the event loop sees it: the :class:`Store`.

Owns (SPEC R-OBJ-6, R-DLG-13, R-ROUTE-16; docs/design.md "Storage"):

* :class:`Store`, the file of one database and its single group-commit writer:
  opening it (:mod:`brokerd.storage.connection`) and closing it, and the calls and
  jobs it hands to its committer thread (:mod:`brokerd.storage.committer`), which
  gathers every job submitted while the previous commit ran and commits them as one
  transaction (group commit). A job is statements and/or a function of the
  connection, with callbacks that run on the event loop once the transaction has
  committed (or failed); jobs submitted in one turn of the event loop may join into
  one (:meth:`Store.submit_joined`);
* a mirrored database's replay of the units the principal ships, and its snapshots
  (R-ROUTE-16, :mod:`brokerd.storage.replica`).

May import: ``brokerd.errors``, ``brokerd.storage.schema``,
``brokerd.storage.connection``, ``brokerd.storage.committer``,
``brokerd.storage.body_files``, ``brokerd.storage.chains``,
``brokerd.storage.latency`` and ``brokerd.storage.replica``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from brokerd.directories import make_directory
from brokerd.errors import StoreError
from brokerd.storage import schema
from brokerd.storage.body_files import BodyFiles
from brokerd.storage.chains import Token
from brokerd.storage.committer import Committer, Fn, Job, describe_sqlite_error, record_now
from brokerd.storage.connection import (
    PAGE_CACHE_MB,
    backup,
    open_bodies,
    open_file,
    rollback,
)
from brokerd.storage.latency import CommitLatency
from brokerd.storage.replica import (
    FencedWrite,
    Replica,
    Unit,
    Unshippable,
    contents,
    written_tables,
)
from brokerd.storage.schema import AUTO_CREATED_LOCAL, SCHEMA_VERSION, WRITE_META, Statement
from protocol import mirroring

__all__ = ["AUTO_CREATED_LOCAL", "SCHEMA_VERSION", "Statement", "Store", "describe_sqlite_error"]

T = TypeVar("T")
log = logging.getLogger("brokerd.storage.store")


class _Callbacks:
    """The commit callbacks of the parts of one joined job, run in their order."""

    __slots__ = ("parts",)

    def __init__(self, first: Callable[[], None]) -> None:
        self.parts = [first]

    def __call__(self) -> None:
        for callback in self.parts:
            try:
                callback()
            except Exception:  # one part's bug must not cost the others their callbacks
                log.exception("store: a commit callback failed")


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
        self._committer: Committer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outstanding = 0
        """Jobs submitted whose callbacks have not run yet."""
        self.pending_weight = 0
        """Bytes carried by jobs submitted and not yet committed (``submit(weight=...)``)."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self.commits = 0
        self.commit_latency = CommitLatency()
        """The group commits' durations (:mod:`brokerd.storage.latency`), kept across reopens."""
        self.jobs_committed = 0
        self.replica: Replica | None = None
        """Set before :meth:`open` for a mirrored database (R-ROUTE-16); None otherwise."""
        self._turn: list[Job] = []
        """Jobs submitted in this turn of the event loop, handed to the committer at its end."""
        self.release_gate: Callable[[], asyncio.Future[None] | None] | None = None
        """Asked after a batch's commit callbacks ran (they emit its trace events): a future
        the batch's waiters are told their outcome after, or None for at once. The daemon
        sets its trace writer's barrier here (``trace.durable``, docs/traces.md), so the
        application learns of a commit only once its events are on disk."""

    # -- opening and closing --------------------------------------------------

    async def open(self, broker_instance: uuid.UUID | None = None) -> uuid.UUID:
        """Open (creating or migrating if needed) the file; return its broker instance id."""
        try:
            make_directory(self.path.parent)  # SQLite syncs the file's name in it
        except OSError as exc:
            raise StoreError(f"cannot open {self.path}: {exc}") from exc
        self._loop = loop = asyncio.get_running_loop()

        def on_batch(batch: list[Job], units: list[Unit], release: int) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(self._committed, batch, units, release)

        self._committer = Committer(
            self.path,
            self.database,
            on_batch,
            self.replica,
            self.page_cache_mb,
            self.commit_latency,
        )
        try:
            instance: uuid.UUID = await self._call(
                lambda conn: open_file(conn, self.path, self.database, broker_instance)
            )
            mirrored = self.replica is not None
            committer = self._committer

            def bodies(conn: sqlite3.Connection) -> BodyFiles | None:
                committer.bodies = open_bodies(
                    conn, self.path, mirrored, self.segment_bytes, self.compact_after
                )
                return committer.bodies

            self.bodies = await self._call(bodies)
        except BaseException:
            await self._shutdown()
            raise
        if self.replica is not None:
            stored = {str(k): str(v) for k, v in await self.fetchall(schema.READ_META)}
            self.replica.lsn = int(stored.get("mirror_lsn", "0"))
            self.replica.lsn_epoch = int(stored.get("mirror_lsn_epoch", "0"))
            self.replica.opened_at = (self.replica.lsn, self.replica.lsn_epoch)
            self.replica.opened_units = []
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

    def _running(self) -> Committer:
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
        deletes followed by inserts. A mirrored database's transaction is recorded as a
        unit (:func:`~brokerd.storage.committer.record_now`, kept in
        ``Replica.opened_units`` for the partner to ship) if it changes anything; on a
        mirror it fails (its file changes only by what the principal ships, R-ROUTE-16).
        """
        batch = list(statements)
        replica = self.replica

        def run(conn: sqlite3.Connection) -> None:
            if replica is not None:
                try:
                    unit = record_now(conn, batch, replica)
                except (FencedWrite, Unshippable) as exc:
                    raise StoreError(
                        f"database {self.database!r}: not written ({type(exc).__name__}: "
                        f"{exc}, R-ROUTE-16)"
                    ) from exc
                if unit is not None:
                    replica.opened_units.append(unit)
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in batch:
                    conn.execute(sql, params)
                conn.execute("COMMIT")
            except BaseException:
                rollback(conn)
                raise

        await self._call(run)

    async def changes(self, statements: Sequence[Statement]) -> bool:
        """Whether running ``statements`` in their order would change the tables they
        write: tried in a transaction that is rolled back, so the file is left as it was
        (a mirror's too). Only for start-up and promotion (a promoted mirror writes its
        configuration's catalog only if it differs from its file's: a unit of work with
        nothing in it would be held in ``stall`` mode until a mirror confirms it)."""
        batch = list(statements)
        tables = written_tables(batch)

        def run(conn: sqlite3.Connection) -> bool:
            conn.execute("BEGIN IMMEDIATE")
            try:
                before = contents(conn, tables)
                for sql, params in batch:
                    conn.execute(sql, params)
                return contents(conn, tables) != before
            finally:
                rollback(conn)

        return await self._call(run)

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
            Job(statements, fn, future, on_commit, on_failure, None, None, weight, None, chains)
        )
        self._handed(committer, turn)
        return future

    def submit_in_order(self, statements: Sequence[Statement]) -> None:
        """Queue statements for the next group commit, run in their order: the group commit
        runs a batch's INSERTs before its UPDATEs and DELETEs, which would leave nothing of a
        catalog rewritten as deletes followed by inserts (a promoted mirror's, R-ROUTE-16)."""
        batch = list(statements)

        def run(conn: sqlite3.Connection) -> None:
            for sql, params in batch:
                conn.execute(sql, params)

        self.submit((), fn=run)

    def _handed(self, committer: Committer, turn: list[Job]) -> None:
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
                last.on_commit.parts.append(on_commit)
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
        callbacks = _Callbacks(on_commit)
        turn.append(
            Job(
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
            or callbacks.parts[-1] is not on_commit
        ):
            return False
        if replace_last:
            assert isinstance(last.statements, list)
            del last.statements[-1]
        self._grow(last, statements, weight)
        return True

    def _grow(self, job: Job, statements: Sequence[Statement], weight: int) -> None:
        """More statements for ``job``, still in this turn (the committer has not seen it):
        then it goes at once if the committer waits."""
        assert isinstance(job.statements, list)
        job.statements += statements
        job.weight += weight
        self.pending_weight += weight
        committer = self._running()
        if committer.waiting:
            self._hand_over(committer)

    def _hand_over(self, committer: Committer) -> None:
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

    def _committed(self, batch: list[Job], units: list[Unit], release: int) -> None:
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

    def after_gate(self, tell: Callable[[], None]) -> None:
        """Run ``tell`` once the events emitted so far are durable (the release gate), at
        once without one: for an outcome told from a commit callback rather than by a
        job's future (RECEIVE's reply when messages are ready), which must wait as the
        futures do (R-TRACE-1)."""
        gate = self.release_gate() if self.release_gate is not None else None
        if gate is None:
            tell()
        else:
            gate.add_done_callback(lambda _: tell())

    def _settle(self, batch: list[Job], error: BaseException | None) -> None:
        held: list[Job] = []
        for job in batch:
            self.pending_weight -= job.weight
            _finish(job, job.error or error, held)
        gate = self.release_gate() if held and self.release_gate is not None else None
        if gate is None:
            _release(held)
        else:
            gate.add_done_callback(lambda _: _release(held))
        self._outstanding -= len(batch)
        if not self._outstanding:
            self._idle.set()

    # -- mirroring (R-ROUTE-16) ---------------------------------------------------------------

    async def apply_unit(self, unit: Unit) -> None:
        """On the mirror: replay a unit shipped by the principal, in one transaction with
        the LSN it reached; ordered before every group commit queued after it. Its
        statements are decoded in the committer thread (RemoteProtocolError if malformed)."""
        replica = self.replica
        assert replica is not None

        def run(conn: sqlite3.Connection) -> None:
            statements = mirroring.decode_statements(unit.data)
            conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    conn.execute(sql, params)
                conn.execute(WRITE_META, ("mirror_lsn", str(unit.lsn)))
                conn.execute(WRITE_META, ("mirror_lsn_epoch", str(unit.epoch)))
                conn.execute("COMMIT")
            except BaseException:
                rollback(conn)
                raise
            replica.lsn, replica.lsn_epoch = unit.lsn, unit.epoch

        await self._call(run)

    async def snapshot_to(self, path: Path) -> tuple[int, int]:
        """On the principal: a copy of the whole file written to ``path`` (SQLite's backup
        API, page by page: memory stays that of the page cache), taken between two group
        commits; returns the LSN and epoch it holds."""
        replica = self.replica
        assert replica is not None

        def run(conn: sqlite3.Connection) -> tuple[int, int]:
            # empty, its owner's only (it holds what the file does, dialog keys included)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
            target = sqlite3.connect(path, isolation_level=None)
            try:
                conn.backup(target)
            except BaseException:
                target.close()
                path.unlink(missing_ok=True)
                raise
            target.close()
            return replica.lsn, replica.lsn_epoch

        return await self._call(run)

    async def install_snapshot(self, path: Path, own: Sequence[Statement]) -> None:
        """On the mirror: replace the file's content by a copy of the principal's (the file
        at ``path``, changed here), with this partner's own
        ``meta`` keys (``own``: its role and epoch) written into the copy before it is
        installed: one change of the file, so that a crash never leaves it holding the
        principal's role and epoch (R-ROUTE-15). The copy is read page by page."""
        replica = self.replica
        assert replica is not None

        def run(conn: sqlite3.Connection) -> None:
            source = sqlite3.connect(path, isolation_level=None)
            try:
                # the principal's file is in WAL mode, and so is its copy: it is changed
                # here in rollback-journal mode (no -wal and -shm files beside it)
                source.execute("PRAGMA journal_mode=DELETE")
                source.execute("BEGIN IMMEDIATE")
                for sql, params in own:
                    source.execute(sql, params)
                source.execute("COMMIT")
                backup(source, conn)
            finally:
                source.close()
            meta = {str(k): str(v) for k, v in conn.execute(schema.READ_META).fetchall()}
            replica.lsn = int(meta.get("mirror_lsn", "0"))
            replica.lsn_epoch = int(meta.get("mirror_lsn_epoch", "0"))

        await self._call(run)


# -- back on the event loop -------------------------------------------------------------------


def _release(held: list[Job]) -> None:
    """Tell the waiters of committed jobs, in their order."""
    for job in held:
        if job.future is not None and not job.future.done():
            job.future.set_result(job.result)


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _finish(job: Job, error: BaseException | None, held: list[Job]) -> None:
    try:
        _settle(job, error, held)
    except Exception:  # a callback bug must not stop the committer
        log.exception("store: a commit callback failed")


def _settle(job: Job, error: BaseException | None, held: list[Job]) -> None:
    """Run ``job``'s callbacks; a committed job's future joins ``held`` (told after the
    release gate)."""
    if error is None:
        if job.on_commit is not None:
            job.on_commit()
        if job.future is not None:
            held.append(job)
        return
    if job.on_failure is not None:
        job.on_failure(error)
    if job.future is not None and not job.future.done():
        job.future.set_exception(error)
