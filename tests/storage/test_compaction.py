"""Compaction of the segment files of large bodies (docs/design.md, Storage).

A body that stays while the bodies stored around it go (a message for a broker that is
down, a message nobody RECEIVEs) would keep its whole segment on disk. A segment
closed long enough whose live bodies fill less than half of it has them moved to the
survivors' segment, in a transaction of its own, durable before its COMMIT as any
stored body (R-DLG-5), and is deleted. Real SQLite files and real segment files;
the sizes and times are made small for the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from brokerd.storage import body_files, queries, reads, schema
from brokerd.storage.body_files import BodyFiles
from brokerd.storage.store import Store
from brokerd.tools import example
from tests.daemons import FAST_RETRY, client_of, drain, in_process, view

SLOW, FAST = str(uuid.uuid4()), str(uuid.uuid4())
BODY = 40 * 1024
SEGMENT = 8 * BODY


def _body(tag: int) -> bytes:
    return tag.to_bytes(4, "big", signed=True) * (BODY // 4)


def _disk(path: Path) -> tuple[int, int]:
    """Segments beside ``path`` and the bytes they hold."""
    directory = body_files.directory_of(path)
    sizes = []
    for file in directory.iterdir() if directory.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):  # the committer may be deleting it
            sizes.append(file.stat().st_size)
    return len(sizes), sum(sizes)


async def _commit(store: Store, statements: list[schema.Statement]) -> None:
    future = store.submit(statements, wait=True)
    assert future is not None
    await future


async def _interleave(store: Store, rounds: int) -> None:
    """Per round, one message of the slow dialog (never acknowledged) and a segment's
    worth of the fast one, which the fast link then acknowledges: every segment keeps
    one slow body."""
    fast = 0
    for slow in range(1, rounds + 1):
        await _commit(store, [queries.sent_message(SLOW, slow, "//t", 3, _body(slow), 1.0)])
        batch = []
        for _ in range(SEGMENT // BODY):
            fast += 1
            batch.append(queries.sent_message(FAST, fast, "//t", 3, _body(-fast), 1.0))
        await _commit(store, batch)
        await _commit(store, queries.unqueue_sent(FAST, [], through=fast))


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(body_files, "SEGMENT_BYTES", SEGMENT)
    monkeypatch.setattr(body_files, "COMPACT_AFTER", 0.2)
    monkeypatch.setattr(body_files, "COMPACT_EVERY", 0.1)


async def _settled(path: Path, most: int) -> tuple[int, int]:
    for _ in range(100):
        found = _disk(path)
        if found[1] <= most:
            return found
        await asyncio.sleep(0.1)
    return _disk(path)


@pytest.mark.usefixtures("small")
async def test_bodies_that_outlive_their_segments_are_moved_together(tmp_path: Path) -> None:
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    rounds = 12
    await _interleave(store, rounds)
    live = rounds * BODY
    # Compacted by the committer between commits and when idle: about the live bytes,
    # in the survivors' segments, where 12 segments held them.
    count, size = await _settled(path, 2 * live)
    assert size <= 2 * live, (count, size)
    bodies = store.bodies
    assert bodies is not None
    stats = await store.run(lambda _: (bodies.segments_compacted, bodies.bytes_moved))
    assert stats[0] >= rounds - 2 and stats[1] >= (rounds - 2) * BODY
    wanted = {(SLOW, n): _body(n) for n in range(1, rounds + 1)}
    read = await store.run(lambda c: reads.read_sent_bodies(c, {SLOW: list(range(1, 13))}))
    assert read == wanted
    await store.close()

    reopened = Store(path, "shop")  # the moved rows point at durable bytes
    await reopened.open()
    read = await reopened.run(lambda c: reads.read_sent_bodies(c, {SLOW: list(range(1, 13))}))
    assert read == wanted
    await _commit(reopened, queries.unqueue_sent(SLOW, [], through=rounds))
    assert (await _settled(path, 0))[1] == 0
    await reopened.close()


async def test_without_compaction_every_segment_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What compaction is for: with segments left alone for longer than the run, one
    body per segment keeps each of them."""
    monkeypatch.setattr(body_files, "SEGMENT_BYTES", SEGMENT)
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    await _interleave(store, 6)
    await asyncio.sleep(1.2)  # the collector has run: what is left is referred to
    count, size = _disk(path)
    assert count >= 6 and size >= 6 * SEGMENT - BODY
    await store.close()


def _database(tmp_path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(tmp_path / "t.sqlite", isolation_level=None)
    conn.execute(schema.CREATE_META)
    for step in schema.MIGRATIONS:
        conn.executescript(step.script)
    return conn


def _store_rows(conn: sqlite3.Connection, files: BodyFiles, rows: list[tuple[int, bytes]]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    for seq, body in rows:
        sql, params = queries.stored(*queries.sent_message(SLOW, seq, "//t", 3, body, 1.0), 0)
        params = (*params[:-2], files.store(body), len(body))
        conn.execute(sql, params)
    files.sync()
    conn.execute("COMMIT")


def _segments_of_four(
    tmp_path: Path, rows: int, deleted: tuple[int, ...], compact_after: float | None = None
) -> tuple[sqlite3.Connection, BodyFiles]:
    """Messages 1..``rows`` sent, four bodies a segment (nine: segments 1, 2 and 3), then
    ``deleted`` acknowledged."""
    conn = _database(tmp_path)
    files = BodyFiles(
        tmp_path / "t.sqlite-bodies", segment_bytes=4 * BODY, compact_after=compact_after
    )
    files.open(conn)
    _store_rows(conn, files, [(n, _body(n)) for n in range(1, rows + 1)])
    marks = ", ".join(map(str, deleted))
    conn.execute(f"DELETE FROM transmission_queue WHERE message_sequence_number IN ({marks})")
    files.committed(conn)
    return conn, files


def _positions(conn: sqlite3.Connection) -> list[int]:
    return [
        int(at)
        for (at,) in conn.execute(
            "SELECT stored_at FROM transmission_queue ORDER BY message_sequence_number"
        )
    ]


def test_a_dense_or_young_segment_is_left_where_it_is(tmp_path: Path) -> None:
    conn, files = _segments_of_four(tmp_path, 9, (1, 2, 3, 6), compact_after=3600)
    before = _positions(conn)
    assert files.compact(conn, force=True) == 0  # closed, but not long enough
    files.compact_after = 0
    files.committed(conn)
    assert files.compact(conn, force=True) == BODY  # segment 1 (a quarter live); not 2
    after = _positions(conn)
    assert [body_files.split(a)[0] for a in after] == [4, 2, 2, 2, 3]
    assert after[1:] == before[1:]
    assert sorted(p.name for p in files.directory.iterdir()) == [
        "0000000002.seg",
        "0000000003.seg",
        "0000000004.seg",
    ]
    assert files.read(after[0], BODY) == _body(4)
    files.close()
    conn.close()


def test_a_compaction_that_cannot_write_moves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk, then a failed sync, in the middle of a compaction: the rows still
    point at the old segment, which stays and reads back; the next pass moves them."""
    conn, files = _segments_of_four(tmp_path, 5, (1, 2, 3), compact_after=0)
    before = _positions(conn)

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    for call, broken in (("pwrite", full), ("fdatasync", failing)):
        monkeypatch.setattr(os, call, broken)
        with pytest.raises(OSError):
            files.compact(conn, force=True)
        monkeypatch.undo()
        assert not conn.in_transaction
        assert _positions(conn) == before
        assert files.read(before[0], BODY) == _body(4)

    assert files.compact(conn, force=True) == BODY
    moved = _positions(conn)
    assert body_files.split(moved[0])[0] != 1 and moved[1] == before[1]
    assert files.read(moved[0], BODY) == _body(4)
    files.collect(conn, force=True)
    names = sorted(p.name for p in files.directory.iterdir())
    assert "0000000001.seg" not in names
    files.close()
    conn.close()


FRAGMENT = 64 * 1024


async def test_a_message_nobody_receives_does_not_keep_its_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two brokers in this process, real dialogs over 4022: the warehouse keeps the
    fragments of a slow dialog's messages (R-DLG-7) while a fast dialog streams through
    and is RECEIVEd. The slow messages' fragments end up compacted together, and come
    out whole, exactly once and in order, when they are RECEIVEd at last."""
    monkeypatch.setattr(body_files, "COMPACT_EVERY", 0.1)
    deployment = example.shop_and_warehouse(
        tmp_path,
        retry=FAST_RETRY,
        hosts=("127.0.0.231", "127.0.0.232"),
        extra="[limits]\nbody_segment_mb = 1\nbody_compact_after = 0.2\n",
    )
    alpha, beta = deployment.daemons["alpha"], deployment.daemons["beta"]
    async with in_process(alpha.config_path) as shop_broker, in_process(beta.config_path) as wb:
        shop = await client_of(shop_broker)
        warehouse = await client_of(wb)
        fast = await shop.begin_dialog(
            example.SHOP_SERVICE, example.WAREHOUSE_SERVICE, example.CONTRACT
        )
        await shop.send(fast, example.ORDER, b"first")
        (first,) = await drain(warehouse, "OrderQueue", 1, timeout=20)
        fast_there = first.conversation_handle
        slow = await shop.begin_dialog(
            example.SHOP_SERVICE, example.WAREHOUSE_SERVICE, example.CONTRACT
        )
        slow_bodies = []
        for n in range(6):
            body = bytes([n]) * (3 * FRAGMENT + 100)
            slow_bodies.append(body)
            await shop.send(slow, example.ORDER, body)
            for k in range(4):  # a segment's worth of the fast dialog, RECEIVEd
                await shop.send(fast, example.ORDER, bytes([k]) * (4 * FRAGMENT))
            got = []
            for _ in range(20):
                got += await warehouse.receive(
                    "OrderQueue", top=10, timeout=1, conversation_handle=fast_there
                )
                if len(got) >= 4:
                    break
            assert [m.message_sequence_number for m in got] == list(range(2 + 4 * n, 6 + 4 * n))

        store = wb.databases["warehouse"].store
        live = 6 * 3 * FRAGMENT  # the slow messages' full fragments
        bound = 2 * live + 1024 * 1024  # and the survivors' segment being appended to
        for _ in range(100):
            (seen,) = [
                d for d in await view(warehouse, "databases") if d["database"] == "warehouse"
            ]
            if seen["body_segment_bytes"] <= bound:
                break
            await asyncio.sleep(0.1)
        assert seen["body_segment_bytes"] <= bound, seen
        assert seen["body_segments_compacted"] >= 4
        assert seen["body_bytes_moved"] >= 4 * 3 * FRAGMENT
        assert _disk(store.path)[1] <= bound  # what the view says is what is on disk

        got = await drain(warehouse, "OrderQueue", 6, timeout=20)
        assert [m.message_sequence_number for m in got] == list(range(1, 7))
        assert [m.message_body for m in got] == slow_bodies
        for client in (shop, warehouse):
            await client.close()


def test_a_segment_that_cannot_be_moved_does_not_hold_up_the_others(tmp_path: Path) -> None:
    """A segment cut short by hand: its live body cannot be read back to be moved (the
    error names the file) and stays where it is; the next sparse segment is compacted
    all the same."""
    conn, files = _segments_of_four(tmp_path, 9, (1, 2, 3, 5, 6, 7), compact_after=0)
    os.truncate(files.directory / "0000000001.seg", 3 * BODY + 10)
    with pytest.raises(body_files.BodyFileError, match=r"0000000001\.seg.*cut short"):
        files.compact(conn, force=True)
    positions = _positions(conn)
    assert [body_files.split(a)[0] for a in positions] == [1, 4, 3]
    assert files.read(positions[1], BODY) == _body(8)
    # Not tried again (each pass would copy and throw away what it could read) until a
    # restart, and shown in the databases view.
    files.committed(conn)
    assert files.compact(conn, force=True) == 0
    assert files.view()["body_segments_unreadable"] == 1
    files.close()
    conn.close()


def test_segments_found_at_start_up_are_as_old_as_their_files(tmp_path: Path) -> None:
    """A daemon restarted more often than ``COMPACT_AFTER`` still compacts: a segment
    found at start-up counts its age from when it was last written."""
    conn, files = _segments_of_four(tmp_path, 9, (1, 2, 3))
    files.close()
    an_hour_ago = time.time() - 3600
    os.utime(files.directory / "0000000001.seg", (an_hour_ago, an_hour_ago))

    again = BodyFiles(files.directory, segment_bytes=4 * BODY)
    again.open(conn)
    assert again.compact(conn, force=True) == BODY  # segment 1; 2 and 3 were just written
    assert [body_files.split(a)[0] for a in _positions(conn)] == [4, 2, 2, 2, 2, 3]
    again.close()
    conn.close()


_CRASH = """
import os, sqlite3, sys
from pathlib import Path
from brokerd.storage.body_files import BodyFiles

database, where = Path(sys.argv[1]), sys.argv[2]
conn = sqlite3.connect(database, isolation_level=None)
files = BodyFiles(Path(str(database) + "-bodies"), segment_bytes=int(sys.argv[3]), compact_after=0)
files.open(conn)
crash = lambda *args, **kwargs: os._exit(9)
if where == "before the COMMIT":
    sync = files.sync
    files.sync = lambda: (sync(), crash())
else:
    files._delete = crash
files.compact(conn, force=True)
os._exit(0)
"""


@pytest.mark.parametrize("where", ["before the COMMIT", "after the COMMIT"])
def test_a_crash_in_the_middle_of_a_compaction_loses_nothing(tmp_path: Path, where: str) -> None:
    """A process that dies while compacting (its bodies copied and synced, then dead
    before or after the COMMIT that points the rows at them): every row still reads
    its own body, from the old segment or from the new one, and start-up deletes
    what no row points to."""
    conn, files = _segments_of_four(tmp_path, 9, (1, 2, 3))
    files.close()
    conn.close()

    child = subprocess.run(
        [sys.executable, "-c", _CRASH, str(tmp_path / "t.sqlite"), where, str(4 * BODY)],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        timeout=60,
    )
    assert child.returncode == 9, child.stderr.decode()

    conn = sqlite3.connect(tmp_path / "t.sqlite", isolation_level=None)
    again = BodyFiles(files.directory, segment_bytes=4 * BODY)
    again.open(conn)  # deletes what no row points to
    positions = _positions(conn)
    moved = [body_files.split(a)[0] for a in positions]
    assert moved == ([1, 2, 2, 2, 2, 3] if where == "before the COMMIT" else [4, 2, 2, 2, 2, 3])
    seqs = [4, 5, 6, 7, 8, 9]
    assert [again.read(at, BODY) for at in positions] == [_body(n) for n in seqs]
    on_disk = sorted(p.name for p in again.directory.iterdir())
    assert on_disk == sorted({f"{n:010d}.seg" for n in moved})
    again.close()
    conn.close()
