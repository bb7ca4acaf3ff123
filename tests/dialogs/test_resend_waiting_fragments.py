"""A retransmission of a message of several fragments on a connection that does not
drain (R-DLG-6, R-DLG-7): the fragments still waiting in the connection's outbox are
not queued a second time (each would go on the wire twice once the connection
drains); the fragments already written and not acknowledged are resent. Alpha runs in
the test's process (its connection's outbox is looked at), beta in its own, the fault
proxy between them, each on its own loopback address."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from brokerd.server.daemon import Broker
from brokerd.server.outbox import Outbox
from brokerd.tools import example
from brokerd.tools.faultproxy import FaultPlan, FaultProxy
from tests.daemons import FAST_RETRY, client_of, drain, in_process, wait_until

ALPHA, BETA, PROXY = "127.0.21.11", "127.0.21.12", "127.0.21.13"


def _outbox(alpha: Broker) -> Outbox:
    """The outbox of alpha's open connection to the warehouse (through the proxy)."""
    (link,) = [link for link in alpha.transport.links.values() if link.is_open]
    assert link.protocol is not None
    return link.protocol.outbox


async def test_a_retransmission_leaves_the_fragments_still_waiting_alone(tmp_path: Path) -> None:
    """R-DLG-6, R-DLG-7: the proxy stops reading from alpha, and a message of 16 MiB (256
    fragments of 64 KiB) fills alpha's socket buffers; most of its fragments wait in
    the connection's outbox. Its retry wait passes and it is retransmitted: the outbox
    then holds each waiting fragment once. Once the proxy reads again the message
    arrives once, exact, and is acknowledged."""
    d = example.shop_and_warehouse(tmp_path, FAST_RETRY, hosts=(ALPHA, BETA), beta_route_host=PROXY)
    plan = FaultPlan()
    proxy = FaultProxy(PROXY, 4022, BETA, 4022, plan)
    await proxy.start()
    try:
        d.start("beta")
        async with in_process(d.daemons["alpha"].config_path) as alpha:
            shop = await client_of(alpha)
            warehouse = await d.daemons["beta"].client()
            handle = await shop.begin_dialog(
                example.SHOP_SERVICE, example.WAREHOUSE_SERVICE, example.CONTRACT
            )
            await shop.send(handle, example.ORDER, b"<order>open the connection</order>")
            await drain(warehouse, "OrderQueue", 1)
            plan.stall = True
            body = bytes(range(256)) * (64 * 1024)
            await shop.send(handle, example.ORDER, body)
            stats = alpha.engine.stats
            resent = stats.retransmissions

            async def retransmitted() -> bool:
                return stats.retransmissions > resent

            await wait_until(retransmitted, 10, interval=0.01)
            waiting = Counter((id(item.msg), item.fragment) for item in _outbox(alpha).bulk)
            assert len(waiting) > 64, "the message's fragments do not wait in the outbox"
            twice = sorted(index for (_, index), n in waiting.items() if n > 1)
            assert twice == [], f"fragments queued twice: {twice[:5]}... ({len(twice)})"
            plan.stall = False
            got = await drain(warehouse, "OrderQueue", 1, timeout=30)
            assert [m.message_body for m in got] == [body]

            async def acknowledged() -> bool:
                return not await shop.view("transmission_queue")

            await wait_until(acknowledged, 20)
            await shop.close()
            await warehouse.close()
    finally:
        d.stop_all()
        await proxy.stop()
