"""A mirror's confirmations as the principal believes them, with real daemons on
127.0.23.4 to 127.0.23.6:4022 and a broker holding the partner's name.

SPEC ids: R-ROUTE-16 (the principal releases nothing that reveals a commit before the
mirror has confirmed that unit; in ``stall`` mode every outcome waits for a mirror).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

from brokerd.tools.launcher import Deployment
from protocol import events, mirroring
from tests.daemons import wait_until
from tests.hostile import HostileBroker
from tests.routing.deploy import R, addr, database, queue_of, wait_caught_up
from tests.routing.deploy import mirroring as mirroring_view

A, P1, P2 = "127.0.23.4", "127.0.23.5", "127.0.23.6"
INITIATOR = "//aw/Initiator"
PARTS = "//parts/OrderParts"
PARTS_INSTANCE = uuid.UUID("7e2d9a40-1c5b-4f83-9b6e-2a4c8d1f0e37")


def parts_database(role: str, partner: str) -> str:
    text = database(
        "Parts", [PARTS], [R("Back", addr(A), INITIATOR)], PARTS_INSTANCE, mirror_role=role
    )
    head, sep, tail = text.partition("[[database.queue]]")
    extra = 'mirror_when_lost = "stall"\n'
    return f'{head}mirror_partner = "tcp://{partner}:4022"\n{extra}{sep}{tail}'


async def test_a_mirror_confirming_a_unit_it_was_never_sent_releases_nothing(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16, stall mode: the partner's name attaches as mirror (its file at the
    principal's last unit), is shipped the unit of a RECEIVE, and confirms an LSN far
    beyond it. The RECEIVE's outcome stays held (the session is dropped as confused):
    believed, that confirmation released it and every later commit, none of which a
    mirror holds. The real mirror, back, confirms it and the RECEIVE is answered."""
    route = R("OrderPartsRoute", addr(P1), PARTS, mirror_address=addr(P2))
    deployment.add("a", A, database("AW", [INITIATOR], [route]))
    deployment.add("p1", P1, parts_database("principal", P2))
    deployment.add("p2", P2, parts_database("mirror", P1))
    for name in ("a", "p1", "p2"):
        deployment.start(name)
    a = await deployment.daemons["a"].client()
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    await a.send(handle, body=b"order")
    await wait_caught_up(deployment, "p1", "p2")

    async def stored() -> bool:
        return await a.view("transmission_queue") == []

    await wait_until(stored, 30)
    deployment.kill("p2")

    async def detached() -> bool:
        return not (await mirroring_view(deployment, "p1"))["mirror_attached"]

    await wait_until(detached, 15)
    view = await mirroring_view(deployment, "p1")
    lsn, lsn_epoch = int(str(view["lsn"])), int(str(view["lsn_epoch"]))
    confused = HostileBroker(deployment.cert_dir, name="p2")  # the partner's name
    await confused.connect(P1)
    assert confused.writer is not None
    attach = mirroring.Attach(PARTS_INSTANCE, 0, lsn, lsn_epoch)
    confused.writer.write(confused.conn.send(events.Mirror(mirroring.encode(attach))))
    await confused.writer.drain()

    async def attached() -> bool:
        return bool((await mirroring_view(deployment, "p1"))["mirror_attached"])

    await wait_until(attached, 15)
    p1 = await deployment.daemons["p1"].client()
    receiving = asyncio.create_task(p1.receive(queue_of(PARTS), timeout=30))
    try:

        async def held() -> bool:
            return int(str((await mirroring_view(deployment, "p1"))["held"])) >= 1

        await wait_until(held, 15)  # its unit went to the attached "mirror"
        confirm = mirroring.Confirm(PARTS_INSTANCE, lsn + 1000)
        confused.writer.write(confused.conn.send(events.Mirror(mirroring.encode(confirm))))
        await confused.writer.drain()

        async def settled() -> bool:
            row = await mirroring_view(deployment, "p1")
            return row["held"] == 0 or not row["mirror_attached"]

        await wait_until(settled, 15)
        row = await mirroring_view(deployment, "p1")
        assert row["held"] == 1 and not receiving.done(), row
        deployment.start("p2")
        got = await asyncio.wait_for(receiving, 30)
        assert [m.message_body for m in got] == [b"order"]
    finally:
        if not receiving.done():
            receiving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await receiving
        await confused.close()
        await p1.close()
        await a.close()
