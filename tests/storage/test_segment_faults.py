"""Faults around the segment files of large bodies (R-DLG-5: nothing acknowledged is lost;
docs/design.md, Storage, "Large bodies outside SQLite").

Real SQLite files and real segment files, with real faults: a process out of file
descriptors when a segment must be created, a small tmpfs that fills up in the middle of
a body, a segment lost by hand, and rows whose lengths cannot be right. Each must end
in a clear error naming the file, or in nothing lost, never in wrong bytes.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.errors import StoreError
from brokerd.storage import body_files, queries, reads, schema
from brokerd.storage.body_files import STORED_FROM, BodyFileError
from brokerd.storage.store import Store
from tests.disks import small_tmpfs

H = str(uuid.uuid4())
LARGE = bytes(range(256)) * (STORED_FROM // 256 + 3)


def _body(tag: int, size: int = len(LARGE)) -> bytes:
    return tag.to_bytes(4, "big") * (size // 4)


async def _commit(store: Store, statements: list[schema.Statement]) -> None:
    future = store.submit(statements, wait=True)
    assert future is not None
    await future


async def _read(store: Store, seqs: list[int]) -> dict[tuple[str, int], bytes]:
    return await store.run(lambda conn: reads.read_sent_bodies(conn, {H: seqs}))


@contextlib.contextmanager
def _no_descriptor_left() -> Iterator[None]:
    """The process may open no more files (``EMFILE``) until the block ends."""
    probe = os.open(os.devnull, os.O_RDONLY)
    os.close(probe)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (probe, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_segment_that_cannot_be_created_leaves_no_descriptor_behind(
    tmp_path: Path,
) -> None:
    """R-DLG-5: a daemon out of file descriptors (``EMFILE``, many links) when a body
    needs a new segment fails that SEND with a clear error. The segment it was leaving
    must not be closed under the committer's feet: a later body must neither go to a
    descriptor the process has since reused for another file nor to a segment that was
    never created, where it would be acknowledged and lost at the next restart."""
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop", segment_bytes=3 * len(LARGE))
    await store.open()
    await _commit(store, [queries.sent_message(H, 1, "//t", 3, _body(1), 1.0)])

    big = _body(2, 2 * len(LARGE) + 4)  # does not fit after body 1: a new segment
    with _no_descriptor_left():
        future = store.submit([queries.sent_message(H, 2, "//t", 3, big, 1.0)], wait=True)
        assert future is not None
        with pytest.raises(StoreError, match="Too many open files"):
            await future

    witness = tmp_path / "witness"
    witness.write_bytes(b"w" * (4 * len(LARGE)))
    fd = os.open(witness, os.O_RDWR)  # may get the number of a descriptor just closed
    try:
        await _commit(store, [queries.sent_message(H, 3, "//t", 3, _body(3), 1.0)])
        os.fstat(fd)  # still open: the store closed nothing of ours
        assert witness.read_bytes() == b"w" * (4 * len(LARGE))
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    await store.close()

    again = Store(path, "shop", segment_bytes=3 * len(LARGE))
    await again.open()
    assert await _read(again, [1, 3]) == {(H, 1): _body(1), (H, 3): _body(3)}
    await again.close()


async def test_a_restart_never_reuses_the_number_of_a_segment_a_row_points_to(
    tmp_path: Path,
) -> None:
    """A row whose segment is missing (lost, deleted by hand, or copied without it)
    cannot be sent or received: its read fails with an error naming the segment
    (docs/design.md, "A database is its file and its segments"). The daemon must never
    create a new segment under that name, or the row would read another message's
    bytes as its own."""
    path = tmp_path / "shop.sqlite"
    for seq in (1, 2):  # one segment per run: 0000000001.seg, 0000000002.seg
        store = Store(path, "shop")
        await store.open()
        await _commit(store, [queries.sent_message(H, seq, "//t", 3, _body(seq), 1.0)])
        await store.close()
    (body_files.directory_of(path) / "0000000002.seg").unlink()

    store = Store(path, "shop")
    await store.open()
    await _commit(store, [queries.sent_message(H, 3, "//t", 3, _body(3), 1.0)])
    assert await _read(store, [1, 3]) == {(H, 1): _body(1), (H, 3): _body(3)}
    with pytest.raises(StoreError, match=r"0000000002\.seg"):
        await _read(store, [2])
    await store.close()


@pytest.mark.parametrize("length", [-1, 1 << 40, 1 << 62])
async def test_a_row_whose_length_cannot_be_right_is_refused_with_its_file_name(
    tmp_path: Path, length: int
) -> None:
    """A ``stored_length`` read from a damaged row is checked against its segment
    before it is trusted: the read fails with an error naming the segment, without
    asking for a buffer of that size, both through the committer's segment files and
    through a tool's own connection."""
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    await _commit(store, [queries.sent_message(H, 1, "//t", 3, _body(1), 1.0)])
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE transmission_queue SET stored_length = ?", (length,))
    with pytest.raises(StoreError, match=r"0000000001\.seg"):
        await _read(store, [1])
    await store.close()

    conn = sqlite3.connect(path)
    try:
        with pytest.raises(BodyFileError, match=r"0000000001\.seg"):
            reads.read_sent_bodies(conn, {H: [1]})
    finally:
        conn.close()


async def test_the_directory_of_segments_is_its_users_only(tmp_path: Path) -> None:
    """docs/design.md, Security defaults: what holds message bodies is readable by the
    daemon's user only: segments 0600 in a directory 0700, whatever the umask of the
    process that made them (a tool, an embedded store)."""
    path = tmp_path / "shop.sqlite"
    old = os.umask(0o022)
    try:
        store = Store(path, "shop")
        await store.open()
        await _commit(store, [queries.sent_message(H, 1, "//t", 3, _body(1), 1.0)])
        await store.close()
    finally:
        os.umask(old)
    directory = body_files.directory_of(path)
    assert directory.stat().st_mode & 0o777 == 0o700
    assert [p.stat().st_mode & 0o777 for p in directory.iterdir()] == [0o600]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A file system of 2 MiB (tmpfs), unmounted afterwards."""
    with small_tmpfs(tmp_path / "disk", "2m") as mount:
        yield mount


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


async def test_a_body_cut_short_by_a_full_disk_gives_its_space_back(small_disk: Path) -> None:
    """R-DLG-5, docs/design.md "A full disk is a full disk": a body that does not fit
    fails its SEND with "the disk is full" and commits nothing; what was written of it
    is given back (the segment returns to its durable length), so the disk is not kept
    full by bytes no row will ever point to, and the next commit that fits goes on."""
    path = small_disk / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    await _commit(store, [queries.sent_message(H, 1, "//t", 3, _body(1), 1.0)])
    segment = body_files.directory_of(path) / "0000000001.seg"
    free = _free(small_disk)

    too_big = _body(2, 4 * 1024 * 1024)
    future = store.submit([queries.sent_message(H, 2, "//t", 3, too_big, 1.0)], wait=True)
    assert future is not None
    with pytest.raises(StoreError, match="disk is full"):
        await future
    assert segment.stat().st_size == len(LARGE)
    assert _free(small_disk) >= free - 64 * 1024

    await _commit(store, [queries.sent_message(H, 2, "//t", 3, _body(2), 1.0)])
    assert await _read(store, [1, 2]) == {(H, 1): _body(1), (H, 2): _body(2)}
    await store.close()
