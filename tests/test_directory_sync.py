"""The names of what a durable commit or a durable trace event depends on are durable too
(R-DLG-5, R-TRACE-1): a file or directory created is only sure to be found after a power
loss once the directory holding its name is fsynced. A power loss cannot be made in a
test; the daemon runs in the test's process and the test watches which directories
``os.fsync`` is called on (the calls go through to the real one).

SQLite syncs the directory of a database file itself when it creates the file's journal or
WAL (C code, not seen here); the directory above it, which the daemon creates, is the
daemon's to sync.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from brokerd.config import TraceConfig
from brokerd.storage.body_files import STORED_FROM, directory_of
from brokerd.storage.store import Store
from brokerd.traces.writer import TraceWriter
from tests.daemons import client_of, solo_broker

HOST = "127.0.16.5"


@pytest.fixture
def synced_directories(monkeypatch: pytest.MonkeyPatch) -> set[Path]:
    """The directories ``os.fsync`` is called on from now on, in any thread."""
    synced: set[Path] = set()
    real: Callable[[int], None] = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced.add(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


async def test_the_directories_a_new_daemon_creates_are_synced_in_their_parents(
    tmp_path: Path, synced_directories: set[Path]
) -> None:
    """R-DLG-5, R-TRACE-1: a first start creates the data directory (its database file,
    client token, trace directory and directory of large bodies in it): each directory
    created is synced in the directory above it, and each directory a file is created
    in (a trace segment, a segment of large bodies) is synced."""
    root = tmp_path.resolve()
    async with solo_broker(root, HOST) as broker:
        data = broker.config.data_dir.resolve()
        client = await client_of(broker)
        try:
            # No route to this service: the message waits in the transmission queue, its
            # body in a segment file of its own directory.
            handle = await client.begin_dialog("//solo/S1", "//elsewhere/Nobody", "DEFAULT")
            await client.send(handle, "DEFAULT", b"x" * STORED_FROM)
        finally:
            await client.close()
        bodies = directory_of(broker.databases["Solo"].store.path).resolve()
        traces = broker.trace.config.directory.resolve()
    assert bodies.is_dir() and any(bodies.iterdir())
    expected = {
        data.parent: "the data directory's name",
        data: "the trace directory's, the bodies directory's and the token's names",
        traces: "the trace segments' names",
        bodies: "the body segments' names",
    }
    missing = {why for path, why in expected.items() if path not in synced_directories}
    assert missing == set(), sorted(synced_directories)


async def test_a_database_directory_created_is_synced_in_its_parent(
    tmp_path: Path, synced_directories: set[Path]
) -> None:
    """R-DLG-5: a database file in directories that do not exist yet: each directory the
    store creates is synced in the one above it, before anything is committed there."""
    root = tmp_path.resolve()
    store = Store(root / "a" / "b" / "shop.sqlite", "shop")
    await store.open()
    try:
        assert {root, root / "a"} <= synced_directories, sorted(synced_directories)
    finally:
        await store.close()


async def test_a_trace_directory_created_is_synced_in_its_parent(
    tmp_path: Path, synced_directories: set[Path]
) -> None:
    """R-TRACE-1: durable trace events go to segments whose names are synced in the trace
    directory; the trace directory's own name, and its parents' the writer creates, are
    synced in the directories above them."""
    root = tmp_path.resolve()
    writer = TraceWriter(TraceConfig(directory=root / "a" / "traces"), "alpha")
    await writer.start()
    try:
        assert {root, root / "a", root / "a" / "traces"} <= synced_directories, sorted(
            synced_directories
        )
    finally:
        await writer.stop()
