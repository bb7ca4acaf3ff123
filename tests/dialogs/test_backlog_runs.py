"""The runs of numbers of an endpoint's backlog (pure), and recovery from a real file of a
transmission queue with gaps (messages acknowledged out of order), R-DLG-13."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

from brokerd.config import DatabaseConfig
from brokerd.dialogs.endpoints.backlog import Backlog
from brokerd.dialogs.endpoints.database import Database
from brokerd.storage import queries, reads, schema


def test_backlog_runs_merge_split_and_page() -> None:
    b = Backlog()
    assert not b and len(b) == 0
    b.add(3, 10)
    b.add(11)
    b.add(20, 25)
    assert b.runs == [[3, 11], [20, 25]] and len(b) == 15 and b.first == 3
    assert 11 in b and 12 not in b and 20 in b
    assert b.span(4) == (3, 6)
    assert b.span(9) == (3, 11)
    assert b.span(10) == (3, 20)
    assert b.span(100) == (3, 25)
    assert b.remove(5, 6) == [(5, 6)]  # acknowledged out of order
    assert b.runs == [[3, 4], [7, 11], [20, 25]] and len(b) == 13
    assert b.remove(1, 21) == [(3, 4), (7, 11), (20, 21)]
    assert b.runs == [[22, 25]] and len(b) == 4
    assert list(b) == [22, 23, 24, 25]
    taken = b.clear()
    assert taken == [(22, 25)] and not b
    b.add(30)
    b.restore(taken)  # an ending that failed to commit puts them back
    assert b.runs == [[22, 25], [30, 30]] and len(b) == 5
    b.add(24, 27)  # out of order (never expected): merged, each number once
    assert b.runs == [[22, 27], [30, 30]] and len(b) == 7


async def test_recovery_of_a_queue_with_gaps_reads_only_numbers(tmp_path: Path) -> None:
    """A conversation whose queue has gaps (messages acknowledged out of order) is
    recovered with exactly its numbers; one without gaps from its bounds alone."""
    config = DatabaseConfig(name="shop")
    db = Database(config, tmp_path)
    await db.open()
    await db.store.close()
    whole, gaps = str(uuid.uuid4()), str(uuid.uuid4())
    conn = sqlite3.connect(tmp_path / "shop.sqlite", isolation_level=None)
    for handle, numbers in ((whole, range(5, 105)), (gaps, [1, 2, 3, 7, 8, 12])):
        endpoint = [handle, str(uuid.uuid4()), 1, str(uuid.uuid4()), "//s", "//f", None]
        endpoint += ["//c", "CO", 0, 1.0, 200, 0, 0, 0, None, None]
        conn.execute(queries.ENDPOINT_ADD, endpoint)
        for n in numbers:
            conn.execute(*queries.sent_message(handle, n, "//t", 0, b"x" * 10, 1.0))
    conn.close()
    again = Database(config, tmp_path)
    await again.open()
    try:
        waiting = await again.recover()
        by_handle = {str(ep.handle): ep for ep in waiting}
        assert by_handle[whole].backlog.runs == [[5, 104]] and len(by_handle[whole].backlog) == 100
        assert by_handle[gaps].backlog.runs == [[1, 3], [7, 8], [12, 12]]
        assert all(not ep.outbox for ep in waiting)
        page = await again.store.run(
            lambda c: reads.read_sent_page(c, gaps, *by_handle[gaps].backlog.span(4))
        )
        assert [row[0] for row in page] == [1, 2, 3, 7]
        assert page[0][1:4] == ("//t", 0, 10)
    finally:
        await again.store.close()


def test_runs_of_a_backlog_leave_the_file_by_range(tmp_path: Path) -> None:
    """An acknowledgement's runs beyond ``through`` delete exactly those rows."""
    conn = sqlite3.connect(tmp_path / "t.sqlite", isolation_level=None)
    conn.execute(schema.CREATE_META)
    for step in schema.MIGRATIONS:
        conn.executescript(step.script)
    handle, other = str(uuid.uuid4()), str(uuid.uuid4())
    for h in (handle, other):
        for n in range(1, 13):
            conn.execute(*queries.sent_message(h, n, "//t", 0, b"x", 1.0))
    for sql, params in queries.unqueue_sent(handle, [], through=3, runs=[(2, 5), (8, 10)]):
        conn.execute(sql, params)
    left = [n for (n,) in conn.execute(queries.READ_SENT_NUMBERS, (handle,))]
    assert left == [6, 7, 11, 12]
    assert len(conn.execute(queries.READ_SENT_NUMBERS, (other,)).fetchall()) == 12
