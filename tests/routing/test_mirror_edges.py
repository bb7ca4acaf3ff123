"""Mirrored pairs at the edges of failover, with real daemons on 127.0.0.10x:4022.

SPEC ids: R-ROUTE-10 (senders follow the principal), R-ROUTE-15 (epochs and fencing),
R-ROUTE-16 (a replicating pair, a principal restarted in doubt), R-DLG-1 (exactly once,
in order, across a failover).
"""

from __future__ import annotations

import asyncio
import uuid

from brokerd.tools.launcher import Deployment
from tests.daemons import wait_until
from tests.routing.deploy import (
    R,
    addr,
    database,
    mirroring,
    queue_of,
    receive_some,
    wait_caught_up,
)

A, P1, P2 = "127.0.0.101", "127.0.0.102", "127.0.0.103"
INITIATOR = "//edge/Initiator"
PARTS = "//edge/Parts"
PARTS_INSTANCE = uuid.UUID("7a1e5c3d-2b4f-4e6a-9c8d-1f2e3a4b5c6d")


def parts_database(role: str, partner: str, extra: str = "") -> str:
    text = database(
        "Parts", [PARTS], [R("Back", addr(A), INITIATOR)], PARTS_INSTANCE, mirror_role=role
    )
    head, sep, tail = text.partition("[[database.queue]]")
    return f'{head}mirror_partner = "tcp://{partner}:4022"\n{extra}{sep}{tail}'


def declare(deployment: Deployment, extra: str = "") -> None:
    route = R("PartsRoute", addr(P1), PARTS, mirror_address=addr(P2))
    deployment.add("a", A, database("AW", [INITIATOR], [route]))
    deployment.add("p1", P1, parts_database("principal", P2, extra))
    deployment.add("p2", P2, parts_database("mirror", P1, extra))


async def local_epoch(deployment: Deployment, name: str) -> tuple[str, int]:
    client = await deployment.daemons[name].client()
    try:
        rows = await client.view("mirrors")
    finally:
        await client.close()
    (row,) = [r for r in rows if r["kind"] == "local database"]
    return str(row["role"]), int(row["epoch"])


async def test_a_quiet_failover_and_failback_leave_no_two_principals_at_one_epoch(
    deployment: Deployment,
) -> None:
    """R-ROUTE-15, R-ROUTE-16, R-DLG-1: a planned failover while the pair is quiet (p1
    demoted, p2 promoted at epoch 1, p1 attached to it as mirror, no sender asking), then
    p2 is lost and p1 promoted again. p1's promotion must open an epoch above p2's, and p2,
    restarted with its file saying principal, must not serve beside p1: its partner keeps
    answering that it is principal (R-ROUTE-16: the doubt ends in exposed mode only when
    the partner is not principal, cannot be reached, or does not answer). Otherwise the
    two partners' applications both SEND on one dialog, both SENDs succeed, get the same
    sequence number, and the initiator keeps one of them."""
    declare(deployment, "mirror_timeout = 2.0\n")
    for name in ("a", "p1", "p2"):
        deployment.start(name)
    a = await deployment.daemons["a"].client()
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    await a.send(handle, body=b"order")
    p1 = await deployment.daemons["p1"].client()
    (order,) = await receive_some(p1, 1, queue_of(PARTS))
    target = order.conversation_handle
    await wait_caught_up(deployment, "p1", "p2")
    await a.close()
    deployment.kill("a")  # nobody else tells the partners of epochs

    # planned failover, nothing sent meanwhile
    await p1.set_mirror_role("Parts", "mirror")
    p2 = await deployment.daemons["p2"].client()
    await p2.set_mirror_role("Parts", "principal")
    await wait_caught_up(deployment, "p2", "p1")
    await p2.close()
    deployment.kill("p2")
    await p1.set_mirror_role("Parts", "principal")
    p1_role = await local_epoch(deployment, "p1")

    deployment.start("p2")
    await asyncio.sleep(4.0)  # twice mirror_timeout: the restarted p2 hears p1 all along
    p2 = await deployment.daemons["p2"].client()
    deployment.start("a")
    a = await deployment.daemons["a"].client()
    from_p1 = asyncio.create_task(p1.send(target, body=b"reply from p1"))
    from_p2 = asyncio.create_task(p2.send(target, body=b"reply from p2"))
    done, _ = await asyncio.wait({from_p1, from_p2}, timeout=5.0)
    succeeded = [t for t in done if t.exception() is None]
    got = await receive_some(a, len(succeeded), queue_of(INITIATOR), timeout=15)
    got += await a.receive(queue_of(INITIATOR), timeout=2.0)
    assert len(got) == len(succeeded), (
        f"p1 is {p1_role}, p2 is {await local_epoch(deployment, 'p2')} "
        f"(view {await mirroring(deployment, 'p2')}); SENDs answered "
        f"{[t.result() for t in succeeded]}; the initiator received "
        f"{[(m.message_sequence_number, m.message_body) for m in got]}"
    )
    for task in (from_p1, from_p2):
        task.cancel()


async def test_a_partner_fenced_by_a_query_and_promoted_again_serves_its_own_file(
    deployment: Deployment,
) -> None:
    """R-ROUTE-15, R-DLG-1: partners that share only the broker instance identifier (no
    ``mirror_partner``). p1 stores a message its application has not received yet; p2 is
    promoted behind p1's back and a sender's query fences p1 (it becomes the mirror, its
    messages held). Failing back (p2 demoted, p1 promoted), p1 is principal again over
    its own file: the message it stored is received there, and the conversation goes on
    with the next message in order."""
    route = R("PartsRoute", addr(P1), PARTS, mirror_address=addr(P2))
    deployment.add("a", A, database("AW", [INITIATOR], [route]))
    for name, host, role in (("p1", P1, "principal"), ("p2", P2, "mirror")):
        deployment.add(
            name,
            host,
            database("Parts", [PARTS], [R("Back", addr(A), INITIATOR)], PARTS_INSTANCE, role),
        )
    for name in ("a", "p1", "p2"):
        deployment.start(name)
    a = await deployment.daemons["a"].client()
    p1 = await deployment.daemons["p1"].client()
    p2 = await deployment.daemons["p2"].client()
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    await a.send(handle, body=b"one")
    (one,) = await receive_some(p1, 1, queue_of(PARTS))
    await a.send(handle, body=b"two")

    async def acknowledged() -> bool:
        return await a.view("transmission_queue") == []

    await wait_until(acknowledged, 20)  # "two" is stored at p1, not yet received

    await p2.set_mirror_role("Parts", "principal")  # p1 is not told

    async def p1_fenced() -> bool:
        return (await local_epoch(deployment, "p1"))[0] == "mirror"

    await wait_until(p1_fenced, 20)  # a sender's query carried epoch 1
    await p2.set_mirror_role("Parts", "mirror")
    await p1.set_mirror_role("Parts", "principal")
    assert (await local_epoch(deployment, "p1"))[0] == "principal"
    await a.send(handle, body=b"three")
    got = await receive_some(p1, 2, queue_of(PARTS), timeout=20)
    assert [(m.message_sequence_number, m.message_body) for m in got] == [
        (2, b"two"),
        (3, b"three"),
    ], (
        f"p1 drops {[r['reason'] for r in await p1.view('drops')][-3:]}; "
        f"a waits {[r['transmission_status'] for r in await a.view('transmission_queue')]}"
    )
    assert got[0].conversation_handle == one.conversation_handle


async def test_a_route_dropped_at_the_principal_is_not_used_by_the_promoted_mirror(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16 (the promotion resumes where the old principal stood; routes created by
    the administrator are part of what the units carry), R-DLG-1: a route created at run
    time at the principal reaches the mirror's file; the mirror restarts (reading it), then
    the principal drops it. After a failover the promoted mirror routes as the old
    principal did: without the dropped route, so every reply reaches the initiator."""
    declare(deployment)
    for name in ("a", "p1", "p2"):
        deployment.start(name)
    p1 = await deployment.daemons["p1"].client()
    await p1.create_route(
        "Parts", "Detour", "tcp://127.0.0.109:4022", remote_service_name=INITIATOR
    )
    await wait_caught_up(deployment, "p1", "p2")
    deployment.stop("p2")
    deployment.start("p2")
    await wait_caught_up(deployment, "p1", "p2")
    await p1.drop_route("Parts", "Detour")
    a = await deployment.daemons["a"].client()
    handles = [await a.begin_dialog(INITIATOR, PARTS, database="AW") for _ in range(8)]
    for handle in handles:
        await a.send(handle, body=b"order")
    orders = await receive_some(p1, len(handles), queue_of(PARTS))
    assert len(orders) == len(handles)
    await wait_caught_up(deployment, "p1", "p2")
    await p1.close()
    deployment.kill("p1")
    p2 = await deployment.daemons["p2"].client()
    await p2.set_mirror_role("Parts", "principal")
    names = [r["name"] for r in await p2.view("routes") if r["database"] == "Parts"]
    for order in orders:
        await p2.send(order.conversation_handle, body=b"reply")
    got = await receive_some(a, len(orders), queue_of(INITIATOR), timeout=20)
    assert ("Detour" in names, len(got)) == (False, len(orders))
