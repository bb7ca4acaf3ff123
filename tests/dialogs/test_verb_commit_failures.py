"""Verbs whose commit fails, against what memory keeps meanwhile: a failed commit leaves
memory as the file is, also when another transaction reads, rolls back or counts while
it is in flight (SPEC §6, R-DLG-1).

The broker runs in the test's process, so that the test can make its database refuse
writes (``PRAGMA query_only`` on the committer's own connection: SQLITE_READONLY, as a
file that cannot be written) and hold its committer between two batches, so that a
commit is in flight for as long as the test needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.server.daemon import Broker
from brokerd.storage.store import Store
from protocol.errors import RemoteError
from tests.daemons import client_of, solo_broker, wait_until
from tests.disks import read_only

S1, S2 = "//solo/S1", "//solo/S2"
HOSTS = [f"127.0.33.{n}" for n in range(1, 9)]


class _Hold:
    """A job that keeps ``store``'s committer inside it (and inside the transaction of its
    batch) until :meth:`release`: what is submitted meanwhile waits for the next commit.
    With ``then_read_only``, the file refuses every write from the next batch on (as
    :func:`read_only` makes it, between two batches)."""

    def __init__(self, store: Store, then_read_only: bool = False) -> None:
        self.started, self.released = threading.Event(), threading.Event()

        def hold(conn: sqlite3.Connection) -> None:
            self.started.set()
            self.released.wait(10)
            if then_read_only:
                conn.execute("PRAGMA query_only = 1")

        self.job = asyncio.ensure_future(store.run(hold))

    async def running(self) -> None:
        """Wait until the committer is inside the job."""
        assert await asyncio.to_thread(self.started.wait, 10)

    async def release(self) -> None:
        self.released.set()
        await self.job


@contextlib.asynccontextmanager
async def _held(store: Store, then_read_only: bool = False) -> AsyncIterator[None]:
    """Keep ``store``'s committer inside a job of its own until the end: what is submitted
    meanwhile waits for the next commit, in flight (:class:`_Hold`)."""
    hold = _Hold(store, then_read_only)
    try:
        await hold.running()
        yield
    finally:
        await hold.release()


def _queued(store: Store) -> int:
    """Jobs handed to ``store``'s committer and not started yet."""
    return len(store._running()._jobs)


async def _dialogs(broker: Broker, client: BrokerClient, count: int) -> list[uuid.UUID]:
    """``count`` dialogs S1 -> S2 with one message each, sent in order, ready in Q2 and
    acknowledged (the file is idle); the handles of their target endpoints (each in a
    group of its own), in that order."""
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

    async def settled() -> bool:  # ready, acknowledged: nothing more for the file to do
        return db.ready["Q2"].count == count and not any(ep.outbox for ep in db.endpoints.values())

    await wait_until(settled, 10.0)
    await db.store.wait_idle()
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


@pytest.mark.parametrize("batches", [1, 2])
async def test_a_rollback_counted_while_a_queue_turns_on_counts_from_nothing(
    tmp_path: Path, batches: int
) -> None:
    """SPEC §6: ALTER QUEUE ... STATUS = ON starts the rollback counts of its messages over;
    a transaction rolled back while that is being written counts from nothing, never
    against the counts before, and memory says what the file says (a restart goes on
    from the file's number): whether the count is written in the group commit that
    forgets the counts (``batches`` 1) or in the next one (2)."""
    async with solo_broker(tmp_path, HOSTS[batches]) as broker:
        client = await client_of(broker)
        other = await client_of(broker)
        try:
            (target,) = await _dialogs(broker, client, 1)
            db = broker.databases["Solo"]
            first = await client.begin_transaction()
            assert len(await first.receive("Q2", timeout=5.0)) == 1
            await first.rollback(reason="once")
            item = (target, 1)
            assert db.poison.counts[item].count == 1
            second = await other.begin_transaction()
            assert len(await second.receive("Q2", timeout=5.0)) == 1
            before = _Hold(db.store)
            await before.running()
            turning_on = asyncio.ensure_future(client.alter_queue("Q2", True))

            async def submitted() -> bool:
                return _queued(db.store) == 1

            await wait_until(submitted, 5.0)
            if batches == 2:  # the forgetting batch runs (uncommitted) while the count comes
                beside = _Hold(db.store)
                await wait_until(lambda: _queued_is(db.store, 2), 5.0)
                await before.release()
                await beside.running()
            rolling_back = asyncio.ensure_future(second.rollback(reason="twice"))

            async def counted() -> bool:
                return _queued(db.store) == (1 if batches == 2 else 2)

            await wait_until(counted, 5.0)
            await (beside if batches == 2 else before).release()
            await turning_on
            await rolling_back
            rows = await db.store.query(
                "SELECT rollbacks FROM message_rollbacks WHERE conversation_handle = ?",
                (str(target),),
            )
            in_memory = db.poison.counts.get(item)
            assert [r[0] for r in rows] == [1]
            assert in_memory is not None and in_memory.count == 1
        finally:
            await other.close()
            await client.close()


async def _queued_is(store: Store, jobs: int) -> bool:
    return _queued(store) == jobs


@pytest.mark.parametrize("cleanup", [False, True])
async def test_an_end_that_fails_to_commit_keeps_what_a_rollback_gave_back_meanwhile(
    tmp_path: Path, cleanup: bool
) -> None:
    """SPEC §6, R-DLG-10, R-DLG-1: while END CONVERSATION (or END WITH CLEANUP) commits,
    another transaction that had received a message of the conversation rolls back. The
    END's commit fails: the conversation goes on, and the message is ready again, in
    memory as in the file, not only after a restart."""
    async with solo_broker(tmp_path, HOSTS[3 + cleanup]) as broker:
        client = await client_of(broker)
        other = await client_of(broker)
        try:
            (target,) = await _dialogs(broker, client, 1)
            db = broker.databases["Solo"]
            reader = await other.begin_transaction()
            assert [m.message_body for m in await reader.receive("Q2", timeout=5.0)] == [b"m0"]
            try:
                async with _held(db.store, then_read_only=True):
                    ending = asyncio.ensure_future(client.end_conversation(target, cleanup=cleanup))

                    async def submitted() -> bool:
                        return _queued(db.store) == 1

                    await wait_until(submitted, 5.0)
                    await reader.rollback(reason="the handler failed")
                with pytest.raises(RemoteError):
                    await ending
            finally:
                await read_only(db.store, False)
            got = await client.receive("Q2", timeout=2.0)
            assert [m.message_body for m in got] == [b"m0"]
        finally:
            await other.close()
            await client.close()


async def test_a_move_that_fails_to_commit_leaves_no_message_in_the_group_it_named(
    tmp_path: Path,
) -> None:
    """SPEC §6, R-DLG-1: while MOVE CONVERSATION commits, another transaction's RECEIVE
    must not take the conversation's messages from the group it moves them to: when the
    MOVE's commit fails, the conversation stays whole in its group, and its messages are
    received in order (here a RECEIVE of the conversation gets its first message, then
    the next)."""
    async with solo_broker(tmp_path, HOSTS[5]) as broker:
        client = await client_of(broker)
        other = await client_of(broker)
        try:
            (target,) = await _dialogs(broker, client, 1)
            db = broker.databases["Solo"]
            conversation = db.endpoints[target].conversation_id
            initiator = db.by_key[(conversation, True)].handle
            index = db.ready["Q2"]
            group = uuid.uuid4()
            reader = await other.begin_transaction()
            try:
                async with _held(db.store, then_read_only=True):
                    moving = asyncio.ensure_future(client.move_conversation(target, group))

                    async def submitted() -> bool:
                        return _queued(db.store) == 1

                    await wait_until(submitted, 5.0)
                    receiving = asyncio.ensure_future(reader.receive("Q2"))

                    async def looked() -> bool:
                        return receiving.done() or group in index.locked

                    await wait_until(looked, 5.0)
                with pytest.raises(RemoteError):
                    await moving
                await asyncio.gather(receiving, return_exceptions=True)
            finally:
                await read_only(db.store, False)
                await reader.rollback()
            await client.send(initiator, body=b"m1")
            got = await client.receive("Q2", top=10, timeout=5.0, conversation_handle=target)
            assert [m.message_body for m in got][:1] == [b"m0"]
        finally:
            await other.close()
            await client.close()
