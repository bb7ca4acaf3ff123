"""The admin port's summary of the transmission queue when a queue that is off holds
many messages (SPEC R-OPS-1; R-DLG-12, Decision): a scrape reads the totals and the few
oldest held rows it lists, not every message held, and shows what the full view shows.

The daemon runs in the test's process on 127.0.42.1:4022 (real TCP and SQLite), so that
the test can ask its engine for the summary directly and measure what it allocates.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from tests.daemons import client_of, solo_broker, wait_until

HOST = "127.0.42.1"
S1, S2 = "//solo/S1", "//solo/S2"
LISTED = 50


async def test_a_scrape_reads_only_the_held_rows_it_lists(tmp_path: Path) -> None:
    """4,000 messages held for the queue Q2, which is off: the summary counts them all and
    lists the 50 oldest rows of the full view, while what it allocates is a few rows'
    worth, not the 4,000 rows' (a scrape's memory and time bounded whatever is held)."""
    held = 4_000
    async with solo_broker(tmp_path, HOST) as broker:
        client = await client_of(broker)
        try:
            await client.alter_queue("Q2", False)
            handles = [await client.begin_dialog(S1, S2) for _ in range(4)]
            for handle in handles:
                batch = [(handle, "DEFAULT", b"x" * 100) for _ in range(held // len(handles))]
                await client.send_many(batch)
            verbs = broker.engine.conversation_verbs

            async def acknowledged() -> bool:  # only the held rows are left
                return len(await verbs.transmission_queue()) == held

            await wait_until(acknowledged, 30)
            full = await verbs.transmission_queue()
            tracemalloc.start()
            try:
                summary = await verbs.transmission_backlog(LISTED)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak < 500_000, f"a scrape allocated {peak} bytes for {held} held rows"
            assert summary.total == held
            assert [(p.messages, p.peer) for p in summary.peers] == [
                (held, full[0]["to_broker_instance"])
            ]
            oldest = sorted(full, key=lambda r: str(r["enqueued_at"]))[:LISTED]
            assert summary.oldest == oldest
            assert summary.peers[0].status == oldest[0]["transmission_status"]
        finally:
            await client.close()
