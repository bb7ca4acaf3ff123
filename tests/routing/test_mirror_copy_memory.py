"""The memory a copy of a mirrored database's file costs, with real daemons on
127.0.58.21:4022 (the principal) and 127.0.58.22:4022 (the mirror).

SPEC ids: R-ROUTE-16 (the principal ships a copy of its whole file to a mirror whose last
unit is not in its history).
"""

from __future__ import annotations

import hashlib
import sqlite3
import uuid
from pathlib import Path

from brokerd.tools.launcher import Deployment
from tests.daemons import wait_until
from tests.routing.deploy import database, mirroring

P1, P2 = "127.0.58.21", "127.0.58.22"
PARTS_INSTANCE = uuid.UUID("9e4b7c21-6d3a-4f85-b0c2-5a8e1d7f3b94")
SIZE_MB = 64


def parts_database(role: str, partner: str) -> str:
    text = database("Parts", ["//copied/Parts"], [], PARTS_INSTANCE, mirror_role=role)
    head, sep, tail = text.partition("[[database.queue]]")
    return f'{head}mirror_partner = "tcp://{partner}:4022"\n{sep}{tail}'


def peak_rss_mb(pid: int) -> int:
    """The process's peak resident memory (``VmHWM``), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise AssertionError(f"no VmHWM for {pid}")


def filler_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        for (blob,) in conn.execute("SELECT b FROM filler ORDER BY rowid"):
            digest.update(blob)
    return digest.hexdigest()


async def test_a_copy_of_the_file_is_sent_and_installed_in_bounded_memory(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16: a mirror that is not in the principal's history gets a copy of its file
    (here 64 MiB). Neither partner's peak memory grows by half of it: the copy is written
    to a file and sent a chunk at a time as the connection takes it, received into a file
    and installed from there; the mirror's file then holds what the principal's does, and
    no file of the copy is left behind. Before, the copy was held whole in memory on both
    sides, about three times over."""
    deployment.add("p1", P1, parts_database("principal", P2))
    deployment.add("p2", P2, parts_database("mirror", P1))
    deployment.start("p1")
    principal = await deployment.daemons["p1"].client()
    await principal.create_route("Parts", "unit", f"tcp://{P2}:4022", remote_service_name="//x")
    await principal.close()
    deployment.stop("p1")  # restarted, its history is its file's last unit only
    p1_file = deployment.daemons["p1"].directory / "data" / "Parts.sqlite"
    with sqlite3.connect(p1_file) as conn:
        conn.execute("CREATE TABLE filler (b BLOB)")
        conn.executemany("INSERT INTO filler VALUES (randomblob(1048576))", [()] * SIZE_MB)
    expected = filler_digest(p1_file)
    p1 = deployment.start("p1")
    assert p1.process is not None
    before = peak_rss_mb(p1.process.pid)
    p2 = deployment.start("p2")
    assert p2.process is not None

    async def installed() -> bool:
        return int((await mirroring(deployment, "p2"))["snapshots_installed"]) == 1

    await wait_until(installed, 30)
    grown = {
        "principal": peak_rss_mb(p1.process.pid) - before,
        "mirror": peak_rss_mb(p2.process.pid) - before,
    }
    assert max(grown.values()) < SIZE_MB / 2, f"peak memory grew by {grown} MiB"
    p2_file = deployment.daemons["p2"].directory / "data" / "Parts.sqlite"
    assert filler_digest(p2_file) == expected
    left = [p.name for d in (p1_file.parent, p2_file.parent) for p in d.glob("Parts.sqlite.copy-*")]
    assert left == []
