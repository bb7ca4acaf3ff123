"""Every statement on the hot path uses an index: none scans a table (SPEC R-DLG-13).

The statements are the ones :mod:`brokerd.storage.queries` gives the engine for
BEGIN DIALOG's key, SEND, transmission and acknowledgement, paging a backlog in, arrival,
promotion, reassembly, RECEIVE, END CONVERSATION, MOVE CONVERSATION and timers, and the endpoint
snapshot the store writes (its multi-row INSERTs are plain inserts). Each is
run against a file with the current schema, with SQLite's trace callback
capturing the SQL actually executed (parameters expanded); then ``EXPLAIN
QUERY PLAN`` of each must show only searches (or a scan of the statement's own
``VALUES`` list), never ``SCAN <table>``.

A full scan makes a statement's cost grow with the backlog: the cost of one
RECEIVE then depends on every message waiting in its queue. Recovery's reads
at start-up read whole tables by design and are not on this list.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from brokerd.storage import body_files, queries, reads, schema

TABLES = {
    "conversation_endpoints",
    "transmission_queue",
    "queue_messages",
    "message_fragments",
    "conversation_timers",
    "begin_dialog_keys",
}
H1, H2 = str(uuid.uuid4()), str(uuid.uuid4())
G = str(uuid.uuid4())


def _schema(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(schema.CREATE_META)
    for step in schema.MIGRATIONS:
        conn.executescript(step.script)
    # Enough rows that SQLite's planner sees real tables, not empty ones.
    for i in range(1, 50):
        for h in (H1, H2):
            conn.execute(*queries.sent_message(h, i, "//t", 0, b"x", 1.0))
            conn.execute(
                *queries.queued_message("q", G, h, i, 1, "//s", "//c", "//t", 1, b"x", 1.0)
            )
    conn.execute("ANALYZE")
    return conn


def _run(conn: sqlite3.Connection, statements: list[schema.Statement]) -> None:
    for sql, params in statements:
        conn.execute(sql, params)


def _snapshot_update(conn: sqlite3.Connection) -> None:
    row = (
        H1,
        str(uuid.uuid4()),
        1,
        G,
        "//s",
        "//f",
        None,
        "//c",
        "CO",
        0,
        1.0,
        5,
        3,
        0,
        0,
        None,
        None,
    )
    conn.execute(queries.ENDPOINT_ADD, row)
    values = queries.endpoint_update_values
    conn.execute(queries.endpoint_updates(2), (*values(row), *values((H2, *row[1:]))))


HOT_PATH: dict[str, Callable[[sqlite3.Connection], object]] = {
    "SEND: the transmission queue row": lambda c: _run(
        c, [queries.sent_message(H1, 99, "//t", 0, b"x", 1.0)]
    ),
    "SEND of a large body: the row says where it is stored": lambda c: _run(
        c, [queries.stored(*queries.sent_message(H1, 98, "//t", 0, b"x", 1.0), 1 << 40)]
    ),
    "a large fragment stored: the row says where": lambda c: _run(
        c, [queries.stored(*queries.fragment(H1, 102, 0, 0, b"ab"), 2 << 40)]
    ),
    "the collector: does a row point into a segment of bodies": lambda c: body_files.referred(c, 1),
    "a large message delivered whole: its queue row says where its body is": lambda c: _run(
        c,
        [
            queries.stored(
                *queries.queued_message("q", G, H1, 103, 1, "//s", "//c", "//t", 2, b"ab", 1.0),
                3 << 40,
            )
        ],
    ),
    "RECEIVE: where a queue row's body is stored": lambda c: c.execute(
        reads.QUEUED_STORED_AT, (H1, 103)
    ),
    "compaction: the live bytes of a segment": lambda c: body_files.live_bytes(c, 1),
    "compaction: a segment's rows, each pointed elsewhere": lambda c: [
        (body_files.live_rows(c, table, 1), c.execute(body_files.MOVE_ROW[table], (2 << 40, 1)))
        for table in body_files.TABLES
    ],
    "BEGIN DIALOG: its idempotency key kept": lambda c: _run(
        c, [queries.begin_key("//s", "k", H1, "{}", 1.0)]
    ),
    "endpoint snapshots (update and insert)": _snapshot_update,
    "endpoint removal": lambda c: c.execute(queries.ENDPOINT_DELETE, (H2,)),
    "acknowledgement: unqueue through and single": lambda c: _run(
        c, queries.unqueue_sent(H1, [7, 9, 12], through=5)
    ),
    "acknowledgement of runs of a backlog": lambda c: _run(
        c, queries.unqueue_sent(H1, [], through=2, runs=[(1, 4), (8, 20)])
    ),
    "acknowledgements of many conversations in one statement": lambda c: c.execute(
        queries.unqueue_many(3), (H1, 1, 4, H2, 2, 2, H1, 9, 12)
    ),
    "a page of a backlog read in": lambda c: reads.read_sent_page(c, H1, 10, 30),
    "arrival: the queue row": lambda c: _run(
        c, [queries.queued_message("q", G, H1, 100, 2, "//s", "//c", "//t", 1, b"x", 1.0)]
    ),
    "promotion of held messages": lambda c: _run(c, queries.promote(H1, [100, 101])),
    "a fragment stored": lambda c: _run(c, [queries.fragment(H1, 101, 0, 0, b"ab")]),
    "reassembly: the last fragment completes the row": lambda c: _run(
        c, [queries.complete_in_fragments(H1, 101)]
    ),
    "RECEIVE: read and remove": lambda c: reads.read_received(
        c, [(uuid.UUID(H1), 1), (uuid.UUID(H1), 2), (uuid.UUID(H2), 3)], remove=True
    ),
    "RECEIVE of a body kept in its fragments": lambda c: (
        _run(
            c,
            [
                queries.fragment(H1, 3, 0, 0, b"a"),
                queries.fragment(H1, 3, 1, 1, b"b"),
                queries.complete_in_fragments(H1, 3),
            ],
        ),
        reads.read_received(c, [(uuid.UUID(H1), 3)], remove=True),
    ),
    "RECEIVE under RETENTION": lambda c: _run(
        c, queries.received([(uuid.UUID(H1), 4), (uuid.UUID(H2), 5)], retention=True)
    ),
    "a transaction's RECEIVE at commit": lambda c: _run(
        c, queries.received([(uuid.UUID(H1), 6), (uuid.UUID(H1), 7)], retention=False)
    ),
    "END CONVERSATION: the conversation forgotten": lambda c: _run(
        c, queries.forget_conversation(H2)
    ),
    "END CONVERSATION: received messages discarded": lambda c: _run(
        c, queries.discard_received(H1)
    ),
    "END CONVERSATION: queued messages discarded": lambda c: _run(c, queries.discard_queued(H1)),
    "an Error abandons partial messages before it": lambda c: _run(
        c, queries.abandon_before(H1, 40)
    ),
    "MOVE CONVERSATION": lambda c: _run(c, [queries.regroup(H1, str(uuid.uuid4()))]),
    "conversation timer set and forgotten": lambda c: _run(
        c, [queries.set_timer(H1, 5.0), queries.forget_timer(H1, 5.0)]
    ),
}


def _scans(conn: sqlite3.Connection, sql: str) -> list[str]:
    plan = conn.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall()
    details = [str(row[3]) for row in plan]
    return [d for d in details if d.startswith("SCAN ") and d.split()[1] in TABLES]


@pytest.mark.parametrize("name", list(HOT_PATH))
def test_hot_path_statement_uses_an_index(tmp_path: Path, name: str) -> None:
    """R-DLG-13: no hot-path statement's cost grows with the rows of a table."""
    conn = _schema(tmp_path / "plans.db")
    executed: list[str] = []
    conn.set_trace_callback(executed.append)
    HOT_PATH[name](conn)
    conn.set_trace_callback(None)
    statements = [s for s in executed if not s.startswith(("BEGIN", "COMMIT"))]
    assert statements, f"{name}: nothing was executed"
    for sql in statements:
        assert _scans(conn, sql) == [], f"{name}: {sql[:200]} scans a table"


def test_the_plan_check_sees_a_scan(tmp_path: Path) -> None:
    """The check itself: a statement without a usable index is reported."""
    conn = _schema(tmp_path / "plans.db")
    assert _scans(conn, "DELETE FROM queue_messages WHERE message_type = '//t'") == [
        "SCAN queue_messages"
    ]
