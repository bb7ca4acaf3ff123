"""The admin port's summary of the messages held for queues that are off
(``reads.read_held_summary``, SPEC R-OPS-1, R-DLG-12 Decision) against a real file: its
count and its oldest rows are those of every held message (``reads.read_held_for``), in
the view's order, enqueue times that show alike to the microsecond included."""

from __future__ import annotations

import sqlite3
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from brokerd.storage import queries, reads, schema


def _file(path: Path, rows: list[tuple[str, int, int, float]]) -> sqlite3.Connection:
    """A file holding ``rows``: (queue, sequence number, status, enqueued at), each of a
    conversation of its own."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(schema.CREATE_META)
    for step in schema.MIGRATIONS:
        conn.executescript(step.script)
    conn.execute("BEGIN")
    for queue, seq, status, at in rows:
        handle, group = str(uuid.uuid4()), str(uuid.uuid4())
        conn.execute(
            *queries.queued_message(
                queue, group, handle, seq, status, "//s", "//c", "//t", 1, b"x", at
            )
        )
    conn.execute("COMMIT")
    return conn


def _shown(row: Any) -> str:
    """A held row's enqueue time as the view shows it (the key the summary sorts by)."""
    return datetime.fromtimestamp(float(row[5]), UTC).isoformat()


def test_the_oldest_held_rows_are_those_of_all_of_them(tmp_path: Path) -> None:
    """R-OPS-1: 3,000 held rows, inserted out of time order, many sharing an enqueue time
    or apart by less than a microsecond; rows of a queue that is on, or received: not
    counted. The summary's rows, sorted as the view sorts, begin with the n oldest of
    all held rows, ties in the file's order, and are few."""
    base = 1_800_000_000.0
    rows = []
    for n in range(3_000):
        at = base + ((n * 7919) % 1_000) * 1e-6 + (n % 3) * 1e-7
        rows.append(("off", n, 1, at))
        rows.append(("on", n, 1, base - 1))
        rows.append(("off", 100_000 + n, 2, base - 1))
    conn = _file(tmp_path / "held.db", rows)
    every = reads.read_held_for(conn, ["off"])
    assert len(every) == 3_000
    for n in (1, 10, 50, 200):
        count, oldest = reads.read_held_summary(conn, ["off"], n)
        assert count == 3_000
        assert len(oldest) <= 3 * n + 10

        expected = sorted(every, key=_shown)[:n]
        assert [tuple(r) for r in sorted(oldest, key=_shown)[:n]] == [tuple(r) for r in expected]


def test_nothing_held_reads_nothing(tmp_path: Path) -> None:
    conn = _file(tmp_path / "none.db", [("on", 1, 1, 1.0)])
    assert reads.read_held_summary(conn, ["off"], 50) == (0, [])
