"""Database mirroring in high-safety mode with real daemons on 127.0.0.9x:4022.

SPEC ids: R-ROUTE-16 (the principal ships each committed unit of work to the mirror and
releases its outcome once the mirror has confirmed it; a promoted mirror resumes every
conversation where the old principal stood; a returning mirror catches up), R-ROUTE-10,
R-ROUTE-15 (failover and fencing), R-DLG-1 (exactly once, in order, across a failover).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import uuid
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.tools.faultproxy import FaultPlan, FaultProxy
from brokerd.tools.launcher import Deployment
from protocol.errors import (
    BrokerStopping,
    ClientError,
    OutcomeUnknown,
    RemoteError,
    TransactionError,
    TransactionRolledBack,
)
from tests.commands import brokerctl
from tests.daemons import assert_exactly_once_in_order, sends_through_a_stop, wait_until
from tests.routing.deploy import (
    RETRY,
    R,
    addr,
    database,
    mirroring,
    queue_of,
    receive_some,
    wait_caught_up,
)

A, P1, P2 = "127.0.0.91", "127.0.0.92", "127.0.0.93"
P1_PROXY, P2_PROXY, BACK_PROXY = "127.0.0.96", "127.0.0.94", "127.0.0.95"
"""Fault proxies in front of p1 and p2 (the initiator's route to them) and of the
initiator (the partners' route back), where a test uses them."""
INITIATOR = "//aw/Initiator"
PARTS = "//parts/OrderParts"
PARTS_INSTANCE = uuid.UUID("5d0c2b1e-7f43-4a9b-8e21-3c6f0a9d4b72")


def parts_database(role: str, partner: str, extra: str = "", back: str = A) -> str:
    text = database(
        "Parts", [PARTS], [R("Back", addr(back), INITIATOR)], PARTS_INSTANCE, mirror_role=role
    )
    head, sep, tail = text.partition("[[database.queue]]")
    return f'{head}mirror_partner = "tcp://{partner}:4022"\n{extra}{sep}{tail}'


async def start_pair(deployment: Deployment, extra: str = "") -> BrokerClient:
    route = R("OrderPartsRoute", addr(P1), PARTS, mirror_address=addr(P2))
    deployment.add("a", A, database("AW", [INITIATOR], [route]))
    deployment.add("p1", P1, parts_database("principal", P2, extra))
    deployment.add("p2", P2, parts_database("mirror", P1, extra))
    for name in ("a", "p1", "p2"):
        deployment.start(name)
    await wait_attached(deployment, "p1")
    return await deployment.daemons["a"].client()


async def wait_attached(deployment: Deployment, principal: str, timeout: float = 20) -> None:
    async def attached() -> bool:
        return bool((await mirroring(deployment, principal))["mirror_attached"])

    await wait_until(attached, timeout)


async def receive_parts(
    client: BrokerClient, count: int, timeout: float = 30
) -> list[ReceivedMessage]:
    return await receive_some(client, count, queue_of(PARTS), timeout)


async def fail_over(deployment: Deployment) -> BrokerClient:
    """SIGKILL the principal p1, promote p2; return a client of p2."""
    deployment.kill("p1")
    p2 = await deployment.daemons["p2"].client()
    await p2.set_mirror_role("Parts", "principal")
    return p2


async def test_in_flight_messages_move_to_the_new_principal_exactly_once(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16: a sender keeps sending while the principal is killed mid-traffic and the
    mirror promoted. What the old principal's application received (committed) is not
    received again at the new one; every later message (acknowledged or not by the old
    principal) is delivered there in order; nothing is lost or duplicated."""
    a = await start_pair(deployment)
    p1 = await deployment.daemons["p1"].client()
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    total = 120
    bodies = [f"part {i}".encode() for i in range(1, total + 1)]
    sent = 0

    async def sender() -> None:
        nonlocal sent
        for body in bodies:
            await a.send(handle, body=body)
            sent += 1
            await asyncio.sleep(0.01)

    sending = asyncio.create_task(sender())
    try:
        received = await receive_parts(p1, 30)
        assert len(received) == 30
        await wait_until(lambda: _true(sent >= 60), 30)
        p2 = await fail_over(deployment)  # mid-traffic: messages in flight and unreceived
        await asyncio.wait_for(sending, 60)
    finally:
        if not sending.done():
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending
    received += await receive_parts(p2, total - len(received), timeout=60)
    assert await p2.receive(queue_of(PARTS), timeout=0.5) == []
    assert_exactly_once_in_order(received, {handle: bodies})

    async def acknowledged() -> bool:
        return await a.view("transmission_queue") == []

    await wait_until(acknowledged, 30)  # the new principal acknowledges the rest

    # The old principal returns as the mirror of the new one and catches up.
    deployment.start("p1")
    p1 = await deployment.daemons["p1"].client()
    await p1.set_mirror_role("Parts", "mirror")
    await wait_caught_up(deployment, "p2", "p1")


def _true(value: bool) -> asyncio.Future[bool]:
    future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


async def test_a_message_received_at_the_old_principal_is_not_received_again(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16: RECEIVE committed at the principal, then SIGKILL at once: the promoted
    mirror does not hand the message out again; the next message of the conversation,
    sent after the failover, is delivered in order (not held waiting for numbers the new
    principal never saw)."""
    a = await start_pair(deployment)
    p1 = await deployment.daemons["p1"].client()
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    await a.send(handle, body=b"one")
    await a.send(handle, body=b"two")
    first = await receive_parts(p1, 2)
    assert [m.message_body for m in first] == [b"one", b"two"]
    p2 = await fail_over(deployment)
    assert await p2.receive(queue_of(PARTS), timeout=1.0) == []
    await a.send(handle, body=b"three")
    (third,) = await receive_parts(p2, 1)
    assert (third.message_body, third.message_sequence_number) == (b"three", 3)
    assert third.conversation_handle == first[0].conversation_handle


async def test_brokerctl_shows_the_replication_of_each_partner(deployment: Deployment) -> None:
    """R-ROUTE-16, R-OPS: ``brokerctl mirroring`` prints the ``mirroring`` view of a
    partner, as a table and as JSON: its role, its partner and whether its mirror is
    attached, caught up to the LSN the principal shipped."""
    a = await start_pair(deployment)
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    await a.send(handle, body=b"order 1")
    await wait_caught_up(deployment, "p1", "p2")
    await a.close()
    config = str(deployment.daemons["p1"].config_path)
    done = await asyncio.to_thread(brokerctl, "--config", config, "mirroring", "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["database"] == "Parts" and row["role"] == "principal" and row["mirror_attached"]
    assert row["lsn"] == row["confirmed"] > 0
    table = await asyncio.to_thread(brokerctl, "--config", config, "mirroring")
    assert table.returncode == 0 and "principal" in table.stdout, table.stderr


async def test_a_mirror_that_was_away_catches_up_and_a_failover_then_loses_nothing(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16: with the mirror down the principal runs exposed (it goes on alone); the
    mirror, started again, catches up on what it missed; a failover after that loses
    nothing and duplicates nothing."""
    a = await start_pair(deployment)
    p1 = await deployment.daemons["p1"].client()
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    bodies = [f"order {i}".encode() for i in range(1, 41)]
    for body in bodies[:10]:
        await a.send(handle, body=body)
    received = await receive_parts(p1, 5)
    deployment.kill("p2")
    for body in bodies[10:30]:
        await a.send(handle, body=body)
    received += await receive_parts(p1, 10)

    async def acknowledged() -> bool:
        return await a.view("transmission_queue") == []

    await wait_until(acknowledged, 30)  # exposed: the principal goes on alone
    assert len(received) == 15
    deployment.start("p2")
    await wait_caught_up(deployment, "p1", "p2")
    p2 = await fail_over(deployment)
    for body in bodies[30:]:
        await a.send(handle, body=body)
    received += await receive_parts(p2, 25, timeout=60)
    assert await p2.receive(queue_of(PARTS), timeout=0.5) == []
    assert_exactly_once_in_order(received, {handle: bodies})


async def test_stall_mode_holds_acknowledgements_until_a_mirror_has_the_message(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16 decision: with ``mirror_when_lost = "stall"`` and no mirror, the principal
    stores what arrives but acknowledges nothing; once the mirror is back and has it, the
    acknowledgements go out and a failover then finds every message."""
    a = await start_pair(deployment, 'mirror_when_lost = "stall"\n')
    deployment.kill("p2")
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    for i in range(5):
        await a.send(handle, body=f"held {i}".encode())
    await asyncio.sleep(3)
    assert len(await a.view("transmission_queue")) == 5  # stored at p1, not acknowledged
    deployment.start("p2")
    await wait_caught_up(deployment, "p1", "p2")

    async def acknowledged() -> bool:
        return await a.view("transmission_queue") == []

    await wait_until(acknowledged, 30)
    p2 = await fail_over(deployment)
    # The new principal has no mirror: in stall mode it acknowledges nothing new.
    await a.send(handle, body=b"after the failover")
    await asyncio.sleep(3)
    assert len(await a.view("transmission_queue")) == 1
    deployment.start("p1")
    p1 = await deployment.daemons["p1"].client()
    await p1.set_mirror_role("Parts", "mirror")
    await wait_caught_up(deployment, "p2", "p1")
    await wait_until(acknowledged, 30)
    got = await receive_parts(p2, 6)
    expected = [f"held {i}".encode() for i in range(5)] + [b"after the failover"]
    assert [m.message_body for m in got] == expected


async def test_a_mirror_returning_after_mirror_timeout_to_held_commits_is_kept(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16, stall mode: commits held longer than ``mirror_timeout`` while the
    mirror was away must not make the principal drop the mirror that comes back. The
    timeout's clock ran from the first held batch, so every new session was dropped at
    the next tick, before the mirror could confirm anything, and the held commits (and
    every SEND behind them) waited for ever (found by the soak)."""
    a = await start_pair(deployment, 'mirror_when_lost = "stall"\nmirror_timeout = 2.0\n')
    deployment.kill("p2")
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    # Enough bytes held that the principal stops reading peers (endpoint.inbound_backlog_mb):
    # it must still read the mirror's connection.
    bodies = [bytes([i]) * (1 << 20) for i in range(72)]
    for body in bodies:
        await a.send(handle, body=body)
    await asyncio.sleep(4)  # twice mirror_timeout, with commits held all along
    assert len(await a.view("transmission_queue")) == len(bodies)
    deployment.start("p2")
    await wait_caught_up(deployment, "p1", "p2")

    async def acknowledged() -> bool:
        return await a.view("transmission_queue") == []

    await wait_until(acknowledged, 30)
    p1 = await deployment.daemons["p1"].client()
    try:
        got = await receive_parts(p1, len(bodies), timeout=60)
    finally:
        await p1.close()
    assert [m.message_body for m in got] == bodies
    assert (await mirroring(deployment, "p1"))["mirror_timeouts"] == 0


async def test_a_restarted_old_principal_sends_nothing_its_mirror_never_confirmed(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16, R-ROUTE-15, R-DLG-1: in stall mode, replies SENT at the principal p1
    while its mirror is away are committed in p1's file but never released (no SEND
    returns). p1 is SIGKILLed, p2 promoted; the replies SENT there are the dialog's next
    messages. When p1 comes back, its file still says principal and still holds the
    unconfirmed replies. It sent them at once, before anyone could demote it, and the
    initiator took them; p2's replies, with the same sequence numbers, were then
    discarded as duplicates: three SENDs that returned success were lost, three that
    never returned were delivered (found by the soak's mirrored pair). Now p1 starts in
    doubt, asks p2, learns it was superseded and sends nothing; it keeps no image of the
    database either (its views showed the stale replies)."""
    a = await start_pair(deployment, 'mirror_when_lost = "stall"\n')
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    await a.send(handle, body=b"order")
    p1 = await deployment.daemons["p1"].client()
    (order,) = await receive_parts(p1, 1)
    target = order.conversation_handle
    await wait_caught_up(deployment, "p1", "p2")
    deployment.kill("p2")
    unconfirmed = [
        asyncio.create_task(p1.send(target, body=f"unconfirmed {i}".encode())) for i in range(3)
    ]

    async def held() -> bool:
        return int(str((await mirroring(deployment, "p1"))["held"])) >= 1

    await wait_until(held, 10)
    await asyncio.sleep(1.0)  # committed in p1's file; held: no mirror confirms them
    assert not any(task.done() for task in unconfirmed)
    deployment.kill("p1")
    await asyncio.gather(*unconfirmed, return_exceptions=True)  # outcome unknown to the app
    deployment.start("p2")
    p2 = await deployment.daemons["p2"].client()
    await p2.set_mirror_role("Parts", "principal")
    confirmed = [
        asyncio.create_task(p2.send(target, body=f"confirmed {i}".encode())) for i in range(3)
    ]
    await asyncio.sleep(1.0)
    deployment.start("p1")
    p1 = await deployment.daemons["p1"].client()

    async def demoted() -> bool:
        return (await mirroring(deployment, "p1"))["role"] == "mirror"

    demoted_itself = True
    try:
        await wait_until(demoted, 10)  # it asks p2, which answers: principal, higher epoch
    except AssertionError:
        demoted_itself = False
    await p1.set_mirror_role("Parts", "mirror")  # as an operator would, a moment late
    await wait_caught_up(deployment, "p2", "p1")
    await asyncio.wait_for(asyncio.gather(*confirmed), 30)
    got: list[ReceivedMessage] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while len(got) < 4 and loop.time() < deadline:
        got += await a.receive(queue_of(INITIATOR), top=10, timeout=1.0)
    got += await a.receive(queue_of(INITIATOR), timeout=2.0)
    assert [m.message_body for m in got] == [f"confirmed {i}".encode() for i in range(3)]
    assert await p1.view("transmission_queue") == []  # no stale image on the mirror
    view = await mirroring(deployment, "p1")
    assert (view["role"], view["in_doubt"]) == ("mirror", False)
    assert demoted_itself


async def test_a_partner_promoted_again_acknowledges_only_what_its_file_holds(
    tmp_path: Path,
) -> None:
    """R-ROUTE-16, R-DLG-5: orders 1-3 that p1 received and committed alone (stall mode,
    its mirror p2 away) are in p1's file, never confirmed, never acknowledged. p1 is
    SIGKILLed and p2 promoted, which never had them; the initiator cannot reach p2, so
    they stay in its transmission queue. p1 restarts in doubt with an image that holds
    them and owes their acknowledgement, learns it was superseded, drops that image and
    takes p2's copy of the file; p2 answers order 0 with a reply the initiator cannot
    take yet. When p1 is promoted again it sends that reply, and with it, found by the
    soak's mirrored pair, went the acknowledgement the dropped image owed: it claimed
    orders 1-3, the initiator dropped them, and they were lost. Now only what p1's file
    holds is acknowledged: orders 1-3 are sent again and received once, in order.

    Fault proxies stand on each way: the initiator's to p1 and to p2, and the partners'
    way back to the initiator. The acknowledgement delay is long enough here for the way
    back to open before the first acknowledgements go."""
    d = Deployment(tmp_path, {**RETRY, "ack_delay": 0.2})
    to_p1 = FaultProxy(P1_PROXY, 4022, P1, 4022, FaultPlan())
    to_p2 = FaultProxy(P2_PROXY, 4022, P2, 4022, FaultPlan())
    back = FaultProxy(BACK_PROXY, 4022, A, 4022, FaultPlan())
    for proxy in (to_p1, to_p2, back):
        await proxy.start()
    try:
        route = R("OrderPartsRoute", addr(P1_PROXY), PARTS, mirror_address=addr(P2_PROXY))
        d.add("a", A, database("AW", [INITIATOR], [route]))
        stall = 'mirror_when_lost = "stall"\n'
        d.add("p1", P1, parts_database("principal", P2, stall, back=BACK_PROXY))
        d.add("p2", P2, parts_database("mirror", P1, stall, back=BACK_PROXY))
        for name in ("a", "p1", "p2"):
            d.start(name)
        await wait_attached(d, "p1")
        a = await d.daemons["a"].client()
        handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
        await a.send(handle, body=b"order 0")
        p1 = await d.daemons["p1"].client()
        (order,) = await receive_parts(p1, 1)
        await p1.close()
        await wait_caught_up(d, "p1", "p2")
        d.kill("p2")
        for i in range(1, 4):
            await a.send(handle, body=f"order {i}".encode())

        async def held() -> bool:
            return int(str((await mirroring(d, "p1"))["held"])) >= 1

        await wait_until(held, 10)
        await asyncio.sleep(1.0)  # all three committed in p1's file, none confirmed
        d.kill("p1")
        to_p1.plan.refuse = to_p2.plan.refuse = back.plan.refuse = True
        d.start("p2")
        p2 = await d.daemons["p2"].client()
        await p2.set_mirror_role("Parts", "principal")
        d.start("p1")

        async def demoted() -> bool:
            return (await mirroring(d, "p1"))["role"] == "mirror"

        await wait_until(demoted, 20)  # it asks p2: principal, at a higher epoch
        await wait_caught_up(d, "p2", "p1")
        await p2.send(order.conversation_handle, body=b"reply")
        await wait_caught_up(d, "p2", "p1")
        await p2.close()
        d.kill("p2")
        back.plan.refuse = False
        p1 = await d.daemons["p1"].client()
        await p1.set_mirror_role("Parts", "principal")
        (reply,) = await receive_some(a, 1, queue_of(INITIATOR))
        assert reply.message_body == b"reply"
        await asyncio.sleep(0.5)  # any acknowledgement p1 sends with the reply has arrived
        to_p1.plan.refuse = to_p2.plan.refuse = False
        d.start("p2")  # in stall mode p1 commits nothing until p2 is its mirror
        got = await receive_parts(p1, 3)
        assert [m.message_body for m in got] == [f"order {i}".encode() for i in range(1, 4)]
        assert [m.message_sequence_number for m in got] == [2, 3, 4]

        async def acknowledged() -> bool:
            return not await a.view("transmission_queue")

        await wait_until(acknowledged, 20)
        await p1.close()
        await a.close()
    finally:
        d.stop_all()
        for proxy in (back, to_p2, to_p1):
            await proxy.stop()


async def test_a_transaction_across_a_role_change_commits_nothing_and_gives_back_nothing(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16, R-DLG-1: two transactions at the principal p1 RECEIVE an order each;
    then p1 is demoted and promoted again, so its image of the database is dropped and
    rebuilt from its file, where both orders are still to be received. The first
    transaction may RECEIVE no more (its lease's group lock is of the image that is
    gone: taking its group again locked it in the rebuilt one for good) and its COMMIT
    is refused; the second is rolled back. Neither removes its order nor gives it back
    to the rebuilt image, which has it already, so each order is received again
    exactly once."""
    a = await start_pair(deployment)
    handles = [await a.begin_dialog(INITIATOR, PARTS, database="AW") for _ in range(2)]
    for i, handle in enumerate(handles):
        await a.send(handle, body=f"order {i}".encode())
    p1 = await deployment.daemons["p1"].client()
    first, second = await p1.begin_transaction(), await p1.begin_transaction()
    taken = await first.receive(queue_of(PARTS), timeout=10)
    taken += await second.receive(queue_of(PARTS), timeout=10)
    assert sorted(m.message_body for m in taken) == [b"order 0", b"order 1"]
    await wait_caught_up(deployment, "p1", "p2")
    await p1.set_mirror_role("Parts", "mirror")
    await p1.set_mirror_role("Parts", "principal")
    with pytest.raises(TransactionError, match="changed partner role"):
        await first.receive(queue_of(PARTS), timeout=1.0)  # its lease's group is stale
    with pytest.raises(TransactionRolledBack):
        await first.commit()
    await second.rollback()
    got = await receive_parts(p1, 2)
    got += await p1.receive(queue_of(PARTS), top=10, timeout=1.0)
    assert sorted(m.message_body for m in got) == [b"order 0", b"order 1"]
    await p1.close()
    await a.close()


async def test_a_commit_that_returns_after_the_demotion_is_not_reported_done(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16: a SEND's batch begins its transaction at the principal p1 (another
    connection holds the file's write lock, so it waits inside it), p1 is demoted
    meanwhile, then the lock goes and the batch commits as principal. Its unit was
    never shipped and the new principal p2 never has it: the SEND must not be reported
    done (it was, and the reply was lost). It fails, as the batches held at the
    demotion do, and after p2's promotion nothing of it is delivered."""
    a = await start_pair(deployment)
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    await a.send(handle, body=b"order")
    p1 = await deployment.daemons["p1"].client()
    (order,) = await receive_parts(p1, 1)
    await wait_caught_up(deployment, "p1", "p2")
    admin = await deployment.daemons["p1"].client()
    lock = sqlite3.connect(deployment.daemons["p1"].directory / "data" / "Parts.sqlite")
    try:
        lock.execute("BEGIN IMMEDIATE")
        reply = asyncio.create_task(p1.send(order.conversation_handle, body=b"reply"))
        await asyncio.sleep(1.5)  # its batch waits for the lock, inside its transaction
        demotion = asyncio.create_task(admin.set_mirror_role("Parts", "mirror"))
        await asyncio.sleep(0.5)
        assert not reply.done()
    finally:
        lock.rollback()
        lock.close()
    with pytest.raises(RemoteError, match="no longer principal"):
        await reply
    await demotion
    await admin.close()
    await p1.close()
    deployment.kill("p1")
    p2 = await deployment.daemons["p2"].client()
    await p2.set_mirror_role("Parts", "principal")
    assert await a.receive(queue_of(INITIATOR), timeout=3.0) == []
    await p2.close()
    await a.close()


async def test_a_principal_restarted_in_stall_mode_resumes_once_its_mirror_confirms(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16: a principal restarted with units in its file is in doubt; its mirror
    answers "mirror", attaches and confirms the file's last unit, and the principal then
    takes traffic again (a message sent meanwhile is delivered)."""
    a = await start_pair(deployment, 'mirror_when_lost = "stall"\n')
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    await a.send(handle, body=b"before")
    p1 = await deployment.daemons["p1"].client()
    assert [m.message_body for m in await receive_parts(p1, 1)] == [b"before"]
    await wait_caught_up(deployment, "p1", "p2")
    await p1.close()
    deployment.kill("p1")
    deployment.start("p1")
    await a.send(handle, body=b"after")
    p1 = await deployment.daemons["p1"].client()
    assert [m.message_body for m in await receive_parts(p1, 1)] == [b"after"]
    view = await mirroring(deployment, "p1")
    assert (view["role"], view["in_doubt"]) == ("principal", False)


async def test_a_mirror_behind_a_restarted_principal_catches_up_by_a_copy_of_the_file(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16: a principal restarted while its mirror was away holds no units in
    memory, so the returning mirror gets a copy of the whole file. The principal's file
    is in WAL mode, and so was the copy's header: the mirror could not open it ("unable
    to open database file"), asked for a copy again and again and never caught up (found
    by the soak, brokerd/tools/soak, after its first failover). It catches up, and a
    failover after that loses nothing."""
    a = await start_pair(deployment)
    p1 = await deployment.daemons["p1"].client()
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    bodies = [f"item {i}".encode() for i in range(1, 31)]
    for body in bodies[:10]:
        await a.send(handle, body=body)
    received = await receive_parts(p1, 5)
    deployment.kill("p2")
    for body in bodies[10:20]:
        await a.send(handle, body=body)

    async def acknowledged() -> bool:
        return await a.view("transmission_queue") == []

    await wait_until(acknowledged, 30)  # exposed: p1 holds units p2 never had
    await p1.close()
    deployment.kill("p1")
    deployment.start("p1")  # its memory of units is gone
    deployment.start("p2")
    await wait_caught_up(deployment, "p1", "p2")
    assert (await mirroring(deployment, "p2"))["snapshots_installed"] >= 1
    p2 = await fail_over(deployment)
    for body in bodies[20:]:
        await a.send(handle, body=body)
    received += await receive_parts(p2, 25, timeout=60)
    assert await p2.receive(queue_of(PARTS), timeout=0.5) == []
    assert_exactly_once_in_order(received, {handle: bodies})


async def local_epoch(deployment: Deployment, name: str) -> tuple[str, int]:
    client = await deployment.daemons[name].client()
    try:
        rows = await client.view("mirrors")
    finally:
        await client.close()
    (row,) = [r for r in rows if r["kind"] == "local database"]
    return str(row["role"]), int(row["epoch"])


async def test_a_partner_promoted_again_opens_an_epoch_above_its_partners(
    deployment: Deployment,
) -> None:
    """R-ROUTE-15: the old principal, demoted and caught up from the new principal's units
    (written at epoch 1), is promoted in its turn: it opens epoch 2. It opened epoch 1
    again (its own demoted epoch 0, plus one) when no sender had told it of epoch 1, so
    the other partner, restarted, claimed the principal role at the same epoch and
    senders could not tell the two apart (found by the soak, brokerd/tools/soak: SENDs
    committed at that partner were lost, messages received twice)."""
    a = await start_pair(deployment)
    handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
    await a.send(handle, body=b"before")
    p2 = await fail_over(deployment)
    assert await local_epoch(deployment, "p2") == ("principal", 1)
    await a.send(handle, body=b"at epoch 1")
    assert len(await receive_parts(p2, 2)) == 2  # units written at epoch 1
    await a.close()
    deployment.kill("a")  # no sender tells p1 of epoch 1
    deployment.start("p1")
    p1 = await deployment.daemons["p1"].client()
    await p1.set_mirror_role("Parts", "mirror")
    await wait_caught_up(deployment, "p2", "p1")
    deployment.kill("p2")
    await p1.set_mirror_role("Parts", "principal")
    assert await local_epoch(deployment, "p1") == ("principal", 2)


async def test_a_principal_stopped_during_sends_answers_each_with_its_true_outcome(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16, SPEC §6: the principal's own application pipelines SENDs when the
    principal is stopped with SIGTERM. Each SEND it read is answered once its unit is
    confirmed by the mirror (never ``StorageFailure`` for a batch already in its file);
    the rest fail with ``BrokerStopping`` (not executed). The mirror is promoted: the SENDs
    answered with a number reach the initiator once, in order, and no other does."""
    a = await start_pair(deployment)
    p1 = await deployment.daemons["p1"].client(reconnect=False)
    handle = await p1.begin_dialog(PARTS, INITIATOR, database="Parts")
    bodies, outcomes = await sends_through_a_stop(
        p1,
        handle,
        "DEFAULT",
        "reply",
        lambda: deployment.stop("p1"),
        after=300,
        burst=20,
        pause=0.005,
    )
    committed = [body for body, o in zip(bodies, outcomes, strict=True) if type(o) is int]
    others = [o for o in outcomes if not isinstance(o, int | BrokerStopping)]
    assert others == [], others[:3]
    assert len(committed) >= 300

    p2 = await deployment.daemons["p2"].client()
    await p2.set_mirror_role("Parts", "principal")
    received: list[ReceivedMessage] = []

    async def all_arrived() -> bool:
        received.extend(await a.receive(queue_of(INITIATOR), top=1000, timeout=0.2))
        return len(received) >= len(committed)

    await wait_until(all_arrived, 60)
    assert [m.message_body for m in received] == committed
    assert await a.receive(queue_of(INITIATOR), timeout=1.0) == []


async def test_a_principal_killed_during_keyed_sends_leaves_each_retryable_by_its_key(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16, SPEC §6: the principal's application pipelines SENDs, each with an
    idempotency key, and the principal is killed (SIGKILL). Each SEND is answered with a
    number or fails with OutcomeUnknown. The mirror is promoted and the application sends
    each unknown one again, with its key, to the new principal: the keys travelled with
    the units the mirror confirmed, so a SEND already committed is answered with its first
    number and not queued again. Every SEND then has one number, 1 to N, and reaches the
    initiator once, in order: the initiator's target endpoint, bound ``mirrored``
    (R-DLG-14), takes the promoted partner's frames as the first one's."""
    a = await start_pair(deployment)
    p1 = await deployment.daemons["p1"].client(reconnect=False)
    handle = await p1.begin_dialog(PARTS, INITIATOR, database="Parts")
    await wait_caught_up(deployment, "p1", "p2")
    total = 1200
    bodies = [f"reply {n}".encode() for n in range(total)]
    futures: list[asyncio.Future[int] | None] = [None] * total
    killing: asyncio.Future[None] | None = None
    for n, body in enumerate(bodies):
        try:
            futures[n] = p1.send_nowait(handle, "DEFAULT", body, key=f"reply-{n}")
        except ClientError:
            break  # the connection is gone: the rest was never sent
        if n == 400:
            killing = asyncio.ensure_future(asyncio.to_thread(deployment.kill, "p1"))
        if n % 20 == 19:
            await asyncio.sleep(0.005)
    assert killing is not None
    await killing
    outcomes: list[object] = [
        None if f is None else (await asyncio.gather(f, return_exceptions=True))[0] for f in futures
    ]
    odd = [o for o in outcomes if not (o is None or type(o) is int or isinstance(o, ClientError))]
    assert odd == [], odd[:3]
    assert any(isinstance(o, OutcomeUnknown) for o in outcomes), "SENDs were in flight"

    p2 = await deployment.daemons["p2"].client()
    await p2.set_mirror_role("Parts", "principal")
    again = [n for n, o in enumerate(outcomes) if type(o) is not int]
    numbers = await asyncio.gather(
        *(p2.send(handle, "DEFAULT", bodies[n], key=f"reply-{n}") for n in again)
    )
    final = [o if type(o) is int else 0 for o in outcomes]
    for n, number in zip(again, numbers, strict=True):
        final[n] = number
    assert final == list(range(1, total + 1))

    received: list[ReceivedMessage] = []

    async def all_arrived() -> bool:
        received.extend(await a.receive(queue_of(INITIATOR), top=1000, timeout=0.2))
        return len(received) >= total

    await wait_until(all_arrived, 90)
    assert [m.message_body for m in received] == bodies
    assert await a.receive(queue_of(INITIATOR), timeout=1.0) == []
