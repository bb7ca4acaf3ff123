"""The bounds of a unit of work shipped to the mirror, with an in-process principal on
127.0.56.1:4022 and its mirror daemon on 127.0.56.2:4022.

SPEC ids: R-ROUTE-16 (the principal ships each committed unit of work to the mirror, which
applies it and confirms; the principal never commits and ships a unit its mirror refuses).
"""

from __future__ import annotations

import sqlite3

import pytest

from brokerd.errors import StoreError
from brokerd.server.mirroring import Partner
from brokerd.storage import queries
from brokerd.tools.launcher import Deployment
from protocol import mirroring
from tests.daemons import in_process, wait_until
from tests.routing.test_mirror_copies import parts_database

P1, P2 = "127.0.56.1", "127.0.56.2"


def too_many_texts() -> list[tuple[str, tuple[str, ...]]]:
    """One more distinct SQL text than a mirror decodes in one unit."""
    return [
        (f"INSERT OR REPLACE INTO meta (key, value) VALUES ('probe {i}', ?)", ("x",))
        for i in range(mirroring.MAX_SQL_TEXTS + 1)
    ]


async def test_a_unit_the_mirror_would_refuse_is_not_committed_and_the_pair_goes_on(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16: a transaction whose unit of work is beyond what a mirror decodes (here
    more distinct statements than ``MAX_SQL_TEXTS``) fails before its commit, and leaves
    nothing in the file; the group commit it was part of commits the other jobs, each
    shipped and confirmed, and the mirror keeps up. Before, the principal committed it,
    could not encode it for the mirror, and the mirror, missing that LSN, never applied
    another unit."""
    deployment.add("p1", P1, parts_database("principal", P2))
    deployment.add("p2", P2, parts_database("mirror", P1))
    deployment.start("p2")
    async with in_process(deployment.daemons["p1"].config_path) as broker:
        partner: Partner = broker.mirroring.by_name["Parts"]
        store = partner.db.store

        async def attached() -> bool:
            return partner.session is not None and partner.confirmed == partner.replica.lsn

        await wait_until(attached, 20)
        before = partner.replica.lsn
        # one group commit: a job before, the oversized one, a job after
        first = store.submit([queries.meta("probe before", "1")], wait=True)
        oversized = store.submit(too_many_texts(), wait=True)
        after = store.submit([queries.meta("probe after", "2")], wait=True)
        assert first is not None and oversized is not None and after is not None
        await first
        with pytest.raises(StoreError, match="mirror"):
            await oversized
        await after

        async def confirmed() -> bool:
            return partner.confirmed == partner.replica.lsn > before

        await wait_until(confirmed, 10)
    mirror_file = deployment.daemons["p2"].directory / "data" / "Parts.sqlite"
    with sqlite3.connect(f"file:{mirror_file}?mode=ro", uri=True) as conn:
        keys = {row[0] for row in conn.execute("SELECT key FROM meta WHERE key LIKE 'probe%'")}
    assert keys == {"probe before", "probe after"}
