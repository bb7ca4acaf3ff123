"""Poison-message handling (SPEC §6, R-OBJ-3): rollbacks counted per message, durably; a
queue's ``poison_message_handling`` quarantines one conversation (the others flow),
disables the queue (SQL Server's behaviour) or only counts; a quarantine is released
or ended with an error, and survives a restart. Real daemons, one database: the
initiator ``//solo/S1`` (queue Q1) sends to ``//solo/S2`` (queue Q2)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.tools.launcher import Deployment
from brokerd.traces.writer import read_events, segment_files
from protocol.dialog import ERROR
from protocol.errors import (
    ConversationQuarantined,
    InvalidRequest,
    NotQuarantined,
    QueueDisabled,
)
from tests.daemons import (
    assert_exactly_once_in_order,
    client_of,
    drain,
    in_process,
    solo_daemon,
    solo_database,
    stats_with,
    wait_until,
)

HOST = "127.0.0.61"
IN_PROCESS_HOST = "127.0.0.62"
POISON = b"poison"


class BadOrder(Exception):
    """What the consumer's handler raises on the poison body."""


def solo(
    tmp_path: Path, policy: str
) -> contextlib.AbstractAsyncContextManager[tuple[Deployment, BrokerClient]]:
    """A subprocess daemon of ``solo_database(policy)`` and a client of it."""
    return solo_daemon(tmp_path, HOST, policy)


async def _dialog(client: BrokerClient, *bodies: bytes) -> uuid.UUID:
    """A dialog S1 -> S2 with ``bodies`` sent; returns the initiator's handle."""
    handle = await client.begin_dialog("//solo/S1", "//solo/S2")
    for body in bodies:
        await client.send(handle, "DEFAULT", body)
    return handle


async def _targets(client: BrokerClient, *initiators: uuid.UUID) -> list[uuid.UUID]:
    """The target's handles (Q2's side) of the dialogs begun as ``initiators``."""
    rows = await client.view("conversation_endpoints")
    ids = {r["conversation_handle"]: r["conversation_id"] for r in rows if r["is_initiator"]}
    target = {r["conversation_id"]: r["conversation_handle"] for r in rows if not r["is_initiator"]}
    return [uuid.UUID(target[ids[str(h)]]) for h in initiators]


async def _ready(client: BrokerClient, queue: str, count: int) -> None:
    async def ready() -> bool:
        rows = await client.view("queues")
        return next(r["ready_messages"] for r in rows if r["queue"] == queue) == count

    await wait_until(ready)


async def _roll_back(client: BrokerClient, reason: str, handle: uuid.UUID | None = None) -> int:
    """RECEIVE (of ``handle``'s conversation, if given) in a transaction, then ROLLBACK;
    returns how many messages it had taken."""
    tx = await client.begin_transaction()
    messages = await tx.receive("Q2", top=10, timeout=5, conversation_handle=handle)
    await tx.rollback(reason=reason)
    return len(messages)


async def _quarantined(client: BrokerClient) -> dict[str, object]:
    """The one row of the ``quarantined`` view, once there is one."""

    async def one() -> bool:
        return len(await client.view("quarantined")) == 1

    await wait_until(one)
    (row,) = await client.view("quarantined")
    return row


async def _receive_in_order(client: BrokerClient, count: int) -> list[ReceivedMessage]:
    """RECEIVE ``count`` messages of Q2 in transactions, committed."""
    out: list[ReceivedMessage] = []
    while len(out) < count:
        async with client.transaction() as tx:
            out += await tx.receive("Q2", top=10, timeout=5)
    return out


async def test_a_poison_message_quarantines_its_conversation_while_the_others_flow(
    tmp_path: Path,
) -> None:
    """A consumer that raises on one body: after 3 rollbacks its conversation is set aside
    with the error, and the 100 other conversations' 200 messages are each committed
    exactly once; the view, the counters and the trace record it."""
    async with solo(tmp_path, "poison_rollbacks = 3") as (deployment, client):
        handles = [await _dialog(client, b"order %d/1" % n, b"order %d/2" % n) for n in range(50)]
        poisoned = await _dialog(client, POISON, b"after the poison")
        handles += [
            await _dialog(client, b"order %d/1" % n, b"order %d/2" % n) for n in range(50, 100)
        ]
        await _ready(client, "Q2", 202)
        poisoned, *handles = await _targets(client, poisoned, *handles)

        committed: Counter[tuple[uuid.UUID, int]] = Counter()
        failures = 0
        while sum(committed.values()) < 200:
            try:
                async with client.transaction() as tx:
                    messages = await tx.receive("Q2", top=10, timeout=2)
                    for m in messages:
                        if m.message_body == POISON:
                            raise BadOrder("cannot parse the order")
            except BadOrder:
                failures += 1
                continue
            committed.update((m.conversation_handle, m.message_sequence_number) for m in messages)
            assert failures <= 3, "a quarantined conversation was handed out again"

        assert failures == 3
        assert set(committed.values()) == {1}
        assert {h for h, _ in committed} == set(handles)
        row = await _quarantined(client)
        assert row["conversation_handle"] == str(poisoned)
        assert row["message_sequence_number"] == 1
        assert row["message_type"] == "DEFAULT"
        assert row["rollbacks"] == 3
        assert row["last_error"] == "BadOrder: cannot parse the order"
        assert row["messages_set_aside"] == 2
        (typed,) = await client.quarantined()
        assert typed.conversation_handle == poisoned and typed.rollbacks == 3
        assert await client.receive("Q2", timeout=0.2) == []
        with pytest.raises(ConversationQuarantined):
            await client.receive("Q2", conversation_handle=poisoned)
        stats = await stats_with(client, "rollbacks_counted", "poison_")
        assert stats["rollbacks_counted"] == 6  # both of its messages, three times
        assert stats["poison_quarantined"] == 1
        (queue,) = [r for r in await client.view("queues") if r["queue"] == "Q2"]
        assert queue["quarantined_conversations"] == 1
        assert queue["poison_message_handling"] == "quarantine"
        set_aside = [m for m in await client.queue_messages("Q2") if m.quarantined]
        assert [(m.conversation_handle, m.status) for m in set_aside] == [(poisoned, 1)] * 2

        deployment.stop("solo")  # flushes the trace
        events = list(read_events(segment_files([deployment.daemons["solo"].directory])))
        quarantined = [e for e in events if e["event"] == "quarantined"]
        assert len(quarantined) == 1
        assert quarantined[0]["seq"] == 1 and quarantined[0]["rollbacks"] == 3
        assert quarantined[0]["reason"] == "BadOrder: cannot parse the order"
        assert sum(e["event"] == "rolled_back" for e in events) == 6


async def test_release_makes_it_receivable_in_order_and_end_tells_the_far_side(
    tmp_path: Path,
) -> None:
    async with solo(tmp_path, "poison_rollbacks = 3") as (_, client):
        first = await _dialog(client, POISON, b"two", b"three")
        await _ready(client, "Q2", 3)
        (first,) = await _targets(client, first)
        for n in range(3):
            assert await _roll_back(client, f"attempt {n}", first) == 3
        row = await _quarantined(client)
        assert row["last_error"] == "attempt 2" and row["messages_set_aside"] == 3

        assert await client.release_quarantine(first) == 3
        assert await client.view("quarantined") == []
        messages = await _receive_in_order(client, 3)
        assert [m.message_body for m in messages] == [POISON, b"two", b"three"]
        assert [m.message_sequence_number for m in messages] == [1, 2, 3]
        with pytest.raises(NotQuarantined):
            await client.release_quarantine(first)

        second = await _dialog(client, POISON)
        await _ready(client, "Q2", 1)
        (second,) = await _targets(client, second)
        for _ in range(3):
            await _roll_back(client, "bad order", second)
        await _quarantined(client)
        await client.end_quarantined(second, 4711, "this order cannot be read")
        assert await client.view("quarantined") == []
        (error,) = await drain(client, "Q1", 1)
        assert error.message_type_name == ERROR
        assert b"<Code>4711</Code>" in error.message_body
        stats = await stats_with(client, "poison_")
        assert stats["poison_released"] == 1 and stats["poison_ended"] == 1


async def test_disable_turns_the_queue_off_and_alter_queue_on_loses_nothing(
    tmp_path: Path,
) -> None:
    """SQL Server's POISON_MESSAGE_HANDLING (STATUS = ON): the queue goes off; turned on
    again, every message is received, in order, and the count starts over."""
    policy = 'poison_message_handling = "disable"\npoison_rollbacks = 3'
    async with solo(tmp_path, policy) as (_, client):
        poisoned = await _dialog(client, POISON, b"after")
        others = {await _dialog(client, b"%d/1" % n, b"%d/2" % n): n for n in range(5)}
        await _ready(client, "Q2", 12)
        poisoned, *targets = await _targets(client, poisoned, *others)
        for _ in range(3):
            await _roll_back(client, "bad", poisoned)
        with pytest.raises(QueueDisabled):
            await client.receive("Q2")
        (queue,) = [r for r in await client.view("queues") if r["queue"] == "Q2"]
        assert queue["status"] == "off"
        assert (await stats_with(client, "poison_queues"))["poison_queues_disabled"] == 1

        await client.alter_queue("Q2", True)
        await _roll_back(client, "bad again", poisoned)  # counts from 0 again: 1 of 3
        (queue,) = [r for r in await client.view("queues") if r["queue"] == "Q2"]
        assert queue["status"] == "on"
        messages = await _receive_in_order(client, 12)
        per = assert_exactly_once_in_order(messages)
        assert set(per) == {poisoned, *targets}
        assert all(len(seqs) == 2 for seqs in per.values())


async def test_off_counts_and_hands_the_message_out_again(tmp_path: Path) -> None:
    """POISON_MESSAGE_HANDLING (STATUS = OFF): no action; the (N+3)th RECEIVE has it."""
    policy = 'poison_message_handling = "off"\npoison_rollbacks = 3'
    async with solo(tmp_path, policy) as (_, client):
        await _dialog(client, POISON)
        await _ready(client, "Q2", 1)
        for _ in range(5):
            assert await _roll_back(client, "still bad") == 1
        (message,) = await client.receive("Q2", timeout=5)  # the sixth hand-out
        assert message.message_body == POISON
        assert await client.view("quarantined") == []
        assert (await stats_with(client, "rollbacks_counted"))["rollbacks_counted"] == 5


async def test_the_count_and_the_quarantine_survive_kill_9(tmp_path: Path) -> None:
    """Two rollbacks, kill -9, a third (a client that goes away mid-transaction) quarantines;
    the quarantine survives another kill -9, and release then loses nothing."""
    async with solo(tmp_path, "poison_rollbacks = 3") as (deployment, client):
        poisoned = await _dialog(client, POISON, b"second")
        await _ready(client, "Q2", 2)
        (poisoned,) = await _targets(client, poisoned)
        for _ in range(2):
            await _roll_back(client, "bad")
        await client.close()
        deployment.kill("solo")
        await asyncio.to_thread(deployment.start, "solo")

        leaving = await deployment.daemons["solo"].client()
        tx = await leaving.begin_transaction()
        assert len(await tx.receive("Q2", top=10, timeout=5)) == 2
        await leaving.close()  # mid-transaction: rolled back, and counted
        client = await deployment.daemons["solo"].client()
        row = await _quarantined(client)
        assert row["rollbacks"] == 3
        assert row["last_error"] == "the client's connection was lost"
        await client.close()

        deployment.kill("solo")
        await asyncio.to_thread(deployment.start, "solo")
        client = await deployment.daemons["solo"].client()
        try:
            row = await _quarantined(client)
            assert row["conversation_handle"] == str(poisoned) and row["rollbacks"] == 3
            assert row["messages_set_aside"] == 2
            assert await client.receive("Q2", timeout=0.3) == []
            assert await client.release_quarantine(poisoned) == 2
            messages = await _receive_in_order(client, 2)
            assert [m.message_body for m in messages] == [POISON, b"second"]
        finally:
            await client.close()


def _brokerctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "brokerd.admin.ctl", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


async def test_brokerctl_lists_releases_and_ends_quarantines(tmp_path: Path) -> None:
    async with solo(tmp_path, "poison_rollbacks = 1") as (deployment, client):
        config = str(deployment.daemons["solo"].config_path)
        initiators = [await _dialog(client, POISON, b"next") for _ in range(2)]
        await _ready(client, "Q2", 4)
        released, ended = await _targets(client, *initiators)
        for handle in (released, ended):
            await _roll_back(client, "unreadable", handle)

        listed = await asyncio.to_thread(_brokerctl, "--config", config, "quarantined", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)
        assert {r["conversation_handle"] for r in rows} == {str(released), str(ended)}
        assert {r["last_error"] for r in rows} == {"unreadable"}
        table = await asyncio.to_thread(_brokerctl, "--config", config, "quarantined")
        assert "last_error" in table.stdout and "unreadable" in table.stdout

        done = await asyncio.to_thread(
            _brokerctl, "--config", config, "quarantine", "release", str(released)
        )
        assert done.returncode == 0, done.stderr
        assert "2 message(s) receivable again" in done.stdout
        missing = await asyncio.to_thread(
            _brokerctl, "--config", config, "quarantine", "end", str(ended)
        )
        assert missing.returncode == 2 and "--error-code" in missing.stderr
        done = await asyncio.to_thread(
            _brokerctl,
            "--config",
            config,
            "quarantine",
            "end",
            str(ended),
            "--error-code",
            "42",
            "--description",
            "unreadable order",
        )
        assert done.returncode == 0, done.stderr
        again = await asyncio.to_thread(
            _brokerctl, "--config", config, "quarantine", "release", str(released)
        )
        assert again.returncode == 2 and "not quarantined" in again.stderr
        bad = await asyncio.to_thread(
            _brokerctl, "--config", config, "quarantine", "release", "nonsense"
        )
        assert bad.returncode == 2 and "not a conversation handle" in bad.stderr
        assert await client.view("quarantined") == []
        messages = await _receive_in_order(client, 2)
        assert [m.message_body for m in messages] == [POISON, b"next"]
        (error,) = await drain(client, "Q1", 1)
        assert error.message_type_name == ERROR and b"<Code>42</Code>" in error.message_body


async def test_a_rollback_reason_is_bounded_and_a_refused_one_leaves_the_transaction_open(
    tmp_path: Path,
) -> None:
    async with solo(tmp_path, "poison_rollbacks = 2") as (_, client):
        await _dialog(client, POISON)
        await _ready(client, "Q2", 1)
        tx = await client.begin_transaction()
        assert len(await tx.receive("Q2", timeout=5)) == 1
        too_long = {"op": "rollback", "transaction": tx.id, "reason": "x" * 4001}
        with pytest.raises(InvalidRequest, match="at most 4000 characters"):
            await client._call(too_long)  # what the SDK never sends: it cuts the reason
        await tx.rollback(reason="y" * 5000)  # still open; the SDK cuts it to 4000
        await _roll_back(client, "second")
        row = await _quarantined(client)
        assert row["rollbacks"] == 2 and row["last_error"] == "second"


HOLD = 2.0
"""Seconds the committer is kept busy while a lost connection's rollback is counted."""


async def test_a_quarantine_shows_in_the_views_only_once_its_file_holds_it(
    tmp_path: Path,
) -> None:
    """A rollback nobody waits for (a client's connection lost mid-transaction) sets the
    message's conversation aside at once, but the ``quarantined`` and ``queues`` views
    show it only once its row is in the database file: what they show, a kill -9 a moment
    later does not undo (SPEC §6). The committer is held busy by a job of its own while the
    count waits to be written."""
    daemon = Deployment(tmp_path).add(
        "solo", IN_PROCESS_HOST, solo_database("poison_rollbacks = 1")
    )
    async with in_process(daemon.config_path) as broker:
        client = await client_of(broker)
        leaving = await client_of(broker)
        try:
            await _dialog(client, POISON)
            await _ready(client, "Q2", 1)
            tx = await leaving.begin_transaction()
            assert len(await tx.receive("Q2", top=10, timeout=5)) == 1
            store = broker.databases["Solo"].store
            hold = asyncio.ensure_future(store.run(lambda _: time.sleep(HOLD)))
            await leaving.close()  # mid-transaction: rolled back, counted, quarantined

            async def shown() -> bool:
                rows = await client.view("quarantined")
                if not rows:
                    return False
                in_file = sqlite3.connect(store.path)
                try:
                    (count,) = in_file.execute(
                        "SELECT count(*) FROM quarantined_conversations"
                    ).fetchone()
                finally:
                    in_file.close()
                assert count == 1, "the view showed a quarantine its file did not hold"
                return True

            await wait_until(shown)
            assert hold.done()
            (queue,) = [r for r in await client.view("queues") if r["queue"] == "Q2"]
            assert queue["quarantined_conversations"] == 1
        finally:
            await client.close()
            await leaving.close()
