"""A client transaction's COMMIT whose connection is lost before its answer (SPEC §6,
outcomes).

The SDK writes the requests of one turn of the event loop together, at the turn's end.
A connection lost before then leaves the COMMIT made in that turn unwritten: the daemon
never read it and rolled the transaction back with the connection, so the transaction is
lost (``TransactionLost``), not of unknown outcome. A COMMIT written before the loss may
have been read and committed: its outcome is unknown (``OutcomeUnknown``).

A real daemon runs in the test's process on 127.0.52.1; the client's socket is reset
under it (``abort``: the connection goes without a goodbye, as when the daemon's host
drops it).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.sdk.transaction import Transaction
from protocol.errors import OutcomeUnknown, TransactionLost
from tests.daemons import client_of, solo_broker

HOST = "127.0.52.1"


async def _transaction_with_a_send(client: BrokerClient) -> Transaction:
    dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
    tx = await client.begin_transaction()
    await tx.send(dialog.handle, "DEFAULT", b"<only-if-committed/>")
    return tx


def _reset(client: BrokerClient) -> None:
    """The client's socket goes now, before the end of this turn of the event loop."""
    connection = client._keeper.connection
    assert connection is not None and connection.transport is not None
    connection.transport.abort()


async def test_a_commit_lost_before_it_was_written_is_a_lost_transaction(
    tmp_path: Path,
) -> None:
    """SPEC §6 (outcomes): the connection goes in the turn the COMMIT was made, before it
    was written: ``TransactionLost`` (nothing of the transaction took effect), and after
    reconnecting nothing of it is in the queue."""
    async with solo_broker(tmp_path, HOST) as broker:
        client = await client_of(broker)
        try:
            tx = await _transaction_with_a_send(client)
            committing = asyncio.ensure_future(tx.commit())
            await asyncio.sleep(0)  # the COMMIT is made; it is written at the turn's end
            _reset(client)
            with pytest.raises(TransactionLost):
                await asyncio.wait_for(committing, 5)
            assert await client.receive("Q2", timeout=0.3) == []
            assert client.reconnects == 1
        finally:
            await client.close()


async def test_a_commit_written_before_the_loss_has_an_unknown_outcome(tmp_path: Path) -> None:
    """SPEC §6 (outcomes): the connection goes after the COMMIT was written, before its
    answer: the daemon may have committed, so ``OutcomeUnknown``."""
    async with solo_broker(tmp_path, HOST) as broker:
        client = await client_of(broker)
        try:
            tx = await _transaction_with_a_send(client)
            committing = asyncio.ensure_future(tx.commit())
            await asyncio.sleep(0)  # the COMMIT is made
            await asyncio.sleep(0)  # and written, at the end of that turn
            _reset(client)
            with pytest.raises(OutcomeUnknown):
                await asyncio.wait_for(committing, 5)
        finally:
            await client.close()


async def test_a_send_lost_before_it_was_written_is_written_again_once(tmp_path: Path) -> None:
    """SPEC §6 (outcomes): a SEND without an idempotency key made in the turn the socket
    went was never read by the daemon: it is written again on the next connection, not
    failed with ``OutcomeUnknown``, and its message arrives once (R-DLG-1)."""
    async with solo_broker(tmp_path, HOST) as broker:
        client = await client_of(broker)
        try:
            dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
            sending = asyncio.ensure_future(dialog.send("DEFAULT", b"<sent-once/>"))
            await asyncio.sleep(0)  # the SEND is made; it is written at the turn's end
            _reset(client)
            assert await asyncio.wait_for(sending, 5) == 1
            (message,) = await client.receive("Q2", top=10, timeout=1.0)
            assert message.message_body == b"<sent-once/>"
            assert await client.receive("Q2", top=10, timeout=0.3) == []
        finally:
            await client.close()
