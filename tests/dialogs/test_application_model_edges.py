"""The application model with real daemons (SPEC §6, R-DLG-12, R-OBJ-3, §5): a queue
turned off (by ALTER QUEUE or by poison-message handling) hands nothing out, also to a
RECEIVE or GET CONVERSATION GROUP that was already waiting; a quarantined conversation
that ends leaves no quarantine behind in the views.

One subprocess daemon (real TCP, real SQLite files) holds the database ``Solo``:
``//solo/S1`` (queue ``Q1``) begins dialogs to ``//solo/S2`` (queue ``Q2``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from pathlib import Path

from brokerd.sdk.client import BrokerClient, ReceivedMessage, Transaction
from brokerd.tools.launcher import Deployment
from protocol.dialog import ERROR
from protocol.errors import QueueDisabled
from tests.daemons import FAST_RETRY, solo_daemon, wait_until

HOST = "127.0.0.1"
S1, S2 = "//solo/S1", "//solo/S2"


def solo(
    tmp_path: Path, policy: str = "", extra: str = ""
) -> contextlib.AbstractAsyncContextManager[tuple[Deployment, BrokerClient]]:
    """A subprocess daemon of ``solo_database(policy)`` and a client of it."""
    return solo_daemon(tmp_path, HOST, policy, extra, FAST_RETRY)


async def _another(deployment: Deployment) -> BrokerClient:
    return await deployment.daemons["solo"].client()


async def _queue(client: BrokerClient, name: str) -> dict[str, object]:
    (row,) = [r for r in await client.view("queues") if r["queue"] == name]
    return row


async def _ready(client: BrokerClient, queue: str, count: int) -> None:
    async def ready() -> bool:
        return (await _queue(client, queue))["ready_messages"] == count

    await wait_until(ready)


async def _readers_waiting(client: BrokerClient, queue: str) -> None:
    async def waiting() -> bool:
        readers = (await _queue(client, queue))["readers"]
        return isinstance(readers, int) and readers >= 1

    await wait_until(waiting)


async def _target_of(client: BrokerClient, initiator: uuid.UUID) -> uuid.UUID:
    rows = await client.view("conversation_endpoints")
    cid = next(r["conversation_id"] for r in rows if r["conversation_handle"] == str(initiator))
    return uuid.UUID(
        next(
            r["conversation_handle"]
            for r in rows
            if r["conversation_id"] == cid and not r["is_initiator"]
        )
    )


# -- a queue that is off hands nothing out (R-DLG-12) -------------------------------------


async def test_a_waiting_receive_takes_nothing_from_a_queue_turned_off(tmp_path: Path) -> None:
    """R-DLG-12, R-OBJ-3: while a queue is off, messages that arrive for it are stored and
    acknowledged but not receivable. A RECEIVE that began waiting before ALTER QUEUE
    STATUS = OFF must not hand out a message that arrives while the queue is off."""
    async with solo(tmp_path) as (deployment, client):
        reader = await _another(deployment)
        try:
            waiting = asyncio.create_task(reader.receive("Q2", top=10, timeout=4))
            await _readers_waiting(client, "Q2")
            await client.alter_queue("Q2", False)
            dialog = await client.begin_dialog(S1, S2)
            await client.send(dialog.handle, "DEFAULT", b"arrives while Q2 is off")
            try:
                got = await waiting
            except QueueDisabled:
                got = []
            assert [m.message_body for m in got] == [], "a disabled queue handed out a message"
            # it is still there, and receivable once the queue is on again
            await client.alter_queue("Q2", True)
            (m,) = await client.receive("Q2", timeout=5)
            assert m.message_body == b"arrives while Q2 is off"
        finally:
            await reader.close()


async def test_a_waiting_get_conversation_group_finds_nothing_in_a_queue_turned_off(
    tmp_path: Path,
) -> None:
    """SPEC §6 (GET CONVERSATION GROUP checks the queue first; a disabled one is
    ``queue_disabled``), R-DLG-12: a GET CONVERSATION GROUP that waits while the queue is
    turned off must not hand out (and lock) a group of messages that are not receivable."""
    async with solo(tmp_path) as (deployment, client):
        reader = await _another(deployment)
        try:
            tx = await reader.begin_transaction()
            waiting = asyncio.create_task(tx.get_conversation_group("Q2", timeout=4))
            await _readers_waiting(client, "Q2")
            await client.alter_queue("Q2", False)
            dialog = await client.begin_dialog(S1, S2)
            await client.send(dialog.handle, "DEFAULT", b"arrives while Q2 is off")
            try:
                group = await waiting
            except QueueDisabled:
                group = None
            assert group is None, "a disabled queue handed out a conversation group"
            await tx.rollback()
        finally:
            await reader.close()


async def test_disable_by_poison_handling_stops_a_reader_already_waiting(tmp_path: Path) -> None:
    """SPEC §6 poison messages, ``disable``: SQL Server's behaviour, the queue's status
    becomes off once a message reaches ``poison_rollbacks`` (R-DLG-12). A second reader
    that was already waiting in a RECEIVE on the queue must not be handed the poison
    message the moment the rollback turns the queue off."""
    policy = 'poison_message_handling = "disable"\npoison_rollbacks = 1'
    async with solo(tmp_path, policy) as (deployment, client):
        other = await _another(deployment)
        try:
            dialog = await client.begin_dialog(S1, S2)
            await client.send(dialog.handle, "DEFAULT", b"poison")
            await _ready(client, "Q2", 1)
            tx = await client.begin_transaction()
            (m,) = await tx.receive("Q2", timeout=5)
            assert m.message_body == b"poison"
            waiting = asyncio.create_task(other.receive("Q2", top=10, timeout=4))
            await _readers_waiting(client, "Q2")
            await tx.rollback(reason="cannot parse it")
            try:
                got = await waiting
            except QueueDisabled:
                got = []
            assert (await _queue(client, "Q2"))["status"] == "off"
            assert [m.message_body for m in got] == [], (
                "the queue was disabled by poison-message handling, yet a waiting RECEIVE "
                "took the poison message from it"
            )
        finally:
            await other.close()


# -- a quarantine ends with its conversation (SPEC §6, §5) --------------------------------


async def _quarantine_one(client: BrokerClient) -> tuple[uuid.UUID, uuid.UUID]:
    """A dialog S1 -> S2 whose one message is rolled back once (Q2 quarantines after 1):
    the initiator's and the target's handles, once the quarantine shows."""
    dialog = await client.begin_dialog(S1, S2)
    await client.send(dialog.handle, "DEFAULT", b"poison")
    await _ready(client, "Q2", 1)
    tx = await client.begin_transaction()
    assert len(await tx.receive("Q2", timeout=5)) == 1
    await tx.rollback(reason="bad")
    assert (await _queue(client, "Q2"))["quarantined_conversations"] == 1
    return dialog.handle, await _target_of(client, dialog.handle)


async def test_end_with_cleanup_of_a_quarantined_conversation_ends_its_quarantine(
    tmp_path: Path,
) -> None:
    """SPEC §6 (a quarantine is listed in the ``queues`` view's count and in /metrics),
    §5 (an endpoint removed goes with every row of its conversation): END CONVERSATION
    WITH CLEANUP of a quarantined conversation removes it, so its queue no longer counts
    a quarantined conversation."""
    async with solo(tmp_path, "poison_rollbacks = 1") as (_, client):
        _, target = await _quarantine_one(client)
        await client.end_conversation(target, cleanup=True)
        assert await client.view("quarantined") == []
        assert (await _queue(client, "Q2"))["quarantined_conversations"] == 0


async def test_a_quarantined_conversation_ended_on_both_sides_leaves_no_quarantine(
    tmp_path: Path,
) -> None:
    """SPEC §6 (a quarantine ends with END CONVERSATION WITH ERROR of it), §5 (a closed
    endpoint is removed with every row of its conversation): the target ends its
    quarantined conversation WITH ERROR by the ordinary verb, the initiator receives the
    Error and ends too; once the closed endpoints are gone the queue counts no
    quarantined conversation."""
    keep = "[limits]\nclosed_endpoint_keep = 1\n"
    async with solo(tmp_path, "poison_rollbacks = 1", extra=keep) as (_, client):
        initiator, target = await _quarantine_one(client)
        await client.end_conversation(target, error_code=500, description="unreadable")
        (error,) = await client.receive("Q1", timeout=5)
        assert error.conversation_handle == initiator
        await client.end_conversation(initiator)

        async def both_gone() -> bool:
            rows = await client.view("conversation_endpoints")
            return not rows

        await wait_until(both_gone)
        assert await client.view("quarantined") == []
        assert (await _queue(client, "Q2"))["quarantined_conversations"] == 0


async def test_end_with_error_by_the_ordinary_verb_ends_the_quarantine_at_once(
    tmp_path: Path,
) -> None:
    """SPEC §6: a quarantine ends by END CONVERSATION WITH ERROR of it. The ordinary verb
    does what ``end_quarantined`` does: the quarantine is over as soon as it answers, not
    once the closed endpoint is removed (up to ``closed_endpoint_keep`` later)."""
    async with solo(tmp_path, "poison_rollbacks = 1") as (_, client):
        initiator, target = await _quarantine_one(client)
        await client.end_conversation(target, error_code=500, description="unreadable")
        assert await client.view("quarantined") == []
        assert (await _queue(client, "Q2"))["quarantined_conversations"] == 0
        (error,) = await client.receive("Q1", timeout=5)
        assert error.conversation_handle == initiator


# -- a DialogTimer and an Error go ahead of the messages waiting (R-DLG-10) ---------------


async def test_a_timer_that_fires_while_its_messages_are_held_goes_ahead_after_a_rollback(
    tmp_path: Path,
) -> None:
    """R-DLG-10, R-DLG-11: a DialogTimer is received before the dialog's other waiting
    messages. A transaction holds the conversation's two messages when its timer fires;
    it rolls back, so both wait again: the next RECEIVE gives the DialogTimer first,
    then the two messages in sequence order."""
    async with solo(tmp_path) as (_, client):
        dialog = await client.begin_dialog(S1, S2)
        await client.send(dialog.handle, "DEFAULT", b"one")
        await client.send(dialog.handle, "DEFAULT", b"two")
        await _ready(client, "Q2", 2)
        target = await _target_of(client, dialog.handle)
        tx = await client.begin_transaction()
        assert len(await tx.receive("Q2", top=10, timeout=5)) == 2
        await client.begin_conversation_timer(target, 0)
        await _ready(client, "Q2", 1)  # the DialogTimer, behind the group's lock
        await tx.rollback()
        got = await client.receive("Q2", top=10, timeout=5)
        assert [m.is_timer for m in got] == [True, False, False], [
            (m.message_type_name, m.message_body) for m in got
        ]
        assert [m.message_body for m in got[1:]] == [b"one", b"two"]


async def test_a_lifetime_error_while_messages_are_held_goes_ahead_after_a_rollback(
    tmp_path: Path,
) -> None:
    """R-DLG-9, R-DLG-10: when a dialog's lifetime passes, an Error is put in the queue,
    and an Error is received before the dialog's other waiting messages. A transaction
    holds the conversation's two messages when the lifetime passes and rolls back: the
    next RECEIVE gives the Error first."""
    async with solo(tmp_path) as (_, client):
        dialog = await client.begin_dialog(S1, S2, lifetime=3)
        await client.send(dialog.handle, "DEFAULT", b"one")
        await client.send(dialog.handle, "DEFAULT", b"two")
        await _ready(client, "Q2", 2)
        tx = await client.begin_transaction()
        assert len(await tx.receive("Q2", top=10, timeout=5)) == 2
        await _ready(client, "Q2", 1)  # the Error, behind the group's lock
        await tx.rollback()
        got = await client.receive("Q2", top=10, timeout=5)
        assert [m.message_type_name for m in got[:1]] == [ERROR], [
            (m.message_type_name, m.message_body) for m in got
        ]


# -- END CONVERSATION WITH CLEANUP (SPEC §6, §5) ------------------------------------------


async def test_end_with_cleanup_of_a_target_is_not_counted_as_a_closed_endpoint_kept(
    tmp_path: Path,
) -> None:
    """SPEC §5 (a target keeps its *closed* endpoint ``closed_endpoint_keep`` seconds),
    SPEC §6 (WITH CLEANUP: local only): an endpoint removed WITH CLEANUP is gone at once,
    so the ``stats`` view counts no closed target endpoint kept for it."""
    async with solo(tmp_path) as (_, client):
        dialog = await client.begin_dialog(S1, S2)
        await client.send(dialog.handle, "DEFAULT", b"request")
        (request,) = await client.receive("Q2", timeout=5)
        await client.end_conversation(request.conversation_handle, cleanup=True)
        rows = await client.view("conversation_endpoints")
        assert [r["is_initiator"] for r in rows] == [True]
        (stats,) = await client.view("stats")
        assert stats["closed_targets_kept"] == 0


# -- external activation (SPEC §6, Decision on activation) --------------------------------

READER = """
import os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
time.sleep(120)
"""


async def test_stopping_the_daemon_stops_an_activated_command_run_through_a_shell(
    tmp_path: Path,
) -> None:
    """SPEC §6 (external activation): when the daemon stops, every instance of the
    command gets SIGTERM, and SIGKILL after ``stop_grace`` seconds. An instance is the
    command the daemon started, here a shell line that runs the reader and then logs its
    exit: once the daemon has stopped, the reader it ran is not left running."""
    script = tmp_path / "reader.py"
    script.write_text(READER)
    pid_file = tmp_path / "reader.pid"
    line = f"{sys.executable} {script} {pid_file}; echo reader exited"
    policy = (
        f'activation = {{ command = ["sh", "-c", "{line}"], max_instances = 1, '
        "interval = 0.5, stop_grace = 2 }"
    )
    pid = 0
    try:
        async with solo(tmp_path, policy) as (deployment, client):
            dialog = await client.begin_dialog(S1, S2)
            await client.send(dialog.handle, "DEFAULT", b"wake a reader")

            async def started() -> bool:
                return pid_file.exists() and pid_file.read_text() != ""

            await wait_until(started)
            pid = int(pid_file.read_text())
            await client.close()
            deployment.stop("solo")
        await asyncio.sleep(1.0)
        stat = Path(f"/proc/{pid}/stat")
        alive = stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        assert not alive, "the activated reader outlived the daemon that started it"
    finally:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# -- internal activation (SPEC §6, Decision on activation) --------------------------------


async def test_serve_adds_no_reader_for_one_old_message_that_one_reader_drains(
    tmp_path: Path,
) -> None:
    """SPEC §6 (internal activation): a reader is added while the wait of each batch's
    oldest message grew by more than a tenth of the interval since the last interval
    that received; waits are compared with each other, never with the application's
    clock alone, so that the skew between the two clocks cancels. One message that has
    waited a while, handled at once by the first reader while nothing else arrives, is
    no growing wait: ``serve`` keeps one reader."""
    async with solo(tmp_path) as (_, client):
        dialog = await client.begin_dialog(S1, S2)
        await client.send(dialog.handle, "DEFAULT", b"one order, sent a while ago")
        await _ready(client, "Q2", 1)
        await asyncio.sleep(1.5)

        async def handler(tx: Transaction, messages: list[ReceivedMessage]) -> None:
            return None

        activation = client.serve("Q2", handler, max_readers=4, top=10, timeout=2.0, interval=0.2)
        task = asyncio.ensure_future(activation.run())

        async def handled() -> bool:
            return activation.handled == 1

        await wait_until(handled, timeout=10)
        await asyncio.sleep(1.0)
        activation.stop.set()
        await asyncio.wait_for(task, 10)
        assert activation.peak_readers == 1, (
            f"{activation.peak_readers} readers for one message that one reader drained"
        )


HOLDER = """
import asyncio, os, signal, sys
from brokerd.sdk.client import BrokerClient

async def main() -> None:
    if os.path.exists(sys.argv[1]):
        return  # started again after the restart: leaves the message to the test
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # holds its batch until the SIGKILL
    env = os.environ
    client = await BrokerClient.connect(
        env["BROKERD_HOST"], int(env["BROKERD_PORT"]), token_file=env["BROKERD_TOKEN_FILE"],
        user=env.get("BROKERD_USER", "app"),
    )
    tx = await client.begin_transaction()
    messages = await tx.receive(env["BROKERD_QUEUE"], top=1, timeout=5)
    with open(sys.argv[1], "w") as f:
        f.write(str(len(messages)))
    await asyncio.sleep(120)

asyncio.run(main())
"""


async def test_an_activated_command_killed_by_a_graceful_stop_counts_no_rollback(
    tmp_path: Path,
) -> None:
    """SPEC §6 (poison messages): a daemon stopping gracefully puts messages back without
    counting them, its activated commands' included. Here the command holds a message
    in its transaction and ignores SIGTERM, so the stop SIGKILLs it after ``stop_grace``
    and its connection is lost: with ``poison_rollbacks = 1`` one counted rollback would
    quarantine the conversation. After the restart the message is receivable."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    held = tmp_path / "held"
    policy = (
        'poison_rollbacks = 1\npoison_message_handling = "quarantine"\n'
        f'activation = {{ command = ["{sys.executable}", "{script}", "{held}"], '
        "max_instances = 1, interval = 0.5, stop_grace = 1 }"
    )
    async with solo(tmp_path, policy) as (deployment, client):
        dialog = await client.begin_dialog(S1, S2)
        await client.send(dialog.handle, "DEFAULT", b"an order")

        async def holding() -> bool:
            return held.exists() and held.read_text() == "1"

        await wait_until(holding, timeout=20)
        await client.close()
        deployment.stop("solo")  # SIGTERM: the command is SIGKILLed after its grace
        deployment.start("solo")
        again = await _another(deployment)
        try:
            assert await again.view("quarantined") == []
            (message,) = await again.receive("Q2", top=1, timeout=5)
            assert message.message_body == b"an order"
        finally:
            await again.close()
