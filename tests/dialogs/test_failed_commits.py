"""What the engine keeps in memory after a commit of the dialog engine fails, against what
the file holds: memory must come back in line with the file, and what it keeps for a
commit that never happened must go.

The broker whose commit fails runs in the test's process, so that the test can make its
database refuse writes: ``PRAGMA query_only`` on the committer's own connection makes
every write fail with SQLITE_READONLY, as a file that cannot be written does.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from brokerd.tools import example
from tests.daemons import FAST_RETRY, in_process, wait_until
from tests.disks import read_only
from tests.hostile import HostileBroker, order_message

ALPHA, BETA = "127.0.16.1", "127.0.16.2"


async def test_a_target_whose_first_message_fails_to_commit_is_forgotten(
    tmp_path: Path,
) -> None:
    """R-TRACE-1, R-DLG-5: a target endpoint made by the first message of its dialog waits
    for that message's commit to write its ``dialog_begun``. When the commit fails, the
    reload that follows drops the endpoint (the file does not hold it; the sender sends
    the message again): nothing may stay waiting for it, or every failed first message
    leaves a little memory behind for the life of the process."""
    deployment = example.shop_and_warehouse(tmp_path, FAST_RETRY, hosts=(ALPHA, BETA))
    async with in_process(deployment.daemons["beta"].config_path) as beta:
        warehouse = beta.databases["warehouse"]
        await read_only(warehouse.store, True)
        mallory = HostileBroker(deployment.cert_dir)
        try:
            await mallory.connect(BETA)
            shop = uuid.uuid4()
            firsts = [order_message(shop, uuid.uuid4(), 1, b"<order/>") for _ in range(3)]
            await mallory.send_fragments(firsts)

            async def failed() -> bool:
                return beta.engine.stats.fragments_received >= len(firsts) and (
                    warehouse.rx_suspended
                )

            await wait_until(failed, timeout=10.0)
            await read_only(warehouse.store, False)  # the reload reads the file again

            async def reloaded() -> bool:
                return not warehouse.rx_suspended and not warehouse.endpoints

            await wait_until(reloaded, timeout=10.0)
            assert beta.engine.events.unbegun == 0
        finally:
            await mallory.close()
            await read_only(warehouse.store, False)
