"""Verbs whose commit fails, against what memory keeps meanwhile: a failed commit leaves
memory as the file is, also when another transaction reads, rolls back or counts while
it is in flight (SPEC §6, R-DLG-1).

The broker runs in the test's process, so that the test can make its database refuse
writes (``PRAGMA query_only`` on the committer's own connection: SQLITE_READONLY, as a
file that cannot be written) and hold its committer between two batches, so that a
commit is in flight for as long as the test needs.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.server.daemon import Broker
from protocol.errors import RemoteError
from tests.daemons import client_of, solo_broker, wait_until
from tests.disks import read_only

S1, S2 = "//solo/S1", "//solo/S2"
HOSTS = [f"127.0.33.{n}" for n in range(1, 9)]


async def _dialogs(broker: Broker, client: BrokerClient, count: int) -> list[uuid.UUID]:
    """``count`` dialogs S1 -> S2 with one message each, sent in order and ready in Q2;
    the handles of their target endpoints (each in a group of its own), in that order."""
    db = broker.databases["Solo"]
    targets = []
    for n in range(count):
        handle = await client.begin_dialog(S1, S2)
        await client.send(handle, body=f"m{n}".encode())
        conversation = db.endpoints[handle].conversation_id

        async def arrived(conversation: uuid.UUID = conversation) -> bool:
            return (conversation, False) in db.by_key

        await wait_until(arrived, 10.0)
        targets.append(db.by_key[(conversation, False)].handle)

    async def ready() -> bool:
        return db.ready["Q2"].count == count

    await wait_until(ready, 10.0)
    return targets


async def test_a_receive_of_several_groups_that_fails_to_commit_keeps_their_order(
    tmp_path: Path,
) -> None:
    """SPEC §6, R-DLG-1: a RECEIVE of several conversation groups whose commit fails puts
    every group back where it was: the oldest is still the first a RECEIVE takes."""
    async with solo_broker(tmp_path, HOSTS[0]) as broker:
        client = await client_of(broker)
        try:
            await _dialogs(broker, client, 3)
            store = broker.databases["Solo"].store
            await read_only(store, True)
            try:
                with pytest.raises(RemoteError):
                    await client.receive("Q2", top=10, groups=3)
            finally:
                await read_only(store, False)
            got = await client.receive("Q2", top=10, groups=3)
            assert [m.message_body for m in got] == [b"m0", b"m1", b"m2"]
        finally:
            await client.close()
