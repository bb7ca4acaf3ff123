"""The ``transmission_queue`` view a page at a time when a queue that is off holds many
messages (SPEC R-PROTO-4, Decision; R-DLG-12): a page reads the held rows it may show,
not every one of them, and paging through the view still shows each once, in order.
The admin port's summary of it (R-OPS-1) reads the totals and the few oldest held rows
it lists, and shows what the full view shows.

The daemon runs in the test's process on 127.0.24.5:4022 (real TCP and SQLite), so that
the test can ask its engine for a page's rows directly.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from brokerd.dialogs.verbs.paging import PageRequest
from brokerd.sdk.client import BrokerClient
from brokerd.server.client_views import encode_page
from brokerd.server.daemon import Broker
from tests.daemons import client_of, solo_broker, wait_until

HOST = "127.0.24.5"
S1, S2 = "//solo/S1", "//solo/S2"
KEY = ("database", "conversation_handle", "message_sequence_number")

SCRAPE_LISTED = 50
"""Rows the admin port's summary lists."""


async def _hold(broker: Broker, client: BrokerClient, held: int, body: bytes) -> None:
    """``held`` messages sent to the queue Q2, which is off: once the others are
    acknowledged, only these held rows are left in the transmission queue."""
    await client.alter_queue("Q2", False)
    handles = [await client.begin_dialog(S1, S2) for _ in range(4)]
    for handle in handles:
        await client.send_many([(handle, "DEFAULT", body) for _ in range(held // len(handles))])
    verbs = broker.engine.conversation_verbs

    async def acknowledged() -> bool:  # only the held rows are left
        return len(await verbs.transmission_queue()) == held

    await wait_until(acknowledged, 30)


async def test_a_page_reads_only_the_held_rows_it_may_show(tmp_path: Path) -> None:
    """4,000 messages held for the queue Q2, which is off: the rows gathered for a page of
    10 are a few more than 10, not 4,000 (a page's memory and time bounded whatever is
    held), and pages of 500 list every held message once, in key order."""
    held = 4_000
    async with solo_broker(tmp_path, HOST) as broker:
        client = await client_of(broker)
        try:
            await _hold(broker, client, held, b"x")
            verbs = broker.engine.conversation_verbs
            request = PageRequest("", 10)
            rows = await verbs.transmission_queue(request)
            assert len(rows) <= 2 * (request.limit + 1)
            _, count, cursor = encode_page(rows, KEY, request)
            assert count == 10 and cursor is not None
            second = PageRequest(cursor, 10)
            assert len(await verbs.transmission_queue(second)) <= 2 * (second.limit + 1)
            keys: list[tuple[str, int]] = []
            after: str | None = None
            while True:
                page, after = await client.view_page("transmission_queue", after, 500)
                keys += [(r["conversation_handle"], r["message_sequence_number"]) for r in page]
                if after is None:
                    break
            assert keys == sorted(keys) and len(set(keys)) == held
        finally:
            await client.close()


async def test_a_scrape_reads_only_the_held_rows_it_lists(tmp_path: Path) -> None:
    """4,000 messages held for the queue Q2, which is off: the summary counts them all and
    lists the 50 oldest rows of the full view, while what it allocates is a few rows'
    worth, not the 4,000 rows' (a scrape's memory and time bounded whatever is held)."""
    held = 4_000
    async with solo_broker(tmp_path, HOST) as broker:
        client = await client_of(broker)
        try:
            await _hold(broker, client, held, b"x" * 100)
            verbs = broker.engine.conversation_verbs
            full = await verbs.transmission_queue()
            tracemalloc.start()
            try:
                summary = await verbs.transmission_backlog(SCRAPE_LISTED)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak < 500_000, f"a scrape allocated {peak} bytes for {held} held rows"
            assert summary.total == held
            assert [(p.messages, p.peer) for p in summary.peers] == [
                (held, full[0]["to_broker_instance"])
            ]
            oldest = sorted(full, key=lambda r: str(r["enqueued_at"]))[:SCRAPE_LISTED]
            assert summary.oldest == oldest
            assert summary.peers[0].status == oldest[0]["transmission_status"]
        finally:
            await client.close()
