"""The application model after a failed write (SPEC §6, R-DLG-1, R-OBJ-3): a database whose
receive-side write fails reloads what its queues hold from its file; the messages a
client transaction holds at that moment stay that transaction's, and are neither handed
out twice nor counted ready.

The daemon runs in this process (``Broker``, as ``brokerd run`` builds it) so that the
test can make its database's writes fail: SQLite's ``max_page_count`` on the committer's
own connection makes every write that needs a new page fail with SQLITE_FULL, as a full
disk does. One database, ``Solo``: ``//solo/S1`` (queue ``Q1``) talks to ``//solo/S2``
(queue ``Q2``), inside the database (direct delivery, R-DLG-13)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokerd.dialogs.endpoints.database import Database
from brokerd.sdk.client import BrokerClient, Dialog, Transaction
from protocol.errors import RemoteError
from tests.daemons import client_of, solo_broker, wait_until
from tests.disks import limit_pages

HOST = "127.0.0.213"
S1, S2 = "//solo/S1", "//solo/S2"
BIG = 30_000
"""Bytes of a body that needs new pages of the file (more than a page, stored in its row)."""


async def _ready_messages(client: BrokerClient, queue: str) -> int:
    (row,) = [r for r in await client.view("queues") if r["queue"] == queue]
    count = row["ready_messages"]
    assert isinstance(count, int)
    return count


async def _fail_a_write(client: BrokerClient, db: Database, dialog: Dialog) -> None:
    """A SEND whose commit fails for want of room; the database reloads what it received
    from its file (its arrivals refused meanwhile), and has room again afterwards."""
    await limit_pages(db.store, 0)
    with pytest.raises(RemoteError):
        await client.send(dialog, "DEFAULT", bytes(BIG))
    assert db.rx_suspended

    async def reloaded() -> bool:
        return not db.rx_suspended

    await wait_until(reloaded)
    await limit_pages(db.store, None)


@contextlib.asynccontextmanager
async def _held_through_a_reload(
    tmp_path: Path,
) -> AsyncIterator[tuple[BrokerClient, Transaction, Dialog]]:
    """A daemon whose ``Q2`` held one message, ``first``, which a transaction received
    (not committed) before a failed write made the database reload its queues; its
    client, that transaction and the message's dialog."""
    async with solo_broker(tmp_path, HOST) as broker:
        client = await client_of(broker)
        try:
            dialog = await client.begin_dialog(S1, S2)
            await client.send(dialog, "DEFAULT", b"first")
            tx = await client.begin_transaction()
            held = await tx.receive("Q2", top=10, timeout=5)
            assert [m.message_body for m in held] == [b"first"]
            await _fail_a_write(client, broker.databases["Solo"], dialog)
            yield client, tx, dialog
        finally:
            await client.close()


async def test_a_message_held_by_a_transaction_through_a_reload_is_received_once(
    tmp_path: Path,
) -> None:
    """R-DLG-1, SPEC §6: a transaction holds a message (RECEIVE, not yet committed) while
    its database reloads its queues after a failed write. The message is still the
    transaction's: once the transaction rolls back, it is received exactly once, not
    twice."""
    async with _held_through_a_reload(tmp_path) as (client, tx, _):
        await tx.rollback(reason="the handler failed")
        again = await client.receive("Q2", top=10, timeout=2)
        assert [(m.message_sequence_number, m.message_body) for m in again] == [(1, b"first")]
        assert await client.receive("Q2", top=10, timeout=0.3) == []


async def test_a_message_committed_after_a_reload_is_not_handed_out_again(
    tmp_path: Path,
) -> None:
    """R-DLG-1, R-OBJ-3: a transaction that received a message commits after its database
    reloaded its queues; the message has left the queue, and the queue shows nothing
    ready (no phantom that a reader, or an external activation, would wait on)."""
    async with _held_through_a_reload(tmp_path) as (client, tx, dialog):
        await tx.commit()
        assert await _ready_messages(client, "Q2") == 0
        assert await client.receive("Q2", top=10, timeout=0.3) == []
        await client.send(dialog, "DEFAULT", b"second")
        after = await client.receive("Q2", top=10, timeout=2)
        assert [(m.message_sequence_number, m.message_body) for m in after] == [(2, b"second")]
