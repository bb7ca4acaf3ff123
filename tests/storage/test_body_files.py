"""Large bodies of the transmission queue in segment files beside the database
(R-DLG-5: durable before the SEND is answered; docs/design.md, Storage).

Real SQLite files and real segment files: a large body leaves its row for a segment
and reads back whole, a small one stays in its row, a segment goes once no row points
into it (after commits, when idle, at start-up), a write that fails leaves nothing
behind and is reported as a full disk, and a database that becomes mirrored takes its
bodies back into its rows.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import uuid
from pathlib import Path

import pytest

from brokerd.errors import StoreError
from brokerd.storage import body_files, queries, reads, schema
from brokerd.storage.body_files import STORED_FROM, BodyFiles
from brokerd.storage.replica import Replica
from brokerd.storage.store import Store

H = str(uuid.uuid4())
LARGE = bytes(range(256)) * (STORED_FROM // 256 + 3)
SMALL = b"s" * (STORED_FROM - 1)


def _segments(path: Path) -> list[str]:
    directory = body_files.directory_of(path)
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def _rows(path: Path) -> list[tuple[int, int, int | None, int | None]]:
    with sqlite3.connect(path) as conn:
        return [
            (int(seq), len(body), stored_at, length)
            for seq, body, stored_at, length in conn.execute(
                "SELECT message_sequence_number, body, stored_at, stored_length "
                "FROM transmission_queue ORDER BY message_sequence_number"
            )
        ]


async def _read(store: Store, seqs: list[int]) -> dict[tuple[str, int], bytes]:
    return await store.run(lambda conn: reads.read_sent_bodies(conn, {H: seqs}))


async def test_a_large_body_is_stored_beside_the_file_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    assert _segments(path) == []  # nothing made until a body needs it
    await _commit(
        store,
        [
            queries.sent_message(H, 1, "//t", 3, LARGE, 1.0),
            queries.sent_message(H, 2, "//t", 3, SMALL, 2.0),
        ],
    )
    await _commit(store, [queries.sent_message(H, 3, "//t", 3, LARGE[::-1], 3.0)])
    assert await _read(store, [1, 2, 3]) == {(H, 1): LARGE, (H, 2): SMALL, (H, 3): LARGE[::-1]}
    page = await store.run(lambda conn: reads.read_sent_page(conn, H, 1, 3))
    assert [(seq, length) for seq, _, _, length, _ in page] == [
        (1, len(LARGE)),
        (2, len(SMALL)),
        (3, len(LARGE)),
    ]
    await store.close()

    rows = _rows(path)
    assert [(seq, size) for seq, size, _, _ in rows] == [(1, 0), (2, len(SMALL)), (3, 0)]
    assert rows[1][2:] == (None, None)
    assert rows[0][3] == rows[2][3] == len(LARGE)
    (segment,) = _segments(path)
    data = (body_files.directory_of(path) / segment).read_bytes()
    assert data == LARGE + LARGE[::-1]  # appended in commit order, nothing else

    reopened = Store(path, "shop")  # a restart reads them back from the same segment
    await reopened.open()
    assert await _read(reopened, [1, 3]) == {(H, 1): LARGE, (H, 3): LARGE[::-1]}
    await reopened.close()


async def test_a_large_fragment_received_is_stored_beside_the_file(tmp_path: Path) -> None:
    """The fragments of a large message arriving (R-DLG-7) go to a segment, read back
    whole for reassembly and RECEIVE, their lengths known to recovery without reading."""
    path = tmp_path / "warehouse.sqlite"
    store = Store(path, "warehouse")
    await store.open()
    pieces = [LARGE, LARGE[::-1], SMALL]
    offsets = [0, len(LARGE), 2 * len(LARGE)]
    await _commit(
        store,
        [queries.fragment(H, 7, i, offsets[i], piece) for i, piece in enumerate(pieces)],
    )
    fragments = await store.run(lambda conn: reads.read_fragments(conn, H, 7))
    assert fragments == dict(enumerate(pieces))
    positions = await store.fetchall(queries.READ_FRAGMENT_POSITIONS)
    assert [tuple(r)[2:5] for r in positions] == [
        (i, offsets[i], len(piece)) for i, piece in enumerate(pieces)
    ]
    await store.close()
    with sqlite3.connect(path) as conn:
        stored = conn.execute(
            "SELECT fragment_index, length(data), stored_length FROM message_fragments "
            "ORDER BY fragment_index"
        ).fetchall()
    assert stored == [(0, 0, len(LARGE)), (1, 0, len(LARGE)), (2, len(SMALL), None)]
    (segment,) = _segments(path)
    assert (body_files.directory_of(path) / segment).read_bytes() == LARGE + LARGE[::-1]


async def test_receive_joins_stored_fragments_in_runs_and_removes_them(tmp_path: Path) -> None:
    """RECEIVE of messages kept in their fragments (R-DLG-7): fragments stored one after
    the other are read back in one piece, others (another message's between them, a
    short last one in its row) each in turn; the body comes out whole and in order,
    and once the rows are gone so is the segment."""
    path = tmp_path / "warehouse.sqlite"
    store = Store(path, "warehouse")
    await store.open()
    group = str(uuid.uuid4())
    other = LARGE[1:] + LARGE[:1]
    first = [LARGE, LARGE[::-1], other, SMALL]

    def row(seq: int, length: int) -> schema.Statement:
        return queries.queued_message("q", group, H, seq, 2, "//s", "//c", "//t", length, None, 1.0)

    at = [0, len(LARGE), 2 * len(LARGE), 3 * len(LARGE)]
    await _commit(store, [row(1, sum(map(len, first))), queries.fragment(H, 1, 0, 0, LARGE)])
    await _commit(store, [row(2, len(other)), queries.fragment(H, 2, 0, 0, other)])
    await _commit(
        store,
        [queries.fragment(H, 1, i, at[i], first[i]) for i in (1, 2, 3)]
        + [queries.complete_in_fragments(H, n) for n in (1, 2)]
        + queries.promote(H, [1, 2]),
    )
    items = [(uuid.UUID(H), 1), (uuid.UUID(H), 2)]
    rows, used = await store.run(lambda conn: reads.read_received(conn, items, remove=True))
    assert used == 2
    assert [r["message_body"] for r in rows] == [b"".join(first), other]
    assert [tuple(r) for r in await store.fetchall("SELECT count(*) FROM message_fragments")] == [
        (0,)
    ]
    for _ in range(50):
        if not _segments(path):
            break
        await asyncio.sleep(0.1)
    assert _segments(path) == []
    await store.close()


async def test_a_segment_goes_once_no_row_points_into_it(tmp_path: Path) -> None:
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    await _commit(store, [queries.sent_message(H, n, "//t", 3, LARGE, 1.0) for n in (1, 2)])
    assert len(_segments(path)) == 1
    await _commit(store, queries.unqueue_sent(H, [], through=1))
    assert len(_segments(path)) == 1  # message 2 still points into it
    await _commit(store, queries.unqueue_sent(H, [], through=2))
    # Put off by the first collection's time, then run by the idle committer.
    for _ in range(50):
        if not _segments(path):
            break
        await asyncio.sleep(0.1)
    assert _segments(path) == []
    await _commit(store, [queries.sent_message(H, 3, "//t", 3, LARGE, 1.0)])
    assert _segments(path) == ["0000000002.seg"]  # a new segment, never the deleted one
    assert await _read(store, [3]) == {(H, 3): LARGE}
    await store.close()


async def test_a_restart_deletes_what_a_crash_left_and_begins_a_new_segment(
    tmp_path: Path,
) -> None:
    """Bodies written but never committed (a crash between the write and the COMMIT)
    and segments nothing points to are gone after a restart; a segment is never
    appended to after one."""
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    await _commit(store, [queries.sent_message(H, 1, "//t", 3, LARGE, 1.0)])
    await store.close()
    directory = body_files.directory_of(path)
    (directory / "0000000007.seg").write_bytes(b"torn, never committed")
    (directory / "notes.txt").write_text("not a segment")

    store = Store(path, "shop")
    await store.open()
    assert _segments(path) == ["0000000001.seg", "notes.txt"]
    await _commit(store, [queries.sent_message(H, 2, "//t", 3, LARGE, 1.0)])
    assert _segments(path) == ["0000000001.seg", "0000000008.seg", "notes.txt"]
    assert await _read(store, [1, 2]) == {(H, 1): LARGE, (H, 2): LARGE}
    await store.close()


async def test_a_failed_write_commits_nothing_and_says_the_disk_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    await _commit(store, [queries.sent_message(H, 1, "//t", 3, LARGE, 1.0)])

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    future = store.submit(
        [queries.sent_message(H, 2, "//t", 3, LARGE, 1.0), queries.meta("k", "v")], wait=True
    )
    assert future is not None
    with pytest.raises(StoreError, match="disk is full"):
        await future
    monkeypatch.undo()  # room again
    assert [seq for seq, *_ in _rows(path)] == [1]
    (segment,) = _segments(path)
    assert (body_files.directory_of(path) / segment).stat().st_size == len(LARGE)
    await _commit(store, [queries.sent_message(H, 2, "//t", 3, LARGE[::-1], 1.0)])
    assert await _read(store, [1, 2]) == {(H, 1): LARGE, (H, 2): LARGE[::-1]}
    await store.close()


async def test_a_failed_sync_commits_nothing_and_leaves_its_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed ``fdatasync`` what the kernel kept is unknown: the batch fails,
    and the next bodies go to a new segment, never after the bytes of that one."""
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    await _commit(store, [queries.sent_message(H, 1, "//t", 3, LARGE, 1.0)])

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", failing)
    future = store.submit([queries.sent_message(H, 2, "//t", 3, LARGE, 1.0)], wait=True)
    assert future is not None
    with pytest.raises(StoreError):
        await future
    monkeypatch.undo()  # the disk answers again
    assert [seq for seq, *_ in _rows(path)] == [1]
    await _commit(store, [queries.sent_message(H, 2, "//t", 3, LARGE[::-1], 1.0)])
    assert _segments(path) == ["0000000001.seg", "0000000002.seg"]
    assert await _read(store, [1, 2]) == {(H, 1): LARGE, (H, 2): LARGE[::-1]}
    await store.close()


async def test_a_database_that_becomes_mirrored_takes_its_bodies_back(tmp_path: Path) -> None:
    """R-ROUTE-16: a mirrored database ships SQL and copies of its file, so its bodies
    live in its rows; those stored beside the file before (a message sent, one in its
    queue, a fragment) are read back into their rows."""
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    await _commit(store, [queries.sent_message(H, n, "//t", 3, LARGE, 1.0) for n in (1, 2)])
    group = str(uuid.uuid4())
    queued = queries.queued_message(
        "q", group, H, 5, 1, "//s", "//c", "//t", len(LARGE), LARGE, 1.0
    )
    await _commit(store, [queued, queries.fragment(H, 6, 0, 0, LARGE[::-1])])
    await store.close()
    assert len(_segments(path)) == 1

    mirrored = Store(path, "shop")
    mirrored.replica = Replica(role=lambda: "principal", epoch=lambda: 1)
    await mirrored.open()
    await _commit(mirrored, [queries.sent_message(H, 3, "//t", 3, LARGE, 1.0)])
    assert await _read(mirrored, [1, 2, 3]) == {(H, n): LARGE for n in (1, 2, 3)}
    rows, _ = await mirrored.run(
        lambda conn: reads.read_received(conn, [(uuid.UUID(H), 5)], remove=False)
    )
    assert rows[0]["message_body"] == LARGE
    assert await mirrored.run(lambda conn: reads.read_fragments(conn, H, 6)) == {0: LARGE[::-1]}
    await mirrored.close()
    assert [(size, stored) for _, size, stored, _ in _rows(path)] == [(len(LARGE), None)] * 3
    with sqlite3.connect(path) as conn:
        for table, column in (("queue_messages", "body"), ("message_fragments", "data")):
            (row,) = conn.execute(f"SELECT length({column}), stored_at FROM {table}").fetchall()
            assert row == (len(LARGE), None), table
    assert _segments(path) == []


def test_a_segment_is_closed_for_appends_when_full(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "t.sqlite")
    conn.execute(schema.CREATE_META)
    for step in schema.MIGRATIONS:
        conn.executescript(step.script)
    files = BodyFiles(tmp_path / "t.sqlite-bodies", segment_bytes=2 * len(LARGE))
    files.open(conn)
    at = [files.store(LARGE) for _ in range(3)]
    files.sync()
    assert [body_files.split(a) for a in at] == [(1, 0), (1, len(LARGE)), (2, 0)]
    assert all(files.read(a, len(LARGE)) == LARGE for a in at)
    with pytest.raises(body_files.BodyFileError, match="cut short"):
        files.read(at[2], len(LARGE) + 1)
    files.close()
    conn.close()


def test_a_segment_left_by_a_failed_sync_has_nothing_left_to_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment left after a failed ``fdatasync`` is closed: nothing of it waits for a
    sync any more, so the files are not dirty (what ``collect`` waits for before it
    closes an unreferenced segment still appended to) until the next body is stored."""
    conn = sqlite3.connect(tmp_path / "t.sqlite")
    conn.execute(schema.CREATE_META)
    for step in schema.MIGRATIONS:
        conn.executescript(step.script)
    files = BodyFiles(tmp_path / "t.sqlite-bodies")
    files.open(conn)
    files.store(LARGE)
    files.sync()
    files.store(LARGE)
    assert files.dirty

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError):
        files.sync()
    monkeypatch.undo()
    files.discard()  # the transaction rolled back
    assert not files.dirty
    at = files.store(LARGE)
    assert files.dirty
    assert body_files.split(at) == (2, 0)  # never after the bytes of the left segment
    files.sync()
    assert not files.dirty
    files.close()
    conn.close()


async def _commit(store: Store, statements: list[schema.Statement]) -> None:
    """``statements`` through the group commit (where bodies go to segments)."""
    future = store.submit(statements, wait=True)
    assert future is not None
    await future
