"""A broker named by a host name is redialled as soon as it connects to us (R-PROTO-5):
a compose deployment names its brokers (``tcp://alpha:4022``), and a returning peer
connects from an IP address, which the name resolves to.

Alpha runs in the test's process on 127.0.0.19 with its route to the warehouse at
``tcp://localhost:4022`` and a reconnect back-off of 30 s; beta, the warehouse, on
127.0.0.1 (which ``localhost`` resolves to).
"""

from __future__ import annotations

import time
from pathlib import Path

from brokerd.tools import example
from brokerd.tools.launcher import Deployment
from tests.daemons import FAST_RETRY, client_of, in_process

ALPHA, BETA = "127.0.0.19", "127.0.0.1"
SLOW_REDIAL = "reconnect_initial = 30.0\nreconnect_max = 60.0\n"


async def test_a_peer_named_by_host_name_is_dialled_when_it_connects(tmp_path: Path) -> None:
    """R-PROTO-5: alpha's first dial of ``localhost`` fails (beta is down) and would wait
    30 s; beta starts and connects to alpha with a message of its own, and alpha dials it
    at once: its message arrives in seconds, not after the back-off."""
    deployment = Deployment(tmp_path, FAST_RETRY)
    deployment.add("alpha", ALPHA, example.shop_database("localhost"), endpoint_extra=SLOW_REDIAL)
    deployment.add("beta", BETA, example.warehouse_database(ALPHA))
    async with in_process(deployment.daemons["alpha"].config_path) as alpha:
        shop = await client_of(alpha)
        try:
            handle = await shop.begin_dialog(
                example.SHOP_SERVICE, example.WAREHOUSE_SERVICE, example.CONTRACT
            )
            await shop.send(handle, example.ORDER, b"from alpha")
            deployment.start("beta")
            warehouse = await deployment.daemons["beta"].client()
            try:
                # beta's own message makes it connect to alpha
                back = await warehouse.begin_dialog(
                    example.WAREHOUSE_SERVICE, example.SHOP_SERVICE, example.CONTRACT
                )
                await warehouse.send(back, example.ORDER, b"from beta")
                started = time.monotonic()
                got = await warehouse.receive("OrderQueue", timeout=20.0)
                assert [m.message_body for m in got] == [b"from alpha"]
                assert time.monotonic() - started < 15.0  # the back-off was 30 s
            finally:
                await warehouse.close()
        finally:
            await shop.close()
            deployment.stop_all()
