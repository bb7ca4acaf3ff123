"""The ``transmission_queue`` view a page at a time when a queue that is off holds many
messages (SPEC R-PROTO-4, Decision; R-DLG-12): a page reads the held rows it may show,
not every one of them, and paging through the view still shows each once, in order.

The daemon runs in the test's process on 127.0.24.5:4022 (real TCP and SQLite), so that
the test can ask its engine for a page's rows directly.
"""

from __future__ import annotations

from pathlib import Path

from brokerd.dialogs.verbs.paging import PageRequest
from brokerd.server.client_views import encode_page
from tests.daemons import client_of, solo_broker, wait_until

HOST = "127.0.24.5"
S1, S2 = "//solo/S1", "//solo/S2"
KEY = ("database", "conversation_handle", "message_sequence_number")


async def test_a_page_reads_only_the_held_rows_it_may_show(tmp_path: Path) -> None:
    """4,000 messages held for the queue Q2, which is off: the rows gathered for a page of
    10 are a few more than 10, not 4,000 (a page's memory and time bounded whatever is
    held), and pages of 500 list every held message once, in key order."""
    held = 4_000
    async with solo_broker(tmp_path, HOST) as broker:
        client = await client_of(broker)
        try:
            await client.alter_queue("Q2", False)
            handles = [await client.begin_dialog(S1, S2) for _ in range(4)]
            for handle in handles:
                batch = [(handle, "DEFAULT", b"x") for _ in range(held // len(handles))]
                await client.send_many(batch)
            verbs = broker.engine.conversation_verbs

            async def acknowledged() -> bool:  # only the held rows are left
                return len(await verbs.transmission_queue()) == held

            await wait_until(acknowledged, 30)
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
