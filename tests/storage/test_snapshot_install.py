"""Crashes at awkward moments of the store: what a start after ``kill -9`` finds.

Real SQLite files; the crash is a child process that dies (``os._exit``) at the
moment named, as ``kill -9`` would leave it.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

from brokerd.storage import queries, schema
from brokerd.storage.replica import Replica
from brokerd.storage.store import Store

_INSTALL_THEN_DIE = """
import asyncio, os, sys
from pathlib import Path
from brokerd.storage import queries
from brokerd.storage import store as store_module
from brokerd.storage.replica import Replica
from brokerd.storage.store import Store

copy = store_module.backup

def copy_then_die(source, conn):
    copy(source, conn)
    os._exit(9)

store_module.backup = copy_then_die

async def main() -> None:
    mirror = Store(Path(sys.argv[1]), "shop")
    mirror.replica = Replica(role=lambda: "mirror", epoch=lambda: 2)
    await mirror.open()
    own = [queries.meta("mirror_role", "mirror"), queries.meta("mirror_epoch", "2")]
    await mirror.install_snapshot(Path(sys.argv[2]), own)

asyncio.run(main())
os._exit(0)
"""


def _meta(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        return {str(k): str(v) for k, v in conn.execute(schema.READ_META)}
    finally:
        conn.close()


async def test_a_mirror_killed_as_it_installs_a_copy_stays_the_mirror(tmp_path: Path) -> None:
    """R-ROUTE-15, R-ROUTE-16: the role and epoch a partner keeps for itself survive a
    restart. A mirror that dies just after the principal's copy replaced its file's
    content must not find the principal's role in its file at the next start (it would
    start as a second principal at the same epoch): the copy and the mirror's own
    ``meta`` keys are one durable change."""
    principal = Store(tmp_path / "principal.sqlite", "shop")
    principal.replica = Replica(role=lambda: "principal", epoch=lambda: 2)
    await principal.open()
    await principal.execute_now(
        [
            queries.meta("mirror_role", "principal"),
            queries.meta("mirror_epoch", "2"),
            queries.sent_message(str(uuid.uuid4()), 1, "//t", 0, b"x", 1.0),
        ]
    )
    image = tmp_path / "image"
    await principal.snapshot_to(image)
    await principal.close()

    path = tmp_path / "mirror.sqlite"
    mirror = Store(path, "shop")
    mirror.replica = Replica(role=lambda: "mirror", epoch=lambda: 2)
    await mirror.open()
    await mirror.execute_now(
        [queries.meta("mirror_role", "mirror"), queries.meta("mirror_epoch", "2")]
    )
    await mirror.close()

    child = subprocess.run(
        [sys.executable, "-c", _INSTALL_THEN_DIE, str(path), str(image)],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        timeout=60,
    )
    assert child.returncode == 9, child.stderr.decode()

    meta = _meta(path)
    assert meta.get("mirror_role") == "mirror"
    assert meta.get("mirror_epoch") == "2"
