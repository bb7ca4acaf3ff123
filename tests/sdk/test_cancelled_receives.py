"""A RECEIVE the application stopped waiting for (its task cancelled, ``asyncio.wait_for``
timing out) takes no message for nobody.

SPEC §6: RECEIVE outside a transaction is at most once for what it *returns*; R-DLG-1
says each message reaches the application exactly once. The SDK takes a cancelled
RECEIVE back (``withdraw``): the daemon ends it with nothing if it has taken nothing
yet. If it had, outside a transaction its messages come first from the next RECEIVE of
the queue; inside one, the transaction can only roll back, and they are in their queue
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from brokerd.config import load_config
from brokerd.dialogs.endpoints.ready import ReadyIndex
from brokerd.sdk.client import BrokerClient
from brokerd.sdk.messages import KeptMessages, ReceivedMessage
from brokerd.server.daemon import Broker
from brokerd.tools.launcher import Deployment
from protocol.errors import TransactionRolledBack
from tests.daemons import SOLO_DATABASE, client_of, in_process, solo_broker


def _ready_index(broker: Broker) -> ReadyIndex:
    return next(iter(broker.engine.directory.databases.values())).ready["Q2"]


async def _until(check: Callable[[], bool], interval: float = 0.005) -> None:
    """Wait until ``check()`` holds, looking every ``interval`` s (0: every turn of the
    loop, to catch a state that lasts a few turns); fail after 5 s."""
    deadline = asyncio.get_running_loop().time() + 5
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in 5 s")
        await asyncio.sleep(interval)


async def _cancelled(receiving: asyncio.Task[object]) -> None:
    receiving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await receiving


async def test_a_cancelled_receive_takes_no_message_that_arrives_later(tmp_path: Path) -> None:
    """R-DLG-1, SPEC §6 (RECEIVE): a RECEIVE cancelled by the application while it waits
    leaves the next message to the next RECEIVE."""
    async with solo_broker(tmp_path, "127.0.0.1") as broker:
        client = await client_of(broker)
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(client.receive("Q2", timeout=5), 0.3)
        await dialog.send("DEFAULT", b"after the cancel")
        got = await client.receive("Q2", timeout=8)
        await client.close()
        assert [m.message_body for m in got] == [b"after the cancel"]


async def test_a_withdrawn_receive_ends_at_once_with_nothing(tmp_path: Path) -> None:
    """SPEC §6 (RECEIVE, GET CONVERSATION GROUP): the daemon ends a withdrawn WAITFOR at
    once (its waiter is gone from the queue), and a later RECEIVE waits as ever."""
    async with solo_broker(tmp_path, "127.0.0.1") as broker:
        client = await client_of(broker)
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        index = _ready_index(broker)
        for _ in range(3):
            receiving = asyncio.create_task(client.receive("Q2", timeout=60))
            grouping = asyncio.create_task(client.get_conversation_group("Q2", timeout=60))
            await _until(lambda: index.waiting == 2)
            await _cancelled(receiving)
            await _cancelled(grouping)
            await _until(lambda: index.waiting == 0)  # withdrawn: at once, not in 60 s
        await dialog.send("DEFAULT", b"one")
        got = await client.receive("Q2", timeout=5)
        await client.close()
        assert [m.message_body for m in got] == [b"one"]


async def _exactly_once(client: BrokerClient, sent: list[bytes], got: list[bytes]) -> None:
    while len(got) < len(sent):
        more = await client.receive("Q2", top=100, timeout=5)
        assert more, f"missing: {sent[len(got) :]}"
        got += [m.message_body for m in more]
    assert got == sent  # each once, in order
    assert await client.receive("Q2", timeout=0) == []


async def test_cancelled_receives_lose_and_repeat_nothing(tmp_path: Path) -> None:
    """R-DLG-1: receives cancelled at every moment around a message's arrival (before
    it, as it is taken, after it): every message is received once, in order, whether the
    cancelled RECEIVE was withdrawn in time or had taken it."""
    async with solo_broker(tmp_path, "127.0.0.1") as broker:
        client = await client_of(broker)
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        sent: list[bytes] = []
        got: list[bytes] = []
        for n in range(40):
            receiving = asyncio.create_task(client.receive("Q2", top=10, timeout=30))
            await asyncio.sleep(0.005)
            body = b"message %d" % n
            await dialog.send("DEFAULT", body)
            sent.append(body)
            for _ in range(n % 4):  # cancel later and later after the SEND
                await asyncio.sleep(0)
            await _cancelled(receiving)
            if receiving.cancelled():
                continue
            got += [m.message_body for m in receiving.result()]  # it had answered first
        await _exactly_once(client, sent, got)
        await client.close()


async def test_a_transaction_whose_receive_was_cancelled_after_taking_rolls_back(
    tmp_path: Path,
) -> None:
    """R-DLG-1, SPEC §6 (transactions): a RECEIVE in a transaction cancelled after it had
    taken messages leaves the transaction nothing to commit but a rollback: COMMIT
    raises TransactionRolledBack and the messages are received again, once, in order."""
    async with solo_broker(tmp_path, "127.0.0.1") as broker:
        client = await client_of(broker)
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        sent: list[bytes] = []
        got: list[bytes] = []
        spoiled = 0
        for n in range(30):
            tx = await client.begin_transaction()
            receiving = asyncio.create_task(tx.receive("Q2", top=10, timeout=30))
            await asyncio.sleep(0.005)
            body = b"message %d" % n
            await dialog.send("DEFAULT", body)
            sent.append(body)
            for _ in range(n % 4):
                await asyncio.sleep(0)
            await _cancelled(receiving)
            taken = [] if receiving.cancelled() else receiving.result()
            try:
                await tx.commit()
            except TransactionRolledBack as exc:
                assert "cancelled after it had taken" in str(exc) and tx.spoiled
                spoiled += 1
            else:
                got += [m.message_body for m in taken]
            received = await client.receive("Q2", top=10, timeout=0)
            got += [m.message_body for m in received]
        await _exactly_once(client, sent, got)
        await client.close()
        assert 0 < spoiled < 30  # both ways were taken: withdrawn in time, and too late


async def test_kept_messages_come_before_newer_ones_a_receive_in_flight_took(
    tmp_path: Path,
) -> None:
    """R-DLG-1, SPEC §6 (RECEIVE: one group, in sequence order): a RECEIVE written before
    the messages of a cancelled one came back (kept) must not hand the application the
    conversation's later messages before them."""
    async with solo_broker(tmp_path, "127.0.0.1") as broker:
        client = await client_of(broker)
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        index = _ready_index(broker)
        first = asyncio.create_task(client.receive("Q2", timeout=30))
        await _until(lambda: index.waiting == 1)
        sending = asyncio.create_task(dialog.send("DEFAULT", b"one"))
        await _until(lambda: index.locked, 0)  # the daemon's RECEIVE took "one"
        first.cancel()  # too late to withdraw: "one" is kept when it comes back
        second = asyncio.create_task(client.receive("Q2", timeout=30))
        with contextlib.suppress(asyncio.CancelledError):
            await first
        assert first.cancelled(), "the RECEIVE had answered before its cancel"
        await sending
        await _until(lambda: index.waiting == 1)
        await dialog.send("DEFAULT", b"two")
        got = [m.message_body for m in await second]
        got += [m.message_body for m in await client.receive("Q2", top=10, timeout=1)]
        await client.close()
        assert got == [b"one", b"two"]


async def test_a_withdraw_written_again_after_a_graceful_stop_takes_back_no_other_receive(
    tmp_path: Path,
) -> None:
    """SPEC §6 (outcomes): a ``withdraw`` the stopping daemon never read names its RECEIVE
    by its id on the old connection; written again on the new connection, it must not
    take back whichever request has that id there (a RECEIVE that should wait)."""
    daemon = Deployment(tmp_path).add("solo", "127.0.0.1", SOLO_DATABASE)
    broker = Broker(load_config(daemon.config_path))
    await broker.start()
    client = await client_of(broker)
    try:
        index = _ready_index(broker)
        cancelled = asyncio.create_task(client.receive("Q2", timeout=60))  # request 2
        await _until(lambda: index.waiting == 1)
        for session in list(broker.client_sessions):
            session.stop_reading()  # SIGTERM: the daemon reads nothing more
        other = asyncio.create_task(client.receive("Q2", timeout=60))  # never read
        cancelled.cancel()  # its withdraw: never read either
        with contextlib.suppress(asyncio.CancelledError):
            await cancelled
        await broker.stop()
        async with in_process(daemon.config_path) as again:
            await client.wait_connected(10)
            # on the new connection "other" is request 2, the one the withdraw names
            await _until(lambda: _ready_index(again).waiting == 1 or other.done())
            assert not other.done(), f"taken back on the new connection: {other.result()}"
            dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
            await dialog.send("DEFAULT", b"for the other")
            got = await asyncio.wait_for(other, 10)
            assert [m.message_body for m in got] == [b"for the other"]
    finally:
        await client.close()


async def test_rollbacks_of_cancelled_receives_do_not_make_a_message_poison(
    tmp_path: Path,
) -> None:
    """SPEC §6 (poison messages: a rollback counts against a message when it may be the
    message's fault): a transaction whose RECEIVE the application cancelled after it had
    taken a message rolls back at COMMIT; the message, which no caller ever saw, must not
    be quarantined after ``poison_rollbacks`` (5) such cancellations."""
    async with solo_broker(tmp_path, "127.0.0.1") as broker:
        client = await client_of(broker)
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        await dialog.send("DEFAULT", b"innocent")
        index = _ready_index(broker)
        for _ in range(5):
            tx = await client.begin_transaction()
            receiving = asyncio.create_task(tx.receive("Q2", timeout=30))
            await _until(lambda: index.locked, 0)  # the daemon's RECEIVE took it
            await _cancelled(receiving)
            assert receiving.cancelled(), "the RECEIVE had answered before its cancel"
            with pytest.raises(TransactionRolledBack):
                await tx.commit()
            await _until(lambda: not index.locked)
        quarantined = await client.view("quarantined")
        got = await client.receive("Q2", timeout=1)
        await client.close()
        assert quarantined == []
        assert [m.message_body for m in got] == [b"innocent"]


def test_kept_messages_come_group_after_group() -> None:
    """SPEC §6 (a RECEIVE of several groups returns them group after group, each in
    order): kept messages of two groups taken in turn, then a newer one of the first,
    come back as the first group's, then the second's; a RECEIVE of one group takes only
    the oldest group's, and ``top`` leaves the rest kept, in order."""
    one, two = uuid.uuid4(), uuid.uuid4()

    def message(gid: uuid.UUID, seq: int) -> ReceivedMessage:
        return ReceivedMessage(gid, gid, seq, "//s", "DEFAULT", "DEFAULT", b"%d" % seq, "Q2", 0.0)

    kept = KeptMessages()
    kept.add("Q2", None, [message(one, 1), message(two, 1)])
    kept.add("Q2", None, [message(one, 2)])
    both = kept.take("Q2", None, 10, None, None, 2)
    assert [(m.conversation_group_id, m.message_sequence_number) for m in both] == [
        (one, 1),
        (one, 2),
        (two, 1),
    ]
    kept.add("Q2", None, [message(one, 3), message(two, 2), message(one, 4)])
    first = kept.take("Q2", None, 1, None, None, 1)
    assert [(m.conversation_group_id, m.message_sequence_number) for m in first] == [(one, 3)]
    rest = kept.take("Q2", None, 10, None, two, 1)
    assert [m.message_sequence_number for m in rest] == [2]
    assert [m.message_sequence_number for m in kept.take("Q2", None, 10, None, None, 1)] == [4]
    assert kept.take("Q2", None, 10, None, None, 1) == []
