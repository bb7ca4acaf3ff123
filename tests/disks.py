"""A small file system of the test's own, to fill: a tmpfs mounted (root only) and
unmounted at the end, so that a full disk is a real one; and a database file kept from
growing (:func:`limit_pages`)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.storage.store import Store


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (made here), unmounted at the end; the test
    is skipped where it cannot be mounted (not root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last block; the filler's path (unlink it
    to give the space back)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        return filler
    finally:
        os.close(fd)


async def limit_pages(store: Store, pages: int | None) -> None:
    """Let a database's file grow by ``pages`` pages at most (None: no limit), on its
    committer's own connection: a write that needs a page more fails with SQLITE_FULL,
    as on a full disk."""

    def run(conn: sqlite3.Connection) -> None:
        if pages is None:
            conn.execute("PRAGMA max_page_count = 1073741823")
        else:
            current = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {current + pages}")

    await store.run(run)


async def read_only(store: Store, on: bool) -> None:
    """Make a database refuse every write (``PRAGMA query_only``, SQLITE_READONLY) on its
    committer's own connection, or accept them again: a commit that fails as on a file
    that cannot be written. Run between its batches, outside a transaction."""

    def run(conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA query_only = {1 if on else 0}")

    await store.read(run)
