"""A RECEIVE of several conversation groups in a client transaction cut by the reply's
limit (SPEC §6, ``groups``): the groups it returns stay locked until COMMIT or
ROLLBACK; the groups the cut left out entirely are not returned, so they are not held
and another reader takes them at once.

One daemon (a subprocess on 127.0.24.1:4022, real TCP and SQLite) holds the database
``Solo``: ``//solo/S1`` (queue ``Q1``) opens dialogs to ``//solo/S2`` (queue ``Q2``),
where each dialog's messages arrive in a conversation group of their own.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.tools.launcher import Daemon, Deployment
from tests.daemons import FAST_RETRY, SOLO_DATABASE, running, wait_until

S1, S2 = "//solo/S1", "//solo/S2"


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(tmp_path / "deployment", FAST_RETRY)
    d.add("solo", "127.0.24.1", SOLO_DATABASE)
    with running(d):
        yield d


@pytest.fixture
def daemon(deployment: Deployment) -> Daemon:
    return deployment.daemons["solo"]


@pytest.fixture
async def admin(daemon: Daemon) -> AsyncIterator[BrokerClient]:
    async with await daemon.client() as client:
        yield client


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
