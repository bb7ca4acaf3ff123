"""RECEIVE reads a conversation's run of rows in one step (``reads._received_rows``):
the same rows, byte for byte, as stepping them one by one, against a real file.

Stepping row by row hands the GIL over at every row, which beside a busy event loop can
cost a switch interval each (R-DLG-13's "no per-row GIL hand-off"); one aggregate row
carries the run instead, while its bodies are small enough to join."""

from __future__ import annotations

import sqlite3
import time
import uuid
from pathlib import Path

from brokerd.storage import queries, reads, schema

H = uuid.uuid4()


def _queue(path: Path, rows: list[tuple[int, str, bytes, float, str]]) -> sqlite3.Connection:
    """A queue file holding ``rows`` of conversation ``H``: (seq, type, body, enqueued at,
    group)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(schema.CREATE_META)
    for step in schema.MIGRATIONS:
        conn.executescript(step.script)
    for seq, message_type, body, at, group in rows:
        conn.execute(
            *queries.queued_message(
                "q", group, str(H), seq, 1, "//s", "//c", message_type, len(body), body, at
            )
        )
    return conn


def _stepped(
    conn: sqlite3.Connection, seqs: list[int], handle: uuid.UUID = H
) -> list[dict[str, object]]:
    """The rows of conversation ``handle`` as stepping them one by one reads them."""
    marks = ",".join("?" * len(seqs))
    cursor = conn.execute(
        "SELECT conversation_handle, message_sequence_number, conversation_group_id, "
        "service_name, contract, message_type, body, enqueued_at, queue_name FROM "
        f"queue_messages WHERE conversation_handle = ? AND message_sequence_number IN ({marks})",
        [str(handle), *seqs],
    )
    by_seq = {int(r[1]): r for r in cursor}
    return [
        {
            "conversation_handle": r[0],
            "message_sequence_number": int(r[1]),
            "conversation_group_id": r[2],
            "service_name": r[3],
            "service_contract_name": r[4],
            "message_type_name": r[5],
            "message_body": bytes(r[6] or b""),
            "message_enqueue_time": float(r[7]),
            "queue": r[8],
        }
        for r in (by_seq[s] for s in seqs)
    ]


def _read(conn: sqlite3.Connection, seqs: list[int]) -> tuple[list[dict[str, object]], list[str]]:
    executed: list[str] = []
    conn.set_trace_callback(executed.append)
    rows, used = reads.read_received(conn, [(H, s) for s in seqs])
    conn.set_trace_callback(None)
    assert used == len(seqs)
    return rows, executed


def test_a_run_read_at_once_is_the_rows_byte_for_byte(tmp_path: Path) -> None:
    """Bodies with NUL bytes, invalid UTF-8, commas and nothing at all; message types with
    commas, quotes and non-ASCII letters; enqueue times to the last bit of the double."""
    now = time.time()
    bodies = [b"\x00\x00", b"\xff\xfe,\x00x", b"", b",", "ü,\"'".encode(), bytes(range(256))]
    types = ["//t", "//a,b", '//q"uote', "//ü", "//t", "//t"]
    rows = [
        (seq, types[seq % 6], bodies[seq % 6] * (seq % 3 + 1), now + seq / 7.0, "g")
        for seq in range(1, 61)
    ]
    conn = _queue(tmp_path / "q.db", rows)
    seqs = [*range(1, 41), 45, 50, 60]
    got, executed = _read(conn, seqs)
    assert got == _stepped(conn, seqs)
    assert [r["message_enqueue_time"] for r in got] == [rows[s - 1][3] for s in seqs]
    # One aggregate row for the run 1..40 and one for the numbers listed alone.
    assert sum("group_concat" in sql for sql in executed) == 2


def test_bodies_too_large_to_join_are_stepped(tmp_path: Path) -> None:
    big = reads.AT_ONCE_BYTES // 2 + 1
    rows = [(seq, "//t", bytes([seq]) * big, 1.5 + seq, "g") for seq in range(1, 4)]
    conn = _queue(tmp_path / "q.db", rows)
    got, executed = _read(conn, [1, 2, 3])
    assert got == _stepped(conn, [1, 2, 3])
    assert [len(r["message_body"]) for r in got] == [big] * 3  # type: ignore[arg-type]
    assert not any("group_concat" in sql for sql in executed)


def test_rows_of_one_conversation_in_different_groups_are_stepped(tmp_path: Path) -> None:
    """Every row keeps its own group, even if a conversation's rows ever disagree."""
    rows = [(seq, "//t", b"x", 1.0, "g1" if seq < 3 else "g2") for seq in range(1, 5)]
    conn = _queue(tmp_path / "q.db", rows)
    got, _ = _read(conn, [1, 2, 3, 4])
    assert got == _stepped(conn, [1, 2, 3, 4])
    assert [r["conversation_group_id"] for r in got] == ["g1", "g1", "g2", "g2"]


def test_a_run_with_a_row_without_body_is_stepped(tmp_path: Path) -> None:
    """A NULL body is not an empty one (an empty body marks a message kept in its
    fragments, ``schema.IN_FRAGMENTS``): such a run is read as stepping reads it."""
    rows = [(seq, "//t", b"x" * seq, 1.0, "g") for seq in range(1, 5)]
    conn = _queue(tmp_path / "q.db", rows)
    conn.execute(
        "UPDATE queue_messages SET body = NULL WHERE conversation_handle = ? "
        "AND message_sequence_number = 3",
        (str(H),),
    )
    got, executed = _read(conn, [1, 2, 3, 4])
    assert got == _stepped(conn, [1, 2, 3, 4])
    assert [r["message_body"] for r in got] == [b"x", b"xx", b"", b"xxxx"]
    assert not any("group_concat" in sql for sql in executed)


def _many(path: Path, count: int, per: int, body: bytes = b"") -> sqlite3.Connection:
    """``count`` conversations of ``per`` rows each, whose groups, services, contracts
    and queues hold commas, quotes and non-ASCII letters."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(schema.CREATE_META)
    for step in schema.MIGRATIONS:
        conn.executescript(step.script)
    now = time.time()
    for c in range(count):
        handle = str(HANDLES[c])
        for seq in range(1, per + 1):
            data = body or f"{c},{seq}\x00\xff".encode() * seq
            conn.execute(
                *queries.queued_message(
                    f'q,"{c % 2}',
                    f"g,{c}ü",
                    handle,
                    seq,
                    1,
                    f'//s"{c}',
                    f"//c,{c}",
                    f"//t{seq}",
                    len(data),
                    data,
                    now + seq / 7.0,
                )
            )
    return conn


HANDLES = [uuid.uuid4() for _ in range(5)]


def _stepped_many(conn: sqlite3.Connection, items: list[tuple[uuid.UUID, int]]) -> list[object]:
    return [row for handle, seq in items for row in _stepped(conn, [seq], handle)]


def test_rows_of_many_conversations_read_at_once_are_the_rows_byte_for_byte(
    tmp_path: Path,
) -> None:
    """A RECEIVE of many conversation groups reads all their rows in one aggregate row:
    each row its own conversation's group, service, contract and queue, whatever they
    hold, and the same bytes and times as stepping."""
    conn = _many(tmp_path / "q.db", 5, 4)
    items = [(h, s) for h in HANDLES for s in (1, 2, 4)]
    executed: list[str] = []
    conn.set_trace_callback(executed.append)
    rows, used = reads.read_received(conn, items)
    conn.set_trace_callback(None)
    assert used == len(items)
    assert rows == _stepped_many(conn, items)
    assert sum("group_concat" in sql for sql in executed) == 1


def test_rows_of_many_conversations_with_a_null_body_or_large_bodies_are_stepped(
    tmp_path: Path,
) -> None:
    conn = _many(tmp_path / "q.db", 3, 3)
    conn.execute(
        "UPDATE queue_messages SET body = NULL WHERE conversation_handle = ? "
        "AND message_sequence_number = 2",
        (str(HANDLES[1]),),
    )
    items = [(h, s) for h in HANDLES[:3] for s in (1, 2, 3)]
    executed: list[str] = []
    conn.set_trace_callback(executed.append)
    rows, _ = reads.read_received(conn, items)
    conn.set_trace_callback(None)
    assert rows == _stepped_many(conn, items)
    assert not any("group_concat" in sql for sql in executed)
    big = _many(tmp_path / "big.db", 3, 1, b"y" * (reads.AT_ONCE_BYTES // 2 + 1))
    items = [(h, 1) for h in HANDLES[:3]]
    rows, _ = reads.read_received(big, items)
    assert rows == _stepped_many(big, items)
