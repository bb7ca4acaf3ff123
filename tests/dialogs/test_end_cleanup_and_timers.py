"""A conversation's life after it starts: its endings in a client transaction, and its
timer and lifetime (SPEC §6; R-DLG-9, R-DLG-10, R-DLG-11).

Real daemons of one database (``//solo/S1`` talks to ``//solo/S2``, both in ``Solo``) on
127.0.0.132 to 127.0.0.137, port 4022: in a process of their own, or in this process
(``Broker``, as ``brokerd run`` builds it) where the test looks at what one holds.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from protocol.errors import TransactionRolledBack
from tests.daemons import client_of, drain, solo_broker, solo_daemon

HOST_A = "127.0.0.132"


async def test_a_rolled_back_end_with_cleanup_leaves_the_conversation(tmp_path: Path) -> None:
    """SPEC §6: the verbs of a client transaction take effect together or not at all. A
    transaction that ends a conversation WITH CLEANUP and then has a verb refused at its
    COMMIT rolls back: the conversation is still there, in memory as in its file, and goes
    on."""
    async with solo_daemon(tmp_path, HOST_A) as (_, client):
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        await client.send(dialog.handle, body=b"one")
        (first,) = await drain(client, "Q2", 1, timeout=10)
        tx = await client.begin_transaction()
        await tx.end_conversation(dialog.handle, cleanup=True)
        await tx.send(dialog.handle, body=b"refused at COMMIT: the conversation ended")
        with pytest.raises(TransactionRolledBack):
            await tx.commit()
        rows = await client.view("conversation_endpoints")
        assert str(dialog.handle) in {r["conversation_handle"] for r in rows}
        await client.send(dialog.handle, body=b"two")
        (second,) = await drain(client, "Q2", 1, timeout=10)
        assert second.conversation_handle == first.conversation_handle
        assert second.message_sequence_number == 2


HOST_B = "127.0.0.135"


async def test_timers_set_again_and_again_hold_no_memory_for_each(tmp_path: Path) -> None:
    """R-DLG-11, R-DLG-9: a new timer replaces the conversation's current one. A timer
    reset at every message (an idle timeout) on a dialog with a lifetime holds what one
    timer and one lifetime hold, not one entry for each timer ever set until the lifetime
    passes."""
    async with solo_broker(tmp_path, HOST_B) as broker:
        client = await client_of(broker)
        try:
            dialog = await client.begin_dialog("//solo/S1", "//solo/S2", lifetime=3600)
            for _ in range(30):
                await asyncio.gather(
                    *(client.begin_conversation_timer(dialog.handle, 3600) for _ in range(100))
                )
            held = len(broker.engine.deadlines._heap)
            assert held <= 1100, f"{held} deadlines held for one dialog's timer and lifetime"
            ep = broker.databases["Solo"].endpoints[dialog.handle]
            due = ep.timer_due
            await client.begin_conversation_timer(dialog.handle, 0.2)
            (fired,) = await drain(client, "Q1", 1, timeout=10)
            assert fired.is_timer and ep.timer_due == 0.0 and due > time.time() + 3000
        finally:
            await client.close()


HOST_C = "127.0.0.136"


async def test_end_with_error_drops_a_send_of_its_own_transaction(tmp_path: Path) -> None:
    """SPEC §6, R-DLG-10: END CONVERSATION WITH ERROR drops the messages still waiting to be
    sent, and the Error ends the dialog. A SEND earlier in the same transaction waits to be
    sent when the END runs: it is dropped with the others, never delivered, and never
    received after the Error."""
    async with solo_daemon(tmp_path, HOST_C) as (_, client):
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        await client.send(dialog.handle, body=b"first")
        (first,) = await drain(client, "Q2", 1, timeout=10)
        tx = await client.begin_transaction()
        await tx.send(dialog.handle, body=b"second, dropped by the error")
        await tx.end_conversation(dialog.handle, error_code=7, description="given up")
        await tx.commit()
        arrived = await drain(client, "Q2", 1, timeout=10)
        arrived += await client.receive("Q2", top=10, timeout=1.0)
        assert [m.message_body for m in arrived if not m.is_error] == []
        assert [m.conversation_handle for m in arrived] == [first.conversation_handle]
        assert await client.view("transmission_queue") == []


HOST_D = "127.0.0.137"


async def test_a_timer_whose_message_fails_to_commit_fires_when_the_file_takes_it(
    tmp_path: Path,
) -> None:
    """R-DLG-11: when a conversation timer fires, a DialogTimer message goes to its side's
    queue. Its commit failing (another process holds the file's lock past the busy
    timeout) does not lose it: it fires again once the file takes writes, once."""
    async with solo_broker(tmp_path, HOST_D) as broker:
        client = await client_of(broker)
        try:
            dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
            await client.begin_conversation_timer(dialog.handle, 1.0)
            lock = sqlite3.connect(broker.databases["Solo"].store.path, isolation_level=None)
            lock.execute("BEGIN IMMEDIATE")  # the file's writers wait, then fail
            try:
                await asyncio.sleep(7)  # fired at 1 s; its commit failed after a 5 s wait
            finally:
                lock.execute("ROLLBACK")
                lock.close()
            (fired,) = await drain(client, "Q1", 1, timeout=10)
            assert fired.is_timer and fired.conversation_handle == dialog.handle
            assert await client.receive("Q1", timeout=2.0) == []
        finally:
            await client.close()
