"""What a promoted mirror writes as it rebuilds its image, with real daemons on
127.0.57.11:4022 (the principal) and 127.0.57.12:4022 (the mirror).

SPEC ids: R-ROUTE-16 (at promotion the new principal rebuilds its in-memory image from
its file as recovery does at start; the mirror's file changes only by what the principal
ships), R-OBJ-5 (a route is known by its name, compared without regard to case).
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path

from brokerd.tools.launcher import Deployment
from tests.daemons import wait_until
from tests.routing.deploy import R, addr, database, mirroring, wait_caught_up

P1, P2 = "127.0.57.11", "127.0.57.12"
NOWHERE = "127.0.57.99"
"""A route's address that no test sends to."""
PARTS = "//promoted/Parts"
PARTS_INSTANCE = uuid.UUID("3f6d2a8c-1b7e-4c5d-9a0f-8e2b4c6d1a3e")


def parts_database(role: str, partner: str, routes: list[R]) -> str:
    text = database("Parts", [PARTS], routes, PARTS_INSTANCE, mirror_role=role)
    head, sep, tail = text.partition("[[database.queue]]")
    return f'{head}mirror_partner = "tcp://{partner}:4022"\n{sep}{tail}'


def route_names(path: Path) -> set[str]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return {str(row[0]) for row in conn.execute("SELECT name FROM routes")}


async def test_a_route_the_promoted_mirror_replaces_is_dropped_from_its_file(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16, R-OBJ-5: a route created at run time at the principal reaches the
    mirror's file; the mirror's configuration names a route so, in another case, which
    replaces it. Promoted, the mirror rebuilds its image from its file and drops the
    replaced route from it and writes its configuration's route, as a start does, once it
    is the principal (a mirror's start writes nothing to its file). Before, the drop
    was written while the database was still the mirror: refused (the mirror's file
    changes only by what the principal ships), the row stayed until the next start."""
    configured = R("EXTRA", addr(NOWHERE), "//promoted/Elsewhere")
    deployment.add("p1", P1, parts_database("principal", P2, []))
    deployment.add("p2", P2, parts_database("mirror", P1, [configured]))
    deployment.start("p1")
    deployment.start("p2")
    p1 = await deployment.daemons["p1"].client()
    await p1.create_route(
        "Parts", "extra", f"tcp://{NOWHERE}:4022", remote_service_name="//promoted/Other"
    )
    await wait_caught_up(deployment, "p1", "p2")
    mirror_file = deployment.daemons["p2"].directory / "data" / "Parts.sqlite"
    names = route_names(mirror_file)
    # the mirror's own configuration is not in its file: it holds what the principal ships
    assert "extra" in names and "EXTRA" not in names
    await p1.close()
    deployment.kill("p1")
    lsn = int((await mirroring(deployment, "p2"))["lsn"])
    p2 = await deployment.daemons["p2"].client()
    await p2.set_mirror_role("Parts", "principal")

    async def dropped() -> bool:
        names = await asyncio.to_thread(route_names, mirror_file)
        return "extra" not in names and "EXTRA" in names

    await wait_until(dropped, 5)
    # written as the principal: a unit of its own, for its next mirror
    assert int((await mirroring(deployment, "p2"))["lsn"]) > lsn
    names = {r["name"] for r in await p2.view("routes") if r["database"] == "Parts"}
    assert "EXTRA" in names and "extra" not in names
