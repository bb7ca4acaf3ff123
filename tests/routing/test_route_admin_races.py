"""Route administration at run time by several clients at once (R-OBJ-5, R-ROUTE-13),
with a real daemon on 127.0.41.x:4022: each CREATE ROUTE, ALTER ROUTE and DROP ROUTE is
checked against the routes as the ones before it left them."""

from __future__ import annotations

import asyncio

from brokerd.tools.launcher import Deployment
from protocol.errors import RemoteError
from tests.routing.deploy import database

A = "127.0.41.2"
ROUTES = 8


async def test_concurrent_creates_of_one_route_name_make_one_route(
    deployment: Deployment,
) -> None:
    """R-OBJ-5: a route name is unique in its database, compared without regard to case.
    Clients that create routes of one name at the same moment must not all be told that
    their route was created: one is, the others fail with ``already exists``, and the
    database holds one route of that name, in memory and in its file (after a restart)."""
    daemon = deployment.add("a", A, database("AW", ["//aw/Initiator"]))
    deployment.start("a")
    clients = [await daemon.client() for _ in range(ROUTES)]
    try:
        outcomes = await asyncio.gather(
            *(
                c.create_route(
                    "AW", "ToRemote" if n % 2 else "toremote", f"tcp://127.0.41.{10 + n}:4022"
                )
                for n, c in enumerate(clients)
            ),
            return_exceptions=True,
        )
        refused = [o for o in outcomes if isinstance(o, RemoteError)]
        assert all("already exists" in e.remote_message for e in refused), outcomes
        assert len(refused) == ROUTES - 1, outcomes
        created = [r for r in await clients[0].view("routes") if r["database"] == "AW"]
        named = [r for r in created if str(r["name"]).casefold() == "toremote"]
        assert len(named) == 1, named
    finally:
        for c in clients:
            await c.close()
    deployment.stop("a")
    deployment.start("a")
    a = await daemon.client()
    try:
        after = [r for r in await a.view("routes") if r["database"] == "AW"]
        again = [r for r in after if str(r["name"]).casefold() == "toremote"]
        assert [r["address"] for r in again] == [r["address"] for r in named], again
    finally:
        await a.close()
