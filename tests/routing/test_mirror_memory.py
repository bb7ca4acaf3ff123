"""What a principal keeps in memory of its committed units, with an in-process
principal on 127.0.35.3:4022 whose mirror (127.0.35.4:4022) is not running.

SPEC ids: R-ROUTE-16 (a mirror that was away receives what it missed from the units the
principal still holds in memory).
"""

from __future__ import annotations

import gc
import tracemalloc

from brokerd.server.mirroring import Partner
from brokerd.storage import queries
from brokerd.tools.launcher import Deployment
from tests.daemons import in_process
from tests.routing.test_mirror_copies import parts_database

P1, P2 = "127.0.35.3", "127.0.35.4"
SIZE = 32 * 1024 * 1024


async def test_a_unit_kept_for_catching_up_costs_its_encoded_bytes_once(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16: a committed unit of 32 MiB (one large value), kept for a mirror that
    returns, costs about its encoded size: the catch-up memory is counted in those bytes
    (``CATCH_UP_BYTES``). Before, the unit's statements (the value itself) were kept
    beside their encoding: twice the memory the cap counts."""
    deployment.add("p1", P1, parts_database("principal", P2))
    async with in_process(deployment.daemons["p1"].config_path) as broker:
        partner: Partner = broker.mirroring.by_name["Parts"]
        store = partner.db.store
        tracemalloc.start()
        try:
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            value = "v" * SIZE
            await store.submit([queries.meta("probe", value)], wait=True)
            del value
            # a second commit: the committer thread no longer refers to the first's unit
            await store.submit([queries.meta("probe", "")], wait=True)
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert partner.ring_bytes > SIZE  # kept for a mirror that returns
        assert kept < 1.5 * SIZE, f"{kept / SIZE:.2f} times the unit's size is kept"
