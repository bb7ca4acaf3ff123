"""RECEIVE of several conversation groups at once (SPEC §6, ``groups``) with a real daemon:
group after group, each group's messages in order, TOP counted over them all, every
group returned locked as a RECEIVE of one locks it (in a transaction until it ends),
and the refusals.

One daemon (a subprocess on 127.0.0.1:4022, real TCP and SQLite) holds the database
``Solo``: ``//solo/S1`` (queue ``Q1``) opens dialogs to ``//solo/S2`` (queue ``Q2``),
where each dialog's messages arrive in a conversation group of their own.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from brokerd.dialogs.endpoints.ready import ReadyIndex
from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.sdk.messages import by_group
from brokerd.tools.launcher import Daemon, Deployment
from protocol.errors import InvalidRequest
from tests.daemons import FAST_RETRY, SOLO_DATABASE, running, wait_until

S1, S2 = "//solo/S1", "//solo/S2"


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(tmp_path / "deployment", FAST_RETRY)
    d.add("solo", "127.0.0.1", SOLO_DATABASE)
    with running(d):
        yield d


@pytest.fixture
def daemon(deployment: Deployment) -> Daemon:
    return deployment.daemons["solo"]


@pytest.fixture
async def admin(daemon: Daemon) -> AsyncIterator[BrokerClient]:
    async with await daemon.client() as client:
        yield client


async def dialogs(admin: BrokerClient, count: int, per_dialog: int) -> list[uuid.UUID]:
    """``count`` dialogs S1 -> S2, ``per_dialog`` messages each sent interleaved (one of
    each dialog in turn), all ready in Q2; their handles in the order begun."""
    handles = [await admin.begin_dialog(S1, S2) for _ in range(count)]
    for n in range(per_dialog):
        for d, handle in enumerate(handles):
            await admin.send(handle, body=f"d{d} m{n}".encode())

    async def ready() -> bool:
        rows = await admin.queues()
        return sum(r.ready_messages for r in rows if r.queue == "Q2") >= count * per_dialog

    await wait_until(ready, 30)
    return handles


def bodies(messages: list[ReceivedMessage]) -> list[bytes]:
    return [m.message_body for m in messages]


def dialog_of(batch: list[ReceivedMessage]) -> bytes:
    return batch[0].message_body.split(b" ")[0]


def check_batches(batches: list[list[ReceivedMessage]], per_dialog: int) -> None:
    """Each batch is one conversation group's messages, whole and in sequence order."""
    for batch in batches:
        assert len({m.conversation_group_id for m in batch}) == 1
        assert len({m.conversation_handle for m in batch}) == 1
        d = dialog_of(batch)
        assert bodies(batch) == [d + f" m{n}".encode() for n in range(per_dialog)]
        seqs = [m.message_sequence_number for m in batch]
        assert seqs == sorted(seqs)


async def test_a_receive_returns_several_groups_one_after_the_other(
    admin: BrokerClient,
) -> None:
    """SPEC §6: ``groups=4`` returns four groups' messages, group after group, each whole
    and in order, oldest group first; the next RECEIVE gets the two left."""
    await dialogs(admin, count=6, per_dialog=3)
    first = await admin.receive("Q2", top=100, groups=4)
    batches = by_group(first)
    assert len(first) == 12 and len(batches) == 4
    check_batches(batches, 3)
    assert [dialog_of(b) for b in batches] == [b"d0", b"d1", b"d2", b"d3"]
    rest = by_group(await admin.receive("Q2", top=100, groups=10))
    assert [dialog_of(b) for b in rest] == [b"d4", b"d5"]
    check_batches(rest, 3)
    assert await admin.receive("Q2", timeout=0, groups=10) == []


async def test_top_counts_the_messages_of_every_group(admin: BrokerClient) -> None:
    """TOP (5) over groups of three: the first group whole and two of the second; the
    second group's third message stays first in its group and comes next."""
    await dialogs(admin, count=3, per_dialog=3)
    got = await admin.receive("Q2", top=5, groups=10)
    assert bodies(got) == [b"d0 m0", b"d0 m1", b"d0 m2", b"d1 m0", b"d1 m1"]
    assert bodies(await admin.receive("Q2", top=1)) == [b"d1 m2"]
    assert bodies(await admin.receive("Q2", top=100, groups=2)) == [b"d2 m0", b"d2 m1", b"d2 m2"]


async def test_a_transaction_holds_every_group_it_received_until_it_ends(
    daemon: Daemon, admin: BrokerClient
) -> None:
    """Each group a RECEIVE of several groups returns in a transaction stays locked until
    COMMIT or ROLLBACK: another reader gets only the others, and a rollback puts every
    message back, in order."""
    await dialogs(admin, count=5, per_dialog=2)
    async with await daemon.client() as other:
        async with admin.transaction() as tx:
            held = by_group(await tx.receive("Q2", top=100, groups=3))
            assert [dialog_of(b) for b in held] == [b"d0", b"d1", b"d2"]
            rest = by_group(await other.receive("Q2", top=100, groups=10, timeout=0))
            assert [dialog_of(b) for b in rest] == [b"d3", b"d4"]
            assert await other.receive("Q2", top=100, groups=10, timeout=0) == []
            await tx.rollback()
        again = by_group(await other.receive("Q2", top=100, groups=10))
        assert [dialog_of(b) for b in again] == [b"d0", b"d1", b"d2"]
        check_batches(again, 2)
        async with admin.transaction() as tx:
            assert await tx.receive("Q2", top=100, groups=10) == []
    assert await admin.receive("Q2", timeout=0) == []


async def test_a_reply_too_big_cuts_across_groups_and_loses_nothing(admin: BrokerClient) -> None:
    """R-DLG-1 with ``groups``: 4,000 messages of 40 groups exceed one reply's meta (about
    330 bytes a row against 1 MiB), so the RECEIVE is cut inside a group; the cut
    group's rest and the groups after it stay, first in their groups and unlocked, and
    the next RECEIVEs return them: every message once, each conversation in order."""
    count, per = 40, 100
    handles = [await admin.begin_dialog(S1, S2) for _ in range(count)]
    for d, handle in enumerate(handles):
        await admin.send_many([(handle, "DEFAULT", f"d{d} m{n}".encode()) for n in range(per)])

    async def ready() -> bool:
        rows = await admin.queues()
        return sum(r.ready_messages for r in rows if r.queue == "Q2") >= count * per

    await wait_until(ready, 60)
    async with admin.transaction() as tx:
        held = await tx.receive("Q2", top=10 * count * per, groups=count)
        assert 0 < len(held) < count * per
        await tx.rollback()
    received: dict[uuid.UUID, list[int]] = {}
    calls = 0
    while got := await admin.receive("Q2", top=10 * count * per, groups=count, timeout=0):
        calls += 1
        for m in got:
            received.setdefault(m.conversation_handle, []).append(m.message_sequence_number)
    assert calls >= 2
    assert len(received) == count
    for seqs in received.values():
        assert seqs == sorted(seqs) and len(seqs) == len(set(seqs)) == per


async def test_groups_refused(admin: BrokerClient) -> None:
    """``groups`` is 1 to 1,024, and a RECEIVE limited to one conversation or group takes
    one group: each refusal is ``invalid_request`` and takes nothing."""
    handles = await dialogs(admin, count=2, per_dialog=1)
    for groups in (0, 1025):
        with pytest.raises(InvalidRequest):
            await admin.receive("Q2", groups=groups)
    target = (await admin.receive("Q2", top=1))[0]
    with pytest.raises(InvalidRequest):
        await admin.receive("Q2", groups=2, conversation_handle=target.conversation_handle)
    with pytest.raises(InvalidRequest):
        await admin.receive("Q2", groups=2, conversation_group_id=target.conversation_group_id)
    assert len(handles) == 2
    assert bodies(await admin.receive("Q2", top=10, groups=2)) == [b"d1 m0"]


def test_take_groups_skips_locked_groups_and_locks_each_one_taken() -> None:
    """The ready index's choice: oldest groups first, a locked group skipped (its
    transaction's own taken again), ``top`` counted over all, each taken group locked."""
    index = ReadyIndex()
    groups = [uuid.uuid4() for _ in range(4)]
    handles = [uuid.uuid4() for _ in range(4)]
    for seq in (1, 2):
        for group, handle in zip(groups, handles, strict=True):
            index.add(group, handle, seq)
    index.lock(groups[0])
    taken = index.take_groups(3, 10)
    assert taken == [
        (groups[1], [(handles[1], 1), (handles[1], 2)]),
        (groups[2], [(handles[2], 1)]),
    ]
    assert index.locked == {groups[0], groups[1], groups[2]}
    assert index.count == 5
    assert index.groups[groups[2]] == [(handles[2], 2)]
    owned = index.take_groups(10, 1, owned={groups[0]})
    assert owned == [(groups[0], [(handles[0], 1), (handles[0], 2)])]
    assert index.take_groups(10, 10) == [(groups[3], [(handles[3], 1), (handles[3], 2)])]
    assert index.take_groups(10, 10) == [] and index.count == 1


async def test_groups_a_cut_left_out_are_not_held_by_the_transaction(
    daemon: Daemon, admin: BrokerClient
) -> None:
    """SPEC §6: 4,000 messages of 40 groups exceed one reply, so a RECEIVE of 40 groups
    in a transaction is cut. The groups it returned stay locked until the transaction
    ends; every other group is free for another reader while it is open, and nothing is
    lost or taken twice once it commits."""
    count, per = 40, 100
    handles = [await admin.begin_dialog(S1, S2) for _ in range(count)]
    for d, handle in enumerate(handles):
        await admin.send_many([(handle, "DEFAULT", f"d{d} m{n}".encode()) for n in range(per)])

    async def ready() -> bool:
        rows = await admin.queues()
        return sum(r.ready_messages for r in rows if r.queue == "Q2") >= count * per

    await wait_until(ready, 60)
    received: dict[uuid.UUID, list[int]] = {}
    async with await daemon.client() as other:
        async with admin.transaction() as tx:
            held = await tx.receive("Q2", top=10 * count * per, groups=count)
            assert 0 < len(held) < count * per
            returned = {m.conversation_group_id for m in held}
            assert len(returned) < count
            free = await other.receive("Q2", top=10 * count * per, groups=count, timeout=0)
            taken = {m.conversation_group_id for m in free}
            assert free, "every group the cut left out is still held by the transaction"
            assert not taken & returned
            for m in [*held, *free]:
                received.setdefault(m.conversation_handle, []).append(m.message_sequence_number)
            await tx.commit()
        while got := await other.receive("Q2", top=10 * count * per, groups=count, timeout=0):
            for m in got:
                received.setdefault(m.conversation_handle, []).append(m.message_sequence_number)
    assert len(received) == count
    for seqs in received.values():
        assert seqs == sorted(seqs) and len(seqs) == len(set(seqs)) == per
