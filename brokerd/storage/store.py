"""One SQLite file per database: schema, durable settings and the group-commit writer.

Owns (SPEC R-OBJ-3..6, R-DLG-5, R-DLG-13; docs/design.md "Storage"):

* the schema: catalog tables, ``conversation_endpoints``, ``transmission_queue``,
  ``queue_messages`` (status 0-3 as in R-OBJ-3), ``message_fragments``
  (fragments of messages being reassembled, R-DLG-7) and ``conversation_timers``
  (R-DLG-11);
* the file's persisted broker instance identifier and the ``AutoCreatedLocal``
  route (R-OBJ-6);
* :class:`Store`, whose single writer task drains a queue of jobs and commits
  them as one transaction (group commit). Callers get a future that resolves
  only after the commit, so an acknowledgement or a client reply can wait for
  durability. If a batch fails, its jobs are retried one by one so only the
  failing job reports the error (a full disk fails them all, with a clear
  :class:`~brokerd.errors.StoreError`).

WAL journal, ``synchronous=FULL``: a committed job survives ``kill -9`` and power loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from brokerd.errors import StoreError

SCHEMA_VERSION = 1
AUTO_CREATED_LOCAL = "AutoCreatedLocal"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS message_types (name TEXT PRIMARY KEY, validation TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS contract_messages (
    contract TEXT NOT NULL, message_type TEXT NOT NULL, sent_by TEXT NOT NULL,
    PRIMARY KEY (contract, message_type));
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY, status INTEGER NOT NULL, retention INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS services (name TEXT PRIMARY KEY, queue TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS service_contracts (
    service TEXT NOT NULL, contract TEXT NOT NULL, PRIMARY KEY (service, contract));
CREATE TABLE IF NOT EXISTS routes (
    name TEXT PRIMARY KEY, remote_service_name TEXT, broker_instance TEXT,
    address TEXT NOT NULL, mirror_address TEXT, lifetime TEXT, source TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS conversation_endpoints (
    conversation_handle TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    is_initiator INTEGER NOT NULL,
    conversation_group_id TEXT NOT NULL,
    service_name TEXT NOT NULL,
    far_service TEXT NOT NULL,
    far_broker_instance TEXT,
    contract TEXT NOT NULL,
    state TEXT NOT NULL,
    lifetime INTEGER NOT NULL,
    created_at REAL NOT NULL,
    send_sequence INTEGER NOT NULL,
    receive_sequence INTEGER NOT NULL,
    ended_local INTEGER NOT NULL,
    ended_remote INTEGER NOT NULL,
    UNIQUE (conversation_id, is_initiator));
CREATE TABLE IF NOT EXISTS transmission_queue (
    conversation_handle TEXT NOT NULL,
    message_sequence_number INTEGER NOT NULL,
    message_type TEXT NOT NULL,
    flags INTEGER NOT NULL,
    body BLOB NOT NULL,
    enqueued_at REAL NOT NULL,
    PRIMARY KEY (conversation_handle, message_sequence_number));
CREATE TABLE IF NOT EXISTS queue_messages (
    queue_name TEXT NOT NULL,
    conversation_group_id TEXT NOT NULL,
    conversation_handle TEXT NOT NULL,
    message_sequence_number INTEGER NOT NULL,
    status INTEGER NOT NULL,
    service_name TEXT NOT NULL,
    contract TEXT NOT NULL,
    message_type TEXT NOT NULL,
    message_length INTEGER NOT NULL,
    body BLOB,
    enqueued_at REAL NOT NULL,
    PRIMARY KEY (conversation_handle, message_sequence_number));
CREATE INDEX IF NOT EXISTS queue_messages_ready ON queue_messages (queue_name, status);
CREATE TABLE IF NOT EXISTS conversation_timers (
    conversation_handle TEXT PRIMARY KEY,
    due REAL NOT NULL);
CREATE TABLE IF NOT EXISTS message_fragments (
    conversation_handle TEXT NOT NULL,
    message_sequence_number INTEGER NOT NULL,
    fragment_index INTEGER NOT NULL,
    fragment_offset INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (conversation_handle, message_sequence_number, fragment_index));
"""

Statement = tuple[str, Sequence[Any]]

ENDPOINT_SNAPSHOT = (
    "INSERT OR REPLACE INTO conversation_endpoints VALUES (" + ", ".join("?" * 15) + ")"
)
"""A whole endpoint row; within a batch only the last snapshot of each endpoint is written."""
ENDPOINT_DELETE = "DELETE FROM conversation_endpoints WHERE conversation_handle = ?"
"""Removes an endpoint row; deduplicated together with the snapshots."""
T = TypeVar("T")
log = logging.getLogger("brokerd.storage.store")


@dataclass
class _Job:
    statements: Sequence[Statement] = ()
    fn: Callable[[aiosqlite.Connection], Awaitable[Any]] | None = None
    future: asyncio.Future[Any] | None = None
    on_commit: Callable[[], None] | None = None
    on_failure: Callable[[BaseException], None] | None = None
    result: Any = None
    error: BaseException | None = field(default=None)


def describe_sqlite_error(database: str, exc: BaseException) -> str:
    text = str(exc)
    if "full" in text.lower():
        return f"database {database!r}: the disk is full ({text}); nothing was committed"
    return f"database {database!r}: {type(exc).__name__}: {text}"


class Store:
    """The SQLite file of one database and its single group-commit writer."""

    def __init__(self, path: Path, database: str) -> None:
        self.path = path
        self.database = database
        self._conn: aiosqlite.Connection | None = None
        self._pending: list[_Job] = []
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.commits = 0
        self.jobs_committed = 0

    # -- opening and closing --------------------------------------------------

    async def open(self, broker_instance: uuid.UUID | None = None) -> uuid.UUID:
        """Open (creating if needed) the file; return its broker instance identifier."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = await aiosqlite.connect(self.path, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open {self.path}: {exc}") from exc
        self._conn = conn
        conn.row_factory = sqlite3.Row
        try:
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute("PRAGMA synchronous=FULL")
            await conn.execute("PRAGMA foreign_keys=OFF")
            await conn.executescript(SCHEMA)
            rows = await conn.execute_fetchall("SELECT key, value FROM meta")
            meta = {str(k): str(v) for k, v in rows}
            version = meta.get("schema_version")
            if version is not None and version != str(SCHEMA_VERSION):
                raise StoreError(
                    f"{self.path}: schema version {version}, this brokerd reads {SCHEMA_VERSION}"
                )
            stored = meta.get("broker_instance")
            if stored is None:
                instance = broker_instance or uuid.uuid4()
                await conn.execute("BEGIN IMMEDIATE")
                await conn.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?)",
                    [
                        ("schema_version", str(SCHEMA_VERSION)),
                        ("broker_instance", str(instance)),
                        ("database", self.database),
                    ],
                )
                await conn.execute(
                    "INSERT OR IGNORE INTO routes VALUES (?, NULL, NULL, 'LOCAL', NULL, NULL, "
                    "'system')",
                    (AUTO_CREATED_LOCAL,),
                )
                await conn.commit()
            else:
                instance = uuid.UUID(stored)
                if broker_instance is not None and broker_instance != instance:
                    raise StoreError(
                        f"{self.path}: holds broker instance {instance}, but the configuration "
                        f"says {broker_instance}"
                    )
        except sqlite3.Error as exc:
            await conn.close()
            raise StoreError(describe_sqlite_error(self.database, exc)) from exc
        except BaseException:
            await conn.close()
            raise
        self._task = asyncio.get_running_loop().create_task(
            self._writer(), name=f"store-writer-{self.database}"
        )
        return instance

    async def close(self) -> None:
        """Commit what is pending, then close. Idempotent."""
        if self._conn is None:
            return
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
            self._task = None
        await self._conn.close()
        self._conn = None

    @property
    def conn(self) -> aiosqlite.Connection:
        if self._conn is None:
            raise StoreError(f"database {self.database!r} is closed")
        return self._conn

    # -- direct access while nothing else runs (start-up) -----------------------

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """A read outside the writer; only for start-up, before traffic flows."""
        return list(await self.conn.execute_fetchall(sql, params))

    async def execute_now(self, statements: Iterable[Statement]) -> None:
        """Run statements in one transaction immediately; only for start-up."""
        conn = self.conn
        await conn.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in statements:
                await conn.execute(sql, params)
            await conn.commit()
        except sqlite3.Error as exc:
            await conn.rollback()
            raise StoreError(describe_sqlite_error(self.database, exc)) from exc

    # -- the writer -------------------------------------------------------------

    def submit(
        self,
        statements: Sequence[Statement],
        *,
        fn: Callable[[aiosqlite.Connection], Awaitable[Any]] | None = None,
        on_commit: Callable[[], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        wait: bool = False,
    ) -> asyncio.Future[Any] | None:
        """Queue statements for the next group commit.

        ``on_commit`` runs in the writer right after the commit; ``wait=True``
        returns a future that resolves then, with ``fn``'s result (or fails with
        StoreError). ``fn`` runs inside the transaction after the statements.
        """
        if self._closing:
            raise StoreError(f"database {self.database!r} is shutting down")
        future: asyncio.Future[Any] | None = None
        if wait:
            future = asyncio.get_running_loop().create_future()
        self._pending.append(
            _Job(statements, fn, future=future, on_commit=on_commit, on_failure=on_failure)
        )
        self._idle.clear()
        self._wakeup.set()
        return future

    async def run(self, fn: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T:
        """Run ``fn(connection)`` inside the next batch's transaction; its result after commit."""
        if self._closing:
            raise StoreError(f"database {self.database!r} is shutting down")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append(_Job(fn=fn, future=future))
        self._idle.clear()
        self._wakeup.set()
        return await future

    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """A read ordered after every job submitted before it."""

        async def read(conn: aiosqlite.Connection) -> list[sqlite3.Row]:
            return list(await conn.execute_fetchall(sql, params))

        return await self.run(read)

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def _writer(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            batch, self._pending = self._pending, []
            if batch:
                await self._commit_batch(batch)
            if not self._pending:
                self._idle.set()
                if self._closing:
                    return
            else:
                self._wakeup.set()

    async def _commit_batch(self, batch: list[_Job]) -> None:
        try:
            await self._execute(batch)
        except Exception as exc:  # one bad job must not sink the others: retry one by one
            await self._rollback()
            if len(batch) > 1 and not _disk_full(exc):
                for job in batch:
                    await self._commit_batch([job])
                return
            error = StoreError(describe_sqlite_error(self.database, exc))
            error.__cause__ = exc
            for job in batch:
                _finish(job, error)
            return
        self.commits += 1
        self.jobs_committed += len(batch)
        for job in batch:
            _finish(job, None)

    async def _execute(self, batch: list[_Job]) -> None:
        """One transaction for the whole batch, in as few thread round trips as possible.

        Between two coroutine jobs, statements are grouped by SQL text: every
        INSERT group first (in order of first appearance), then every UPDATE and
        DELETE group. Jobs therefore must not rely on an UPDATE or DELETE running
        before an INSERT of the same batch; the dialog engine's statements never
        do (an update or delete always concerns a row committed earlier or
        inserted by the same or an earlier job). Endpoint snapshots are
        deduplicated per endpoint and written last: a snapshot is a whole row.
        """
        conn = self.conn
        await conn.execute("BEGIN IMMEDIATE")
        inserts: dict[str, list[Sequence[Any]]] = {}
        changes: dict[str, list[Sequence[Any]]] = {}
        endpoints: dict[Any, Sequence[Any] | None] = {}
        for job in batch:
            for sql, params in job.statements:
                if sql == ENDPOINT_SNAPSHOT:
                    endpoints[params[0]] = params
                elif sql == ENDPOINT_DELETE:
                    endpoints[params[0]] = None
                elif sql.startswith("INSERT"):
                    inserts.setdefault(sql, []).append(params)
                else:
                    changes.setdefault(sql, []).append(params)
            if job.fn is not None:
                await self._flush(inserts, changes)
                job.result = await job.fn(conn)
        await self._flush(inserts, changes)
        rows = [row for row in endpoints.values() if row is not None]
        if rows:
            await conn.executemany(ENDPOINT_SNAPSHOT, rows)
        gone = [(handle,) for handle, row in endpoints.items() if row is None]
        if gone:
            await conn.executemany(ENDPOINT_DELETE, gone)
        await conn.commit()

    async def _flush(
        self, inserts: dict[str, list[Sequence[Any]]], changes: dict[str, list[Sequence[Any]]]
    ) -> None:
        for groups in (inserts, changes):
            for sql, params in groups.items():
                if len(params) == 1:
                    await self.conn.execute(sql, params[0])
                else:
                    await self.conn.executemany(sql, params)
            groups.clear()

    async def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            await self.conn.rollback()


def _disk_full(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.Error) and "full" in str(exc).lower()


def _finish(job: _Job, error: BaseException | None) -> None:
    try:
        _settle(job, error)
    except Exception:  # a callback bug must not stop the writer
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
