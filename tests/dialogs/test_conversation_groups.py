"""Conversation groups end to end with a real daemon (SPEC §6, R-CLIENT-2): GET CONVERSATION
GROUP with WAITFOR, in and out of a transaction; RECEIVE limited to one conversation
group; BEGIN DIALOG with RELATED_CONVERSATION_GROUP; the refusals; and a SIGTERM that
finds a GET CONVERSATION GROUP waiting.

One daemon (a subprocess on 127.0.0.1:4022, real TCP and SQLite) holds the database
``Solo``: ``//solo/S1`` (queue ``Q1``) opens dialogs to ``//solo/S2`` (queue ``Q2``),
where each dialog's messages arrive in a conversation group of their own. Two
application tokens: ``target`` may read ``Q2`` only, ``initiator`` ``Q1`` only.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.server.daemon import CLIENT_STOP_GRACE
from brokerd.tools.launcher import Daemon, Deployment
from protocol.errors import InvalidRequest, PermissionDenied, QueueDisabled, QueueNotFound
from tests.daemons import FAST_RETRY, SOLO_DATABASE, running, wait_until

S1, S2 = "//solo/S1", "//solo/S2"

TOKENS = f"""
[[client.token]]
name = "target"
file = "tokens/target.token"
role = "application"
services = ["{S2}"]
queues = ["Q2"]

[[client.token]]
name = "initiator"
file = "tokens/initiator.token"
role = "application"
services = ["{S1}"]
queues = ["Q1"]
"""


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(tmp_path / "deployment", FAST_RETRY)
    d.add("solo", "127.0.0.1", SOLO_DATABASE, client_extra=TOKENS)
    with running(d):
        yield d


@pytest.fixture
def daemon(deployment: Deployment) -> Daemon:
    return deployment.daemons["solo"]


@pytest.fixture
async def admin(daemon: Daemon) -> AsyncIterator[BrokerClient]:
    async with await daemon.client() as client:
        yield client


async def application(daemon: Daemon, name: str) -> BrokerClient:
    return await daemon.client(name, daemon.directory / "tokens" / f"{name}.token")


async def wait_ready(admin: BrokerClient, queue: str, count: int) -> None:
    async def ready() -> bool:
        rows = await admin.view("queues")
        return sum(r["ready_messages"] for r in rows if r["queue"] == queue) >= count

    await wait_until(ready, 30)


async def dialogs(admin: BrokerClient, count: int, per_dialog: int) -> list[uuid.UUID]:
    """``count`` dialogs S1 -> S2, ``per_dialog`` messages each sent interleaved (one of
    each dialog in turn, so the groups' messages arrive mixed), all ready in Q2."""
    handles = [await admin.begin_dialog(S1, S2) for _ in range(count)]
    for n in range(per_dialog):
        for d, handle in enumerate(handles):
            await admin.send(handle, body=f"dialog {d} message {n}".encode())
    await wait_ready(admin, "Q2", count * per_dialog)
    return handles


def bodies(messages: list[ReceivedMessage]) -> list[bytes]:
    return [m.message_body for m in messages]


async def test_two_readers_never_share_a_group_and_never_wait_behind_one(
    daemon: Daemon, admin: BrokerClient
) -> None:
    """Each reader, in its own transactions, takes a group with GET CONVERSATION GROUP and
    receives that group's messages: no group is handed to both, every group's messages
    come whole and in order, and a reader never waits behind the other's lock."""
    await dialogs(admin, count=6, per_dialog=3)
    a, b = await application(daemon, "target"), await application(daemon, "target")
    try:
        # A holds one group; B, asking with a long WAITFOR, gets another at once.
        async with a.transaction() as tx_a:
            held = await tx_a.get_conversation_group("Q2", timeout=0)
            assert held is not None
            loop = asyncio.get_running_loop()
            started = loop.time()
            async with b.transaction() as tx_b:
                other = await tx_b.get_conversation_group("Q2", timeout=10)
                assert other is not None and other != held
                assert loop.time() - started < 1.0
                await tx_b.rollback()
            await tx_a.rollback()

        taken: dict[str, list[uuid.UUID]] = {"a": [], "b": []}
        received: dict[uuid.UUID, list[bytes]] = {}

        async def reader(name: str, client: BrokerClient) -> None:
            while True:
                async with client.transaction() as tx:
                    group = await tx.get_conversation_group("Q2", timeout=0)
                    if group is None:
                        return
                    got = await tx.receive("Q2", top=100, conversation_group_id=group)
                    assert {m.conversation_group_id for m in got} == {group}
                    assert group not in received
                    received[group] = bodies(got)
                    taken[name].append(group)
                    await asyncio.sleep(0.05)  # hold the lock while the other reader asks

        await asyncio.gather(reader("a", a), reader("b", b))
    finally:
        await a.close()
        await b.close()
    assert len(received) == 6
    assert not set(taken["a"]) & set(taken["b"])
    assert taken["a"] and taken["b"]  # both read: neither waited behind the other
    for messages in received.values():
        dialog = messages[0].split(b" message")[0]
        assert messages == [dialog + f" message {n}".encode() for n in range(3)]
    assert await admin.receive("Q2", timeout=0) == []


async def test_a_held_group_is_skipped_and_its_group_receive_waits_for_it(
    daemon: Daemon, admin: BrokerClient
) -> None:
    """While a transaction holds a group (GET CONVERSATION GROUP), another reader's GET
    CONVERSATION GROUP skips it (None at once when it is the only one), and a RECEIVE
    limited to it returns nothing, or waits, per its timeout, until the holder rolls back.
    A transaction that commits having only held a group gives it back untouched."""
    await dialogs(admin, count=1, per_dialog=2)
    reader = await application(daemon, "target")
    try:
        tx = await admin.begin_transaction()
        group = await tx.get_conversation_group("Q2", timeout=0)
        assert group is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await reader.get_conversation_group("Q2", timeout=0) is None
        assert await reader.receive("Q2", conversation_group_id=group, timeout=0) == []
        assert await reader.receive("Q2", top=10, timeout=0) == []
        assert loop.time() - started < 1.0
        waiting = asyncio.ensure_future(
            reader.receive("Q2", top=10, conversation_group_id=group, timeout=20)
        )
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await tx.rollback()
        got = await asyncio.wait_for(waiting, 10)
        assert bodies(got) == [b"dialog 0 message 0", b"dialog 0 message 1"]

        # A transaction that only held the group commits and lets it go, receiving nothing.
        await dialogs(admin, count=1, per_dialog=1)
        async with admin.transaction() as tx:
            group = await tx.get_conversation_group("Q2", timeout=5)
            assert await reader.get_conversation_group("Q2", timeout=0) is None
        assert await reader.get_conversation_group("Q2", timeout=0) == group
    finally:
        await reader.close()


async def test_a_group_receive_returns_that_group_alone_rollback_returns_it_commit_removes(
    admin: BrokerClient,
) -> None:
    await dialogs(admin, count=3, per_dialog=3)
    async with admin.transaction() as tx:
        group = await tx.get_conversation_group("Q2", timeout=0)
        assert group is not None
        got = await tx.receive("Q2", top=100, conversation_group_id=group)
        assert bodies(got) == [f"dialog 0 message {n}".encode() for n in range(3)]
        assert {m.conversation_group_id for m in got} == {group}
        assert [m.message_sequence_number for m in got] == sorted(
            m.message_sequence_number for m in got
        )
        await tx.rollback()

    # Back, first and in order: the next GET CONVERSATION GROUP names it again.
    assert await admin.get_conversation_group("Q2", timeout=0) == group
    async with admin.transaction() as tx:
        assert await tx.get_conversation_group("Q2", timeout=0) == group
        again = await tx.receive("Q2", top=100, conversation_group_id=group)
        assert bodies(again) == bodies(got)
    assert tx.finished
    assert await admin.receive("Q2", conversation_group_id=group, timeout=0) == []
    rest = await admin.receive("Q2", top=100, timeout=0)
    assert bodies(rest) == [f"dialog 1 message {n}".encode() for n in range(3)]
    assert await admin.get_conversation_group("Q2", timeout=0) is not None  # dialog 2's


async def test_a_group_receive_outside_a_transaction_takes_only_that_group(
    admin: BrokerClient,
) -> None:
    handles = await dialogs(admin, count=2, per_dialog=2)
    rows = await admin.view("conversation_endpoints")
    (conversation,) = (
        r["conversation_id"] for r in rows if r["conversation_handle"] == str(handles[1])
    )
    (second,) = (
        uuid.UUID(r["conversation_group_id"])
        for r in rows
        if r["conversation_id"] == conversation and not r["is_initiator"]
    )
    got = await admin.receive("Q2", top=10, conversation_group_id=second)
    assert bodies(got) == [b"dialog 1 message 0", b"dialog 1 message 1"]
    assert bodies(await admin.receive("Q2", top=10)) == [
        b"dialog 0 message 0",
        b"dialog 0 message 1",
    ]


async def test_related_conversation_group_puts_dialogs_in_one_named_group(
    daemon: Daemon, admin: BrokerClient
) -> None:
    """BEGIN DIALOG ... WITH RELATED_CONVERSATION_GROUP: a group made by naming it; two
    dialogs joined to it are received, and locked, together."""
    named = uuid.uuid4()
    first = await admin.begin_dialog(S1, S2, related_conversation_group=named)
    async with admin.transaction() as tx:
        second = await tx.begin_dialog(S1, S2, related_conversation_group=named)
    alone = await admin.begin_dialog(S1, S2)
    rows = {r["conversation_handle"]: r for r in await admin.view("conversation_endpoints")}
    assert rows[str(first)]["conversation_group_id"] == str(named)
    assert rows[str(second)]["conversation_group_id"] == str(named)
    assert rows[str(alone)]["conversation_group_id"] != str(named)

    # S2 answers each dialog; the answers to the two related ones arrive in one group.
    for n, handle in enumerate((first, second, alone)):
        await admin.send(handle, body=f"question {n}".encode())
    await wait_ready(admin, "Q2", 3)
    for _ in range(3):
        (question,) = await admin.receive("Q2", timeout=5)
        n = question.message_body.split(b" ")[1]
        await admin.send(question.conversation_handle, body=b"answer " + n)
    await wait_ready(admin, "Q1", 3)

    other = await application(daemon, "initiator")
    try:
        async with admin.transaction() as tx:
            got = await tx.receive("Q1", top=10, conversation_group_id=named)
            assert sorted(bodies(got)) == [b"answer 0", b"answer 1"]
            assert {m.conversation_handle for m in got} == {first, second}
            # Locked together: another reader gets neither answer, only the third dialog's.
            assert await other.receive("Q1", conversation_group_id=named, timeout=0.2) == []
            assert bodies(await other.receive("Q1", top=10, timeout=0.2)) == [b"answer 2"]
    finally:
        await other.close()
    assert await admin.receive("Q1", timeout=0) == []

    with pytest.raises(InvalidRequest, match="not both"):
        await admin.begin_dialog(
            S1, S2, related_conversation=first, related_conversation_group=named
        )


async def test_get_conversation_group_waits_for_a_message_and_timeout_zero_does_not(
    admin: BrokerClient,
) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await admin.get_conversation_group("Q2", timeout=0) is None
    assert loop.time() - started < 0.5
    started = loop.time()
    assert await admin.get_conversation_group("Q2", timeout=0.4) is None
    assert loop.time() - started >= 0.35

    async with admin.transaction() as tx:
        waiting = asyncio.ensure_future(tx.get_conversation_group("Q2", timeout=-1))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        handle = await admin.begin_dialog(S1, S2)
        await admin.send(handle, body=b"at last")
        sent = loop.time()
        group = await asyncio.wait_for(waiting, 10)
        assert group is not None
        assert loop.time() - sent < 2.0
        (got,) = await tx.receive("Q2", conversation_group_id=group)
        assert got.message_body == b"at last"


async def test_refusals(daemon: Daemon, admin: BrokerClient) -> None:
    """A RECEIVE naming both a conversation and a group, an unknown queue, a disabled
    queue (R-DLG-12), and an application token asking for a queue that is not its own
    (R-CLIENT-2) are refused with their typed errors, and take nothing."""
    (handle,) = await dialogs(admin, count=1, per_dialog=1)
    group = await admin.get_conversation_group("Q2")
    assert group is not None
    with pytest.raises(InvalidRequest, match="not both"):
        await admin.receive("Q2", conversation_handle=handle, conversation_group_id=group)
    async with admin.transaction() as tx:
        with pytest.raises(InvalidRequest, match="not both"):
            await tx.receive("Q2", conversation_handle=handle, conversation_group_id=group)
        with pytest.raises(QueueNotFound):
            await tx.get_conversation_group("NoSuchQueue")
    with pytest.raises(QueueNotFound):
        await admin.get_conversation_group("NoSuchQueue", timeout=1)
    with pytest.raises(QueueNotFound):
        await admin.receive("NoSuchQueue", conversation_group_id=group)
    await admin.alter_queue("Q2", False)
    with pytest.raises(QueueDisabled):
        await admin.get_conversation_group("Q2", timeout=-1)
    await admin.alter_queue("Q2", True)

    initiator = await application(daemon, "initiator")
    target = await application(daemon, "target")
    try:
        with pytest.raises(PermissionDenied):
            await initiator.get_conversation_group("Q2")
        async with initiator.transaction() as tx:
            with pytest.raises(PermissionDenied):
                await tx.get_conversation_group("Q2")
        with pytest.raises(PermissionDenied):
            await initiator.receive("Q2", conversation_group_id=group)
        assert await target.get_conversation_group("Q2") == group  # its own queue
    finally:
        await initiator.close()
        await target.close()
    (got,) = await admin.receive("Q2", conversation_group_id=group)
    assert got.message_body == b"dialog 0 message 0"


async def test_sigterm_ends_a_waiting_get_conversation_group(deployment: Deployment) -> None:
    """A GET CONVERSATION GROUP waiting without end when the daemon is stopped returns at
    once with no group (nothing was held), and the daemon does not wait out its grace
    period for it."""
    client = await deployment.daemons["solo"].client()
    try:
        tx = await client.begin_transaction()  # never ended: the daemon goes away
        waiting = asyncio.ensure_future(tx.get_conversation_group("Q2", timeout=-1))
        await asyncio.sleep(0.3)  # it waits in the daemon
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.to_thread(deployment.stop, "solo")
        assert await asyncio.wait_for(waiting, 5) is None
        assert loop.time() - started < CLIENT_STOP_GRACE / 2
    finally:
        await client.close()
