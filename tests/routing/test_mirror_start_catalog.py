"""What a mirrored database's start writes: its configuration's catalog, with real daemons
on 127.0.28.11:4022 (the principal) and 127.0.28.12:4022 (the mirror).

SPEC ids: R-ROUTE-16 (the principal ships each committed unit of work; the mirror's file
changes only by what the principal ships: its own writes to the mirrored database fail;
at promotion the new principal rebuilds its image from its file as recovery does at
start), R-DLG-12 (a queue's status, as ALTER QUEUE set it, outlives a restart unless
the configuration's own status changed).
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from brokerd.tools.launcher import Deployment
from tests.routing.deploy import mirroring, wait_caught_up

P1, P2 = "127.0.28.11", "127.0.28.12"
PARTS = "//catalog/Parts"
AUDIT = "//catalog/Audit"
INSTANCE = uuid.UUID("5b0c8e2a-7d41-4f3e-9c6a-2e8f1d7b3a94")


def parts_database(role: str, partner: str, *, changed: bool) -> str:
    """The Parts database: its queue on; ``changed``: the queue declared off, and a second
    queue and service (Audit) added."""
    text = (
        f'\n[[database]]\nname = "Parts"\nbroker_instance = "{INSTANCE}"\n'
        f'mirror_role = "{role}"\nmirror_partner = "tcp://{partner}:4022"\n'
        f'[[database.queue]]\nname = "Q_Parts"\nstatus = {"false" if changed else "true"}\n'
        f'[[database.service]]\nname = "{PARTS}"\nqueue = "Q_Parts"\ncontracts = ["DEFAULT"]\n'
    )
    if changed:
        text += (
            '[[database.queue]]\nname = "Q_Audit"\n'
            f'[[database.service]]\nname = "{AUDIT}"\nqueue = "Q_Audit"\n'
            'contracts = ["DEFAULT"]\n'
        )
    return text


def catalog(path: Path) -> dict[str, Counter[tuple[Any, ...]]]:
    """The catalog tables of a database file, read while its daemon runs."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return {
            table: Counter(tuple(row) for row in conn.execute(f"SELECT * FROM {table}"))
            for table in ("queues", "services", "service_contracts", "routes")
        }


async def queue_status(deployment: Deployment, name: str) -> str:
    client = await deployment.daemons[name].client()
    try:
        (row,) = [q for q in await client.queues() if q.queue == "Q_Parts"]
        return row.status
    finally:
        await client.close()


async def test_a_start_writes_its_catalog_as_a_unit_the_mirror_gets_and_a_mirror_writes_none(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16, R-DLG-12: the principal restarted with a configuration that turns its
    queue off and adds a queue and a service writes that catalog as a unit it ships: the
    mirror's file holds what the principal's holds. The mirror restarted with the same
    configuration writes nothing to its file (it takes only what the principal ships).
    An ALTER QUEUE made at the principal after its restart then holds after a failover,
    as it would after a restart of the principal. Before, both starts wrote the catalog
    outside the units: the principal's never reached the mirror, the mirror's own went
    past its fence, and the promoted mirror found its queue off."""
    deployment.add("p1", P1, parts_database("principal", P2, changed=False))
    deployment.add("p2", P2, parts_database("mirror", P1, changed=False))
    deployment.start("p1")
    deployment.start("p2")
    await wait_caught_up(deployment, "p1", "p2")
    files = {
        name: deployment.daemons[name].directory / "data" / "Parts.sqlite" for name in ("p1", "p2")
    }

    deployment.stop("p1")
    deployment.add("p1", P1, parts_database("principal", P2, changed=True))
    deployment.start("p1")
    await wait_caught_up(deployment, "p1", "p2")
    assert await asyncio.to_thread(catalog, files["p2"]) == await asyncio.to_thread(
        catalog, files["p1"]
    ), "the mirror's file lacks the catalog the principal's start wrote"

    p1 = await deployment.daemons["p1"].client()
    await p1.alter_queue("Q_Parts", True, database="Parts")  # on again, after the restart
    await p1.close()
    await wait_caught_up(deployment, "p1", "p2")
    lsn = (await mirroring(deployment, "p2"))["lsn"]

    deployment.stop("p2")
    deployment.add("p2", P2, parts_database("mirror", P1, changed=True))
    deployment.start("p2")
    await wait_caught_up(deployment, "p1", "p2")
    assert (await mirroring(deployment, "p2"))["lsn"] == lsn
    shipped = await asyncio.to_thread(catalog, files["p2"])
    assert shipped == await asyncio.to_thread(catalog, files["p1"]), (
        "the mirror's start wrote its own catalog into its file"
    )

    deployment.kill("p1")
    p2 = await deployment.daemons["p2"].client()
    await p2.set_mirror_role("Parts", "principal")
    await p2.close()
    assert await queue_status(deployment, "p2") == "on", "the promoted mirror's queue is off"
