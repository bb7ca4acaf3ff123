"""``limits.page_cache_mb``, ``limits.body_segment_mb`` and ``limits.body_compact_after``
reach the connection of every database of a running daemon."""

from __future__ import annotations

from pathlib import Path

from brokerd.tools.launcher import Deployment
from tests.daemons import in_process

HOST = "127.0.0.243"
DATABASES = """
[[database]]
name = "Shop"
[[database.queue]]
name = "Q"

[[database]]
name = "Warehouse"
[[database.queue]]
name = "Q"
"""


async def test_each_database_of_a_daemon_has_the_storage_limits_it_was_configured_with(
    tmp_path: Path,
) -> None:
    limits = "[limits]\npage_cache_mb = 8\nbody_segment_mb = 3\nbody_compact_after = 7\n"
    daemon = Deployment(tmp_path).add("solo", HOST, DATABASES, extra=limits)
    async with in_process(daemon.config_path) as broker:
        for name in ("Shop", "Warehouse"):
            store = broker.databases[name].store
            rows = await store.query("PRAGMA cache_size")
            assert rows[0][0] == -8 * 1024, name
            assert store.bodies is not None, name
            files = (store.bodies.segment_bytes, store.bodies.compact_after)
            assert files == (3 * 1024 * 1024, 7.0), name
