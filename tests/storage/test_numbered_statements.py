"""RECEIVE reads and removes its messages by runs of consecutive numbers (``BETWEEN``)
and lists the numbers alone (``IN``): exactly the messages it took, never a neighbour
(R-DLG-1: what RECEIVE removes reaches the application), against a real file."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

from brokerd.storage import queries, reads, schema, sequence_runs

H1, H2 = uuid.uuid4(), uuid.uuid4()


def _queue(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(schema.CREATE_META)
    for step in schema.MIGRATIONS:
        conn.executescript(step.script)
    for handle in (H1, H2):
        for seq in [*range(-3, 0), *range(1, 21)]:  # the broker's own messages are negative
            body = f"{handle} {seq}".encode()
            conn.execute(
                *queries.queued_message(
                    "q", "g", str(handle), seq, 1, "//s", "//c", "//t", len(body), body, 1.0
                )
            )
    return conn


def _left(conn: sqlite3.Connection, handle: uuid.UUID) -> list[int]:
    rows = conn.execute(
        "SELECT message_sequence_number FROM queue_messages WHERE conversation_handle = ? "
        "ORDER BY message_sequence_number",
        (str(handle),),
    )
    return [int(row[0]) for row in rows]


def _take_exactly(conn: sqlite3.Connection, items: list[tuple[uuid.UUID, int]]) -> list[str]:
    """RECEIVE's read-and-remove of ``items`` in one transaction: every item read, in the
    order given, with its own body; returns the SQL statements it ran."""
    executed: list[str] = []
    conn.set_trace_callback(executed.append)
    conn.execute("BEGIN")
    rows, used = reads.read_received(conn, items, remove=True)
    conn.execute("COMMIT")
    conn.set_trace_callback(None)
    assert used == len(items)
    assert [(r["conversation_handle"], r["message_sequence_number"]) for r in rows] == [
        (str(h), s) for h, s in items
    ]
    assert [r["message_body"] for r in rows] == [f"{h} {s}".encode() for h, s in items]
    return executed


def test_runs_and_single_numbers_read_and_remove_exactly_the_items(tmp_path: Path) -> None:
    conn = _queue(tmp_path / "q.db")
    taken = [-2, -1, 1, 2, 3, 5, 7, 8, 9, 10, 20]
    items = [(H1, s) for s in taken]
    executed = _take_exactly(conn, items)
    assert _left(conn, H1) == [-3, 4, 6, *range(11, 20)]
    assert _left(conn, H2) == ALL
    # -2..-1, 1..3, 7..10 are ranges; 5 and 20 are listed. Each is read by two statements
    # (the bodies' size, then the rows at once) and removed by one.
    assert sum("BETWEEN" in sql for sql in executed) == 3 * 3
    assert sum(" IN (" in sql for sql in executed) == 1 * 3


ALL = [*range(-3, 0), *range(1, 21)]


def test_items_of_many_conversations_are_a_few_statements_for_all(tmp_path: Path) -> None:
    """A RECEIVE of many conversation groups: the runs of every conversation are spans of
    one statement (``sequence_runs.SPANS_PER_STATEMENT`` a statement), read in two and
    removed in one, exactly the items taken."""
    conn = _queue(tmp_path / "q.db")
    items = [(H1, s) for s in (-2, -1, 1, 2, 3, 5, 20)] + [(H2, 4), (H2, 7), (H2, 8)]
    executed = _take_exactly(conn, items)
    assert _left(conn, H1) == [-3, 4, *range(6, 20)]
    assert _left(conn, H2) == [n for n in ALL if n not in (4, 7, 8)]
    assert len([sql for sql in executed if "queue_messages" in sql]) == 3


def test_more_spans_than_one_statement_takes(tmp_path: Path) -> None:
    """Every other number of two conversations (each alone, a span of its own) over
    more spans than one statement holds: every item read and removed, no neighbour."""
    conn = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
    conn.execute(schema.CREATE_META)
    for step in schema.MIGRATIONS:
        conn.executescript(step.script)
    numbers = range(1, 2 * sequence_runs.SPANS_PER_STATEMENT + 1)
    for handle in (H1, H2):
        for seq in numbers:
            body = f"{handle} {seq}".encode()
            conn.execute(
                *queries.queued_message(
                    "q", "g", str(handle), seq, 1, "//s", "//c", "//t", len(body), body, 1.0
                )
            )
    items = [(h, s) for h in (H1, H2) for s in numbers if s % 2]
    conn.execute("BEGIN")
    rows, used = reads.read_received(conn, items, remove=True)
    conn.execute("COMMIT")
    assert used == len(items)
    assert [r["message_body"] for r in rows] == [f"{h} {s}".encode() for h, s in items]
    evens = [s for s in numbers if not s % 2]
    assert _left(conn, H1) == evens and _left(conn, H2) == evens
    for sql, params in queries.received([(H1, s) for s in evens[:3]] + [(H2, 2)], False):
        conn.execute(sql, params)
    assert _left(conn, H1) == evens[3:] and _left(conn, H2) == evens[1:]


def test_a_budget_removes_only_what_it_keeps(tmp_path: Path) -> None:
    """The cut is made before anything is removed: the rows beyond it stay queued."""
    conn = _queue(tmp_path / "q.db")
    items = [(H1, s) for s in range(1, 11)]
    conn.execute("BEGIN")
    rows, used = reads.read_received(conn, items, budget=lambda rows: 4, remove=True)
    conn.execute("COMMIT")
    assert [r["message_sequence_number"] for r in rows] == [1, 2, 3, 4]
    assert used == 4
    assert _left(conn, H1) == [-3, -2, -1, *range(5, 21)]


def test_a_budget_across_many_conversations_removes_only_what_it_keeps(tmp_path: Path) -> None:
    """A RECEIVE of many groups cut by its budget removes the items it keeps, not the
    spans it read (which it removes as they are when it keeps them all)."""
    conn = _queue(tmp_path / "q.db")
    items = [(H1, 1), (H1, 2), (H2, 1), (H2, 2), (H2, 3)]
    conn.execute("BEGIN")
    rows, used = reads.read_received(conn, items, budget=lambda rows: 3, remove=True)
    conn.execute("COMMIT")
    assert [(r["conversation_handle"], r["message_sequence_number"]) for r in rows] == [
        (str(H1), 1),
        (str(H1), 2),
        (str(H2), 1),
    ]
    assert used == 3
    assert _left(conn, H1) == [n for n in ALL if n not in (1, 2)]
    assert _left(conn, H2) == [n for n in ALL if n != 1]


def test_spans_cut_once_are_the_statements_of_the_items() -> None:
    """RECEIVE removes the spans it read with :func:`sequence_runs.over_spans`: the same
    statements :func:`sequence_runs.by_sequence_numbers` makes of the items, and each
    handle's text comes with its integer."""
    items = [(uuid.uuid4(), 7) for _ in range(300)] + [(H1, 1), (H1, 2), (H1, 5), (H2, 3)]
    conversations, ints = sequence_runs.by_conversation_keyed(items)
    assert conversations == sequence_runs.by_conversation(items)
    assert ints == {str(h): h.int for h, _ in items}
    for verb in (sequence_runs.REMOVE_MANY, sequence_runs.RETAIN_MANY):
        assert sequence_runs.over_spans(
            verb, sequence_runs.span_chunks(conversations)
        ) == sequence_runs.by_sequence_numbers(verb, items)


def test_received_statements_under_retention_keep_the_rows(tmp_path: Path) -> None:
    """RETENTION keeps the messages with status 0, by the same runs and lists (and spans,
    for several conversations)."""
    conn = _queue(tmp_path / "q.db")
    for sql, params in queries.received([(H1, 1), (H1, 2), (H1, 3), (H1, 9)], retention=True):
        conn.execute(sql, params)
    kept = conn.execute(
        "SELECT message_sequence_number FROM queue_messages WHERE status = 0 "
        "ORDER BY message_sequence_number"
    ).fetchall()
    assert [int(row[0]) for row in kept] == [1, 2, 3, 9]
    for sql, params in queries.received([(H1, 11), (H2, 1), (H2, 2)], retention=True):
        conn.execute(sql, params)
    kept = conn.execute(
        "SELECT conversation_handle, message_sequence_number FROM queue_messages "
        "WHERE status = 0 ORDER BY conversation_handle, message_sequence_number"
    ).fetchall()
    assert sorted((h, int(s)) for h, s in kept) == sorted(
        [(str(H1), s) for s in (1, 2, 3, 9, 11)] + [(str(H2), 1), (str(H2), 2)]
    )
