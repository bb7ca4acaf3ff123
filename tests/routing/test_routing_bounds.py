"""What a peer naming ever new services can make the router hold, with real daemons on
127.0.17.x:4022 and a hostile peer of the deployment's CA (``tests.hostile``).

SPEC ids: R-ROUTE-10 (the mirrored pairs a forwarder tracks for a mirrored route),
R-ROUTE-7 (forwarding).
"""

from __future__ import annotations

import uuid

from brokerd.config.model import LimitsConfig
from brokerd.sdk.client import BrokerClient
from brokerd.tools.launcher import Deployment
from tests.daemons import wait_until
from tests.hostile import HostileBroker, order_message
from tests.routing.deploy import R, addr, stat

FORWARDER, NOBODY, NOBODY_MIRROR = "127.0.17.1", "127.0.17.2", "127.0.17.3"
"""A forwarder, and the two partners of its mirrored route, where nothing listens."""


async def _all_dropped(client: BrokerClient, count: int) -> None:
    async def dropped() -> bool:
        return await stat(client, "dropped") >= count

    await wait_until(dropped, 60)


async def test_mirrored_pairs_learned_from_a_peer_are_bounded(deployment: Deployment) -> None:
    """R-ROUTE-10, R-ROUTE-7: a forwarder whose msdb route to every service has a mirror
    address tracks one mirrored pair per (service, broker instance) its messages name.
    A peer that names ever new services must not make it keep a pair for each: past
    ``limits.mirror_pairs`` the pair used longest ago goes, counted
    (``mirror_pairs_evicted``) and logged."""
    limit = LimitsConfig().mirror_pairs
    flood = limit + limit // 2
    everything = R("Everything", addr(NOBODY), mirror_address=addr(NOBODY_MIRROR))
    msdb = '\n[[database]]\nname = "msdb"\n' + everything.toml()
    daemon = deployment.add("f", FORWARDER, msdb, endpoint_extra="message_forwarding = true\n")
    deployment.start("f")
    f = await daemon.client()
    mallory = HostileBroker(deployment.cert_dir)
    await mallory.connect(FORWARDER)
    try:
        instance = uuid.uuid4()
        messages = [
            order_message(instance, uuid.uuid4(), 1, b"<order/>")[0]._replace(
                to_service=f"//flood/{n}"
            )
            for n in range(flood)
        ]
        for start in range(0, flood, 500):
            await mallory.send_fragments([(h, b"<order/>") for h in messages[start : start + 500]])
        # no partner answers: each message is dropped, the sender retries (R-ROUTE-10)
        await _all_dropped(f, flood)
        pairs = [r for r in await f.view("mirrors") if r["kind"] == "mirrored route"]
        assert len(pairs) <= limit, f"{len(pairs)} mirrored pairs kept for {flood} services"
        assert await stat(f, "mirror_pairs_evicted") >= flood - limit
        # the pairs used last are kept, the oldest went
        services = {r["service"] for r in pairs}
        assert f"//flood/{flood - 1}" in services and "//flood/0" not in services
        logged = daemon.log_path.read_text()
        assert "mirrored pairs" in logged and "limits.mirror_pairs" in logged
    finally:
        await mallory.close()
        await f.close()
