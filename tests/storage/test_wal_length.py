"""The WAL of a running daemon's database file comes back to its length after an
outsized transaction (docs/design.md "Storage"; R-DLG-13: nothing committed is lost).

A real daemon of one database on 127.0.55.10, port 4022, in a process of its own; and
the connection's own copy of another file (a mirror installing its principal's).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from brokerd.storage.connection import (
    CHECKPOINT_PAGES,
    PAGE_SIZE,
    backup,
    connect,
    wal_size_limit,
)
from tests.daemons import solo_daemon

HOST = "127.0.55.10"

BODY = 30 * 1024
"""Under ``body_files.STORED_FROM``: each body is in the file's pages, so in the WAL."""


async def test_the_wal_shrinks_back_after_one_large_transaction(tmp_path: Path) -> None:
    """One client transaction commits more pages than a WAL holds between checkpoints
    (R-DLG-13: the COMMIT is durable in the WAL, so it grows past its length); the
    checkpoint that COMMIT runs copies them into the file, and the next commit cuts the
    WAL back to its length (``PRAGMA journal_size_limit``) instead of holding the disk
    for ever. Every message committed is still there."""
    limit = wal_size_limit(PAGE_SIZE)
    assert limit == 32 + CHECKPOINT_PAGES * (24 + PAGE_SIZE)  # a header, a frame a page
    count = limit // BODY + 300  # past the limit, whatever the rows add
    async with solo_daemon(tmp_path, HOST) as (deployment, client):
        (path,) = (deployment.daemons["solo"].directory / "data").rglob("Solo*.sqlite")
        wal = Path(f"{path}-wal")
        # no route leads to the far service: the messages stay in the transmission queue
        dialog = await client.begin_dialog("//solo/S1", "//solo/nowhere")
        async with client.transaction() as tx:
            for first in range(0, count, 100):
                await tx.send_many(
                    [
                        (dialog.handle, "DEFAULT", n.to_bytes(4, "big") * (BODY // 4))
                        for n in range(first, min(count, first + 100))
                    ]
                )
        assert wal.stat().st_size > limit  # the one COMMIT is in the WAL whole
        other = await client.begin_dialog("//solo/S1", "//solo/nowhere")
        await client.send(other.handle, body=b"a small commit after the checkpoint")
        assert wal.stat().st_size <= limit
        queued = [row async for row in client.view_rows("transmission_queue")]
        assert len(queued) == count + 1


def test_a_copy_of_another_page_size_limits_the_wal_for_its_own(tmp_path: Path) -> None:
    """A mirror's file of 16 KiB pages (made by an earlier version) takes a principal's
    copy of 4 KiB pages (``connection.backup``): its WAL is then limited to the length of
    :data:`CHECKPOINT_PAGES` frames of the pages it now has, not of those it had."""
    old = tmp_path / "mirror.sqlite"
    made = sqlite3.connect(old)
    made.execute("PRAGMA page_size=16384")
    made.execute("PRAGMA journal_mode=WAL")
    made.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    made.close()
    source = connect(tmp_path / "principal.sqlite")
    source.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    mirror = connect(old)
    assert mirror.execute("PRAGMA journal_size_limit").fetchone()[0] == wal_size_limit(16384)
    backup(source, mirror)
    assert mirror.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE
    assert mirror.execute("PRAGMA journal_size_limit").fetchone()[0] == wal_size_limit(PAGE_SIZE)
    source.close()
    mirror.close()
