"""Mirror fencing by epoch with real daemons on 127.0.0.8x:4022.

SPEC ids: R-ROUTE-10 (a mirrored route follows the principal), R-ROUTE-15 (each role
change carries an epoch, persisted; a partner that is not principal at the current epoch
neither sends nor accepts; senders prefer the highest epoch they have seen), R-DLG-1
(EOIO to the application).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.tools.launcher import Deployment
from protocol.errors import RemoteError
from tests.daemons import drain, wait_until
from tests.routing.deploy import R, addr, database, queue_of, wait_drops

A, P1, P2, S = "127.0.0.81", "127.0.0.82", "127.0.0.83", "127.0.0.84"
INITIATOR = "//aw/Initiator"
STALE = "//stale/Initiator"
PARTS = "//parts/OrderParts"
PARTS_INSTANCE = uuid.UUID("0b7c3f4e-51d2-4a8e-9f1c-6a2d8e4b7c11")


def parts_database(role: str) -> str:
    return database(
        "Parts", [PARTS], [R("Back", addr(A), INITIATOR)], PARTS_INSTANCE, mirror_role=role
    )


async def start_pair(deployment: Deployment) -> tuple[BrokerClient, BrokerClient, BrokerClient]:
    route = R("OrderPartsRoute", addr(P1), PARTS, mirror_address=addr(P2))
    deployment.add("a", A, database("AW", [INITIATOR], [route]))
    deployment.add("p1", P1, parts_database("principal"))
    deployment.add("p2", P2, parts_database("mirror"))
    for name in ("a", "p1", "p2"):
        deployment.start(name)
    a = await deployment.daemons["a"].client()
    p1 = await deployment.daemons["p1"].client()
    p2 = await deployment.daemons["p2"].client()
    return a, p1, p2


async def local_row(client: BrokerClient) -> dict[str, object]:
    (row,) = [r for r in await client.view("mirrors") if r["kind"] == "local database"]
    return row


async def route_row(client: BrokerClient) -> dict[str, object]:
    (row,) = [r for r in await client.view("mirrors") if r["kind"] == "mirrored route"]
    return row


async def test_a_demoted_partner_neither_sends_nor_accepts(deployment: Deployment) -> None:
    """R-ROUTE-15: after a failover the old principal refuses SEND on its dialogs, sends
    nothing it still holds, and drops what reaches it with a reason naming the epoch."""
    a, p1, p2 = await start_pair(deployment)
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    await a.send(handle, body=b"one")
    (got,) = await drain(p1, queue_of(PARTS), 1)
    assert got.message_body == b"one"

    await p1.set_mirror_role("Parts", "mirror")
    await p2.set_mirror_role("Parts", "principal")
    assert (await local_row(p1))["role"] == "mirror"
    assert (await local_row(p2))["epoch"] == 1  # the first promotion after epoch 0

    # The demoted partner's application cannot answer on a dialog it holds.
    with pytest.raises(RemoteError, match="mirror partner"):
        await p1.send(got.conversation_handle, body=b"reply from the demoted partner")
    await asyncio.sleep(1.5)
    assert await a.receive(queue_of(INITIATOR), timeout=0) == []

    # A sender that knows only the old principal (a plain route to it) is refused, with
    # the epoch, and nothing reaches the demoted partner's application.
    stale_route = R("ToOldPrincipal", addr(P1), PARTS)
    deployment.add("s", S, database("Stale", [STALE], [stale_route]))
    deployment.start("s")
    s = await deployment.daemons["s"].client()
    stale = await s.begin_dialog(STALE, PARTS, database="Stale")
    await s.send(stale, body=b"to the old principal")
    reason = await wait_drops(p1, "mirror partner at epoch", timeout=20)
    assert "R-ROUTE-15" in reason
    assert await p1.receive(queue_of(PARTS), timeout=0) == []
    assert len(await s.view("transmission_queue")) == 1  # not acknowledged: the sender retries


async def test_a_partner_promoted_behind_the_principal_s_back_fences_it(
    deployment: Deployment,
) -> None:
    """R-ROUTE-15: the partner is promoted while the old principal is not told (split
    brain): senders prefer the higher epoch, and the old principal, hearing of it, demotes
    itself, persistently, and no longer accepts or sends."""
    a, p1, p2 = await start_pair(deployment)
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    await a.send(handle, body=b"before")
    (got,) = await drain(p1, queue_of(PARTS), 1)
    assert (await route_row(a))["principal"] == f"tcp://{P1}:4022"

    await p2.set_mirror_role("Parts", "principal")  # p1 is not told

    async def switched() -> bool:
        return (await route_row(a))["principal"] == f"tcp://{P2}:4022"

    await wait_until(switched, 20)

    async def p1_fenced() -> bool:
        return (await local_row(p1))["role"] == "mirror"

    await wait_until(p1_fenced, 20)
    later = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    await a.send(later, body=b"after")
    (after,) = await drain(p2, queue_of(PARTS), 1, timeout=20)
    assert after.message_body == b"after"
    assert await p1.receive(queue_of(PARTS), timeout=0) == []
    with pytest.raises(RemoteError, match="mirror partner"):
        await p1.send(got.conversation_handle, body=b"split brain")

    # The epochs and the fencing survive a restart of the fenced partner.
    epoch = (await local_row(p2))["epoch"]
    await p1.close()
    deployment.stop("p1")
    deployment.start("p1")
    p1 = await deployment.daemons["p1"].client()
    row = await local_row(p1)
    assert (row["role"], row["epoch"]) == ("mirror", epoch)
