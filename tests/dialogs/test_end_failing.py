"""An END CONVERSATION whose commit fails while the other side's messages commit into
its queue (R-DLG-1, R-DLG-13, SPEC §6): the END is undone, so the conversation goes on,
and every message the queue's file holds is ready to RECEIVE, in order.

The broker runs in this process so that the test can fill its database: SQLite's
``max_page_count`` on the committer's own connection makes a write that needs new pages
fail with SQLITE_FULL, as a full disk does (``tests.disks.limit_pages``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from brokerd.sdk.client import BrokerClient
from brokerd.server.daemon import Broker
from brokerd.tools import example
from brokerd.tools.launcher import Deployment
from protocol.errors import RemoteError
from tests.daemons import FAST_RETRY, assert_exactly_once_in_order, client_of, drain, in_process
from tests.disks import limit_pages

HOST = "127.0.43.6"


async def _attempt(broker: Broker, client: BrokerClient) -> bool:
    """One dialog: a SEND straight into the target's queue and the target's END WITH
    ERROR written together on a full file. False if the store committed neither (the
    two were one group commit): the case is not there to check."""
    store = broker.databases["shop"].store
    handle = await client.begin_dialog(
        example.SHOP_SERVICE, example.WAREHOUSE_SERVICE, example.CONTRACT
    )
    await client.send(handle, example.ORDER, b"1")
    await client.send(handle, example.ORDER, b"\x00" * 9_000)  # frees pages for a small one
    received = await drain(client, "OrderQueue", 2, timeout=10)
    target = received[0].conversation_handle
    await limit_pages(store, 0)
    try:
        # Written together: the SEND is submitted, then the END applied at once.
        sent = client.send_nowait(handle, example.ORDER, b"3")
        ended = asyncio.ensure_future(
            client.end_conversation(target, error_code=5, description="x" * 30_000)
        )
        outcomes = await asyncio.gather(sent, ended, return_exceptions=True)
    finally:
        await limit_pages(store, None)
    if outcomes[0] != 3:
        assert isinstance(outcomes[0], RemoteError), outcomes
        return False
    assert isinstance(outcomes[1], RemoteError) and "full" in str(outcomes[1]), outcomes
    rows = await store.query(
        "SELECT message_sequence_number FROM queue_messages WHERE conversation_handle = ?",
        (str(target),),
    )
    assert [r[0] for r in rows] == [3]
    received += await drain(client, "OrderQueue", 1, timeout=5)
    assert [m.message_body for m in received][2:] == [b"3"]
    await client.send(handle, example.ORDER, b"4")  # the dialog goes on, in order
    received += await drain(client, "OrderQueue", 1, timeout=5)
    assert [m.message_body for m in received][2:] == [b"3", b"4"]
    assert_exactly_once_in_order(received)
    await client.end_conversation(handle, cleanup=True)
    await client.end_conversation(target, cleanup=True)
    return True


async def test_a_direct_send_committed_while_the_targets_failing_end_commits_is_received(
    tmp_path: Path,
) -> None:
    """A SEND goes straight into the target's queue (R-DLG-13) and commits; the target's
    END CONVERSATION WITH ERROR, applied before that commit's callback and committed
    after it, fails (its Error needs pages the full file does not have). The END is
    undone: the message, in the file, must be ready to RECEIVE, not discarded."""
    d = Deployment(tmp_path, retry=FAST_RETRY)
    d.add("solo", HOST, example.two_services_database("shop"))
    async with in_process(d.daemons["solo"].config_path) as broker:
        client = await client_of(broker)
        try:
            checked = 0
            for _ in range(20):  # the two are one group commit now and then
                checked += await _attempt(broker, client)
                if checked >= 2:
                    break
            assert checked, "the SEND never committed apart from the END"
        finally:
            await client.close()
