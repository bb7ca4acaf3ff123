"""Internal activation in the SDK (``BrokerClient.serve``, SPEC §6 Decision on activation):
readers added while the oldest waiting message waits longer than an interval before, up
to ``max_readers``, released when idle; each batch in a client transaction, a raising
handler rolled back without stopping the others; readers that go on across a daemon
restart. Real daemon: ``Solo`` on 127.0.0.1:4022, ``//solo/S1`` (Q1) sends to
``//solo/S2`` (Q2), whose queue is served; the daemon's ``queues`` view counts the
readers it sees (RECEIVEs waiting, groups held)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from brokerd.sdk.client import BrokerClient, ReceivedMessage, Reconnect, Transaction
from brokerd.tools.launcher import Deployment
from tests.daemons import SOLO_DATABASE, assert_exactly_once_in_order, drain, running, wait_until

QUICK = Reconnect(initial=0.05, maximum=0.5, give_up_after=60)


async def _queue_row(client: BrokerClient, queue: str) -> dict[str, object]:
    (row,) = [r for r in await client.view("queues") if r["queue"] == queue]
    return row


async def _load(client: BrokerClient, dialogs: int, per_dialog: int) -> list[uuid.UUID]:
    """``dialogs`` conversations S1 -> S2 with ``per_dialog`` messages each, sent
    round-robin (``"n k"``: the k-th message of conversation n)."""
    handles = [(await client.begin_dialog("//solo/S1", "//solo/S2")).handle for _ in range(dialogs)]
    for k in range(per_dialog):
        await client.send_many([(h, "DEFAULT", f"{n} {k}".encode()) for n, h in enumerate(handles)])
    return handles


async def test_serve_grows_to_max_readers_under_load_and_shrinks_when_idle(
    tmp_path: Path,
) -> None:
    """2,000 messages on 50 conversations, a handler that sleeps 20 ms a batch: the
    readers grow from one to ``max_readers`` (the daemon sees them too), every message
    is handled once and in order per conversation, a handler that raises once for one
    message has its batch rolled back and handled again while the others go on; idle,
    the readers go back to one."""
    d = Deployment(tmp_path)
    d.add("solo", "127.0.0.1", SOLO_DATABASE)
    with running(d):
        client = await d.daemons["solo"].client(reconnect=QUICK)
        await _load(client, 50, 40)
        handled: list[ReceivedMessage] = []
        raised: list[bytes] = []

        async def handler(tx: Transaction, messages: list[ReceivedMessage]) -> None:
            poison = next((m for m in messages if m.message_body == b"7 5"), None)
            if poison is not None and not raised:
                raised.append(poison.message_body)
                raise ValueError("cannot handle 7 5 the first time")
            await asyncio.sleep(0.02)
            handled.extend(messages)

        stop = asyncio.Event()
        activation = client.serve(
            "Q2",
            handler,
            max_readers=4,
            top=10,
            timeout=0.3,
            interval=0.2,
            idle_receives=2,
            stop=stop,
        )
        running_task = asyncio.ensure_future(activation.run())
        seen_by_daemon = 0

        async def all_handled() -> bool:
            nonlocal seen_by_daemon
            readers = (await _queue_row(client, "Q2"))["readers"]
            assert isinstance(readers, int)
            seen_by_daemon = max(seen_by_daemon, readers)
            return activation.handled == 2000

        await wait_until(all_handled, timeout=60, interval=0.05)
        assert activation.peak_readers == 4
        assert seen_by_daemon >= 2, "the queues view never showed more than one reader"
        assert activation.failures == 1 and raised == [b"7 5"]
        assert_exactly_once_in_order(handled)
        assert len(handled) == 2000 and len({m.message_body for m in handled}) == 2000

        async def idle() -> bool:
            return activation.readers == 1

        await wait_until(idle, timeout=10)

        async def one_reader_at_the_daemon() -> bool:
            return (await _queue_row(client, "Q2"))["readers"] == 1

        await wait_until(one_reader_at_the_daemon, timeout=10, interval=0.01)
        assert (await _queue_row(client, "Q2"))["ready_messages"] == 0
        stop.set()
        assert await asyncio.wait_for(running_task, 10) == 2000
        assert activation.readers == 0
        await client.close()


async def test_serve_goes_on_across_a_daemon_restart(tmp_path: Path) -> None:
    """The daemon is stopped (SIGTERM) while readers hold batches, and started again: the
    readers wait for the client to reconnect and go on. Each batch replies to its
    messages in the same transaction, so the replies show that every message was
    committed exactly once, also those whose batch the stop rolled back."""
    d = Deployment(tmp_path)
    d.add("solo", "127.0.0.1", SOLO_DATABASE)
    with running(d):
        client = await d.daemons["solo"].client(reconnect=QUICK)
        await _load(client, 10, 30)
        calls = 0

        async def handler(tx: Transaction, messages: list[ReceivedMessage]) -> None:
            nonlocal calls
            calls += len(messages)
            for m in messages:
                await tx.send(m.conversation_handle, "DEFAULT", m.message_body)
            await asyncio.sleep(0.05)

        activation = client.serve("Q2", handler, max_readers=3, top=5, timeout=0.3, interval=0.2)
        running_task = asyncio.ensure_future(activation.run())

        async def under_way() -> bool:
            return activation.handled >= 50

        await wait_until(under_way, timeout=30)
        await asyncio.to_thread(d.stop, "solo")
        assert activation.handled < 300
        await asyncio.sleep(0.3)
        await asyncio.to_thread(d.start, "solo")

        async def all_handled() -> bool:
            return activation.handled == 300

        await wait_until(all_handled, timeout=60)
        assert client.reconnects >= 1
        replies = await drain(client, "Q1", 300, timeout=30)
        assert sorted(m.message_body for m in replies) == sorted(
            f"{n} {k}".encode() for n in range(10) for k in range(30)
        )
        assert_exactly_once_in_order(replies)
        assert calls >= 300
        activation.stop.set()
        assert await asyncio.wait_for(running_task, 10) == 300
        await client.close()


async def test_a_handler_that_always_fails_on_one_message_has_it_quarantined(
    tmp_path: Path,
) -> None:
    """A handler that raises on every attempt at one message: each rollback carries the
    exception as its reason, the daemon quarantines that conversation after
    ``poison_rollbacks`` (5) rollbacks, and the readers handle every other message."""
    d = Deployment(tmp_path)
    d.add("solo", "127.0.0.1", SOLO_DATABASE)
    with running(d):
        client = await d.daemons["solo"].client(reconnect=QUICK)
        await _load(client, 10, 10)
        handled: list[ReceivedMessage] = []

        async def handler(tx: Transaction, messages: list[ReceivedMessage]) -> None:
            if any(m.message_body == b"3 2" for m in messages):
                raise ValueError("cannot handle 3 2")
            handled.extend(messages)

        activation = client.serve("Q2", handler, max_readers=2, top=1, timeout=0.2)
        running_task = asyncio.ensure_future(activation.run())

        async def the_others_handled() -> bool:
            return activation.handled == 92  # all but "3 2" and the 7 behind it

        await wait_until(the_others_handled, timeout=60)
        (quarantined,) = await client.quarantined()
        assert quarantined.message_sequence_number == 3 and quarantined.messages_set_aside == 8
        assert quarantined.rollbacks == 5 and activation.failures == 5
        assert quarantined.last_error == "ValueError: cannot handle 3 2"
        assert_exactly_once_in_order(handled)
        activation.stop.set()
        assert await asyncio.wait_for(running_task, 10) == 92
        await client.close()


async def test_serve_until_idle_ends_while_its_queue_is_off(tmp_path: Path) -> None:
    """R-DLG-12: nothing is received from a queue that is off. A reader whose RECEIVE is
    refused so (``queue_disabled``) is as idle as one whose RECEIVE came back empty, so
    ``serve(until_idle=True)``, an activated program, ends instead of retrying for ever;
    the messages wait for the queue to be turned on."""
    d = Deployment(tmp_path)
    d.add("solo", "127.0.0.1", SOLO_DATABASE)
    with running(d):
        client = await d.daemons["solo"].client()
        await _load(client, 2, 3)
        await client.alter_queue("Q2", False)
        handled: list[bytes] = []

        async def handler(tx: Transaction, messages: list[ReceivedMessage]) -> None:
            handled.extend(m.message_body for m in messages)

        activation = client.serve("Q2", handler, timeout=0.2, interval=0.2, until_idle=True)
        assert await asyncio.wait_for(activation.run(), 20) == 0
        assert handled == []
        await client.alter_queue("Q2", True)
        assert len(await drain(client, "Q2", 6, timeout=10)) == 6
        await client.close()
