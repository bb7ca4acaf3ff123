"""How a batch of store jobs becomes SQL, inside the committer's transaction.

Owns the grouping of a batch's statements (every INSERT group first, then every
UPDATE and DELETE group, function jobs as barriers), the multi-row statements that
cross the GIL once per chunk instead of once per row, and the endpoint rows written
once per endpoint and batch (``queries.merge_snapshots``).

May import: ``brokerd.storage.schema``, ``brokerd.storage.queries`` and
``brokerd.storage.body_files``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from functools import lru_cache
from itertools import chain
from typing import Any, Protocol

from brokerd.storage import queries
from brokerd.storage.body_files import STORED_FROM, BodyFiles
from brokerd.storage.queries import (
    ENDPOINT_DELETE,
    ENDPOINT_SNAPSHOT,
    KEEPING_HELD,
    MANY_ROWS,
    STORABLE,
    endpoint_update_values,
    merge_snapshots,
    stored,
)
from brokerd.storage.schema import Statement


class Part(Protocol):
    """What a batch is made of: a store job's statements, or a function of the
    connection whose result it keeps."""

    @property
    def statements(self) -> Sequence[Statement]: ...

    @property
    def fn(self) -> Callable[[sqlite3.Connection], Any] | None: ...

    result: Any


def apply_batch(
    conn: sqlite3.Connection, batch: Sequence[Part], bodies: BodyFiles | None = None
) -> None:
    """Every job's statements, in as few ``executemany`` calls as possible.

    Between two function jobs, statements are grouped by SQL text: every INSERT
    group first (in order of first appearance), then every UPDATE and DELETE
    group. Jobs therefore must not rely on an UPDATE or DELETE running before
    an INSERT of the same batch; the dialog engine's statements never do (an
    update or delete always concerns a row committed earlier or inserted by the
    same or an earlier job). Nor may two UPDATEs or DELETEs of different text that
    touch one row depend on their order: the groups run in order of their first
    appearance, not of the jobs (a message's row gets its body and its status from
    two statements that commute); the deletes that keep held and partial rows run
    after every other group (``queries.KEEPING_HELD``). Endpoint snapshots are
    deduplicated per endpoint and written last, after the endpoint rows the batch
    removes: a snapshot is a whole row (R-DLG-1: a committed job's endpoint row is in
    the file).

    With ``bodies``, a body of :data:`STORED_FROM` bytes or more that a
    transmission-queue row, a received fragment or a service queue's row would carry is
    appended to a segment file and the row says where
    (:mod:`brokerd.storage.body_files`); the caller makes the file durable before the
    COMMIT.
    """
    inserts: dict[str, list[Sequence[Any]]] = {}
    changes: dict[str, list[Sequence[Any]]] = {}
    endpoints: dict[Any, Sequence[Any] | None] = {}
    for job in batch:
        for sql, params in job.statements:
            if sql == ENDPOINT_SNAPSHOT:
                earlier = endpoints.get(params[0])
                endpoints[params[0]] = (
                    params if earlier is None else merge_snapshots(earlier, params)
                )
            elif sql == ENDPOINT_DELETE:
                endpoints[params[0]] = None
            elif sql.startswith("INSERT"):
                if bodies is not None and sql in STORABLE:
                    body = params[STORABLE[sql][1]]
                    if body is not None and len(body) >= STORED_FROM:
                        sql, params = stored(sql, params, bodies.store(body))
                inserts.setdefault(sql, []).append(params)
            else:
                changes.setdefault(sql, []).append(params)
        if job.fn is not None:
            _flush(conn, inserts, changes)
            job.result = job.fn(conn)
    _flush(conn, inserts, changes)
    # Rows removed first: a new endpoint's row may take the (conversation id, role) of
    # one removed in the same batch (a late copy of a first message as the old target
    # goes), and its insert, which ignores a row already there, would be lost.
    gone = [(handle,) for handle, row in endpoints.items() if row is None]
    if gone:
        conn.executemany(ENDPOINT_DELETE, gone)
    rows = [row for row in endpoints.values() if row is not None]
    if rows:
        _write_endpoints(conn, rows)


def _flush(
    conn: sqlite3.Connection,
    inserts: dict[str, list[Sequence[Any]]],
    changes: dict[str, list[Sequence[Any]]],
) -> None:
    for sql, rows in inserts.items():
        _insert_many(conn, sql, rows)
    inserts.clear()
    groups = list(changes.items())
    if any(sql in KEEPING_HELD for sql, _ in groups):
        # after the releases and completions of the batch (queries.KEEPING_HELD)
        groups.sort(key=lambda group: group[0] in KEEPING_HELD)
    for sql, params in groups:
        if len(params) == 1:
            conn.execute(sql, params[0])
        elif sql in MANY_ROWS:
            many = MANY_ROWS[sql]
            for start in range(0, len(params), ROWS_PER_STATEMENT):
                chunk = params[start : start + ROWS_PER_STATEMENT]
                conn.execute(many(len(chunk)), list(chain.from_iterable(chunk)))
        else:
            conn.executemany(sql, params)
    changes.clear()


ROWS_PER_STATEMENT = 128
"""Rows of one multi-row INSERT (at most 17 columns: far below SQLite's 32,766 variables)."""


@lru_cache(maxsize=2048)
def _multi_row(sql: str, count: int) -> str:
    head, _, values = sql.rpartition("VALUES ")
    return f"{head}VALUES {', '.join([values] * count)}"


def _insert_many(conn: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """``sql`` (an ``INSERT ... VALUES (?, ...)``) for every row, many rows per statement.

    ``executemany`` steps SQLite once per row, and the sqlite3 module releases
    and retakes the GIL around every step: beside a busy event loop, each
    retake can wait out the interpreter's switch interval. One statement per
    chunk of rows crosses that boundary once per chunk.
    """
    if len(rows) == 1:
        conn.execute(sql, rows[0])
        return
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[start : start + ROWS_PER_STATEMENT]
        conn.execute(_multi_row(sql, len(chunk)), list(chain.from_iterable(chunk)))


@lru_cache(maxsize=ROWS_PER_STATEMENT)
def _endpoint_updates(count: int) -> str:
    return queries.endpoint_updates(count)


def _write_endpoints(conn: sqlite3.Connection, rows: Sequence[Sequence[Any]]) -> None:
    """Endpoint snapshots: an UPDATE of the columns that change for the endpoints that
    have a row (no index is touched), then an insert of the ones that are new."""
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[start : start + ROWS_PER_STATEMENT]
        flat = list(chain.from_iterable(map(endpoint_update_values, chunk)))
        changed = conn.execute(_endpoint_updates(len(chunk)), flat).rowcount
        if changed < len(chunk):
            _insert_many(conn, queries.ENDPOINT_ADD, chunk)
