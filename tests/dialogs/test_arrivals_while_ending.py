"""The other side's messages that arrive while this side's END CONVERSATION commits
(R-DLG-1, R-DLG-5, R-DLG-10, SPEC §6): nothing is acknowledged that the END's outcome
could still make receivable, so an END that fails to commit loses nothing.

One daemon of two databases (``shop`` and ``warehouse``: two files, so the shop's
messages reach the warehouse through the transmission queue and the local link, and are
acknowledged as between brokers), run in the test's process so that the test can hold
the warehouse's committer inside the END's group commit and make that commit fail as on
a full disk: SQLite's ``max_page_count`` on the committer's own connection, then a write
that needs more pages (SQLITE_FULL).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from pathlib import Path

import pytest

from brokerd.dialogs.endpoints.states import State
from brokerd.errors import StoreError
from brokerd.sdk.client import BrokerClient
from brokerd.sdk.dialog import Dialog
from brokerd.server.daemon import Broker
from brokerd.storage.store import Store
from brokerd.tools import example
from brokerd.tools.launcher import Deployment
from protocol.dialog import END_DIALOG
from protocol.errors import RemoteError
from tests.daemons import (
    FAST_RETRY,
    assert_exactly_once_in_order,
    client_of,
    drain,
    in_process,
    wait_until,
)

HOSTS = ["127.0.53.1", "127.0.53.2"]
SHOP, WAREHOUSE = example.SHOP_SERVICE, example.WAREHOUSE_SERVICE


class _InCommit:
    """A job of ``store`` that waits inside its group commit until :meth:`release`; with
    ``full``, it then makes that commit fail as on a full disk (every job of the batch
    fails with SQLITE_FULL; the file's limit is lifted again for the next batch)."""

    def __init__(self, store: Store, full: bool) -> None:
        self.full = full
        self.inside, self.released = threading.Event(), threading.Event()

        def wait(conn: sqlite3.Connection) -> None:
            self.inside.set()
            self.released.wait(10)
            if not full:
                return
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages}")
            try:
                conn.execute("CREATE TABLE ballast (b BLOB)")
                conn.execute("INSERT INTO ballast VALUES (zeroblob(1000000))")
            finally:
                conn.execute("PRAGMA max_page_count = 1073741823")

        self.job = store.submit((), fn=wait, wait=True)

    async def running(self) -> None:
        assert await asyncio.to_thread(self.inside.wait, 10)

    async def release(self) -> None:
        self.released.set()
        assert self.job is not None
        if self.full:
            with pytest.raises(StoreError, match="full"):
                await self.job
        else:
            await self.job


def _queued(store: Store) -> int:
    """Jobs handed to ``store``'s committer and not started yet."""
    return len(store._running()._jobs)


async def _true(value: bool) -> bool:
    return value


async def _quiet(broker: Broker) -> None:
    """Wait until every message sent has been acknowledged and both files are idle."""

    async def acknowledged() -> bool:
        return not any(
            ep.outbox or ep.backlog
            for db in broker.databases.values()
            for ep in db.endpoints.values()
        )

    await wait_until(acknowledged, 10.0)
    for db in broker.databases.values():
        await db.store.wait_idle()


async def _arrives_while_ending(
    broker: Broker, client: BrokerClient, initiator: Dialog, target: uuid.UUID, full: bool
) -> asyncio.Future[None]:
    """The warehouse's END of ``target`` applied, and its commit held in flight (one group
    commit with an :class:`_InCommit`); meanwhile the shop's message ``b"2"`` arrives.
    Then the commit ends (failing as on a full disk with ``full``): the END's outcome."""
    store = broker.databases["warehouse"].store
    await _quiet(broker)
    arrived = broker.engine.stats.fragments_received
    before = _InCommit(store, full=False)  # what is submitted meanwhile is one batch
    await before.running()
    ending = asyncio.ensure_future(client.end_conversation(target))
    await wait_until(lambda: _true(_queued(store) == 1), 5.0)
    with_end = _InCommit(store, full)
    await wait_until(lambda: _true(_queued(store) == 2), 5.0)
    await before.release()
    await with_end.running()
    await client.send(initiator, example.ORDER, b"2")
    await wait_until(lambda: _true(broker.engine.stats.fragments_received > arrived), 5.0)
    await with_end.release()
    return ending


async def test_a_message_arriving_while_a_failing_end_commits_is_received(
    tmp_path: Path,
) -> None:
    """R-DLG-5, R-DLG-1, R-DLG-10: the warehouse ENDs its side; while that END's commit is
    in flight, the shop's next message arrives. The END's commit fails (a full disk): the
    conversation goes on, so that message, acknowledged or not, must be received, and
    the dialog stays exactly once and in order."""
    d = Deployment(tmp_path, retry=FAST_RETRY)
    d.add("solo", HOSTS[0], example.shop_database(None) + example.warehouse_database(None))
    async with in_process(d.daemons["solo"].config_path) as broker:
        client = await client_of(broker)
        try:
            initiator = await client.begin_dialog(SHOP, WAREHOUSE, example.CONTRACT)
            await client.send(initiator, example.ORDER, b"1")
            received = await drain(client, "OrderQueue", 1, timeout=10)
            target = received[0].conversation_handle
            ending = await _arrives_while_ending(broker, client, initiator, target, full=True)
            with pytest.raises(RemoteError, match="full"):
                await ending
            received += await drain(client, "OrderQueue", 1, timeout=10)
            assert [m.message_body for m in received] == [b"1", b"2"]
            await client.send(initiator, example.ORDER, b"3")  # the dialog goes on, in order
            received += await drain(client, "OrderQueue", 1, timeout=10)
            assert [m.message_body for m in received] == [b"1", b"2", b"3"]
            assert_exactly_once_in_order(received)
        finally:
            await client.close()


async def test_a_message_arriving_while_an_end_commits_is_discarded_and_acknowledged(
    tmp_path: Path,
) -> None:
    """R-DLG-10, R-DLG-5: the same, and the END commits: the message is never received on
    the side that ended, it is acknowledged (its sender's transmission queue empties),
    and the dialog closes on both sides once the shop ends it too."""
    d = Deployment(tmp_path, retry=FAST_RETRY)
    d.add("solo", HOSTS[1], example.shop_database(None) + example.warehouse_database(None))
    async with in_process(d.daemons["solo"].config_path) as broker:
        client = await client_of(broker)
        try:
            initiator = await client.begin_dialog(SHOP, WAREHOUSE, example.CONTRACT)
            await client.send(initiator, example.ORDER, b"1")
            (first,) = await drain(client, "OrderQueue", 1, timeout=10)
            target = first.conversation_handle
            ending = await _arrives_while_ending(broker, client, initiator, target, full=False)
            await ending
            (end,) = await drain(client, "ClientQueue", 1, timeout=10)
            assert end.message_type_name == END_DIALOG
            await client.end_conversation(initiator)

            async def acknowledged() -> bool:
                return await client.view("transmission_queue") == []

            await wait_until(acknowledged, 10.0)
            warehouse = broker.databases["warehouse"]

            async def closed() -> bool:
                ep = warehouse.endpoints.get(target)
                return ep is not None and ep.state is State.CLOSED

            await wait_until(closed, 10.0)
            assert await client.receive("OrderQueue", timeout=0) == []
        finally:
            await client.close()
