"""A mirrored database's principal restarted in doubt, with real daemons on 127.0.23.x:4022.

SPEC ids: R-ROUTE-16 (a principal restarted with units in its file is in doubt until its
partner confirms them or shows it was superseded, or the administrator vouches for it
with ``set_mirror_role principal``; in ``stall`` mode every commit's outcome waits for a
mirror's confirmation).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

from brokerd.tools.launcher import Deployment
from tests.daemons import wait_until
from tests.routing.deploy import R, addr, database, mirroring, queue_of, wait_caught_up

A, P1, P2 = "127.0.23.1", "127.0.23.2", "127.0.23.3"
INITIATOR = "//aw/Initiator"
PARTS = "//parts/OrderParts"
PARTS_INSTANCE = uuid.UUID("0b6f5c1e-93a4-4c1d-a7e2-5d18c0f3e961")


def parts_database(role: str, partner: str, extra: str) -> str:
    text = database(
        "Parts", [PARTS], [R("Back", addr(A), INITIATOR)], PARTS_INSTANCE, mirror_role=role
    )
    head, sep, tail = text.partition("[[database.queue]]")
    return f'{head}mirror_partner = "tcp://{partner}:4022"\n{extra}{sep}{tail}'


async def test_the_administrator_ends_a_doubt_while_commits_wait_for_a_mirror(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16, stall mode: p1 restarts in doubt while its mirror p2 is down, and its
    application RECEIVEs (the commit waits for a mirror). ``set_mirror_role principal``
    ends the doubt at once: the command does not wait behind that held commit (it waited
    for ever: the doubt it was to end held it). The RECEIVE's outcome still waits for a
    mirror, and is told once p2 is back and has confirmed it."""
    extra = 'mirror_when_lost = "stall"\n'
    route = R("OrderPartsRoute", addr(P1), PARTS, mirror_address=addr(P2))
    deployment.add("a", A, database("AW", [INITIATOR], [route]))
    deployment.add("p1", P1, parts_database("principal", P2, extra))
    deployment.add("p2", P2, parts_database("mirror", P1, extra))
    for name in ("a", "p1", "p2"):
        deployment.start(name)
    a = await deployment.daemons["a"].client()
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    await a.send(handle, body=b"order")
    await wait_caught_up(deployment, "p1", "p2")

    async def stored() -> bool:
        return await a.view("transmission_queue") == []

    await wait_until(stored, 30)  # p1 holds the message, and p2 confirmed it
    deployment.kill("p2")
    deployment.kill("p1")
    deployment.start("p1")
    assert (await mirroring(deployment, "p1"))["in_doubt"] is True
    p1 = await deployment.daemons["p1"].client()
    receiving = asyncio.create_task(p1.receive(queue_of(PARTS), timeout=30))
    try:

        async def held() -> bool:
            return int(str((await mirroring(deployment, "p1"))["held"])) >= 1

        await wait_until(held, 15)
        admin = await deployment.daemons["p1"].client()
        try:
            await asyncio.wait_for(admin.set_mirror_role("Parts", "principal"), 10)
        finally:
            await admin.close()
        view = await mirroring(deployment, "p1")
        assert (view["role"], view["in_doubt"]) == ("principal", False)
        assert not receiving.done()  # stall: no mirror has confirmed the RECEIVE
        deployment.start("p2")
        got = await asyncio.wait_for(receiving, 30)
        assert [m.message_body for m in got] == [b"order"]
    finally:
        if not receiving.done():
            receiving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await receiving
        await p1.close()
        await a.close()
