"""What a peer naming ever new services can make the router hold, with real daemons on
127.0.17.x:4022 and a hostile peer of the deployment's CA (``tests.hostile``).

SPEC ids: R-ROUTE-10 (the mirrored pairs a forwarder tracks for a mirrored route),
R-ROUTE-7 (forwarding), R-ROUTE-14 and R-ROUTE-4 step 4 (MissingRoute requests to the
dynamic routing service), R-ROUTE-13 (DELAYED, not an error).
"""

from __future__ import annotations

import asyncio
import uuid

from brokerd.config.model import LimitsConfig
from brokerd.routing.rules import BROKER_CONFIGURATION_SERVICE
from brokerd.sdk.client import BrokerClient
from brokerd.tools.launcher import Deployment
from examples.dynamic_router import TableEntry, serve
from protocol.dialog import BROKER_CONFIGURATION_NOTICE
from tests.daemons import drain, wait_until
from tests.hostile import HostileBroker, order_message
from tests.routing.deploy import R, addr, database, queue_of, stat, wait_status

FORWARDER, NOBODY, NOBODY_MIRROR = "127.0.17.1", "127.0.17.2", "127.0.17.3"
"""A forwarder, and the two partners of its mirrored route, where nothing listens."""
A, B = "127.0.17.11", "127.0.17.12"
INITIATOR = "//bounds/Initiator"


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


def routing_service_database() -> str:
    return (
        '\n[[database]]\nname = "Routing"\n'
        '[[database.queue]]\nname = "RoutingQueue"\n'
        f'[[database.service]]\nname = "{BROKER_CONFIGURATION_SERVICE}"\nqueue = "RoutingQueue"\n'
        f'contracts = ["{BROKER_CONFIGURATION_NOTICE}"]\n'
    )


DYNAMIC = R("DynamicRouting", "LOCAL", BROKER_CONFIGURATION_SERVICE)


async def test_route_requests_caused_by_a_peer_are_bounded(deployment: Deployment) -> None:
    """R-ROUTE-14, R-ROUTE-4 step 4: a message from outside for a service no route names
    makes the broker ask the dynamic routing service (one MissingRoute dialog each). A
    peer naming ever new services must not make it hold a request for each: at most
    ``limits.route_requests`` are pending per route table; a message for a further one
    is dropped, not acknowledged, with a reason that says so (its sender retries, and is
    asked for then), and the flood on msdb's table leaves a local database's requests
    alone."""
    limit = LimitsConfig().route_requests
    flood = limit * 2
    msdb = '\n[[database]]\nname = "msdb"\n' + DYNAMIC.toml()
    daemon = deployment.add(
        "a", A, msdb + database("AW", [INITIATOR], [DYNAMIC]) + routing_service_database()
    )
    deployment.start("a")
    a = await daemon.client()
    mallory = HostileBroker(deployment.cert_dir)
    await mallory.connect(A)
    try:
        instance = uuid.uuid4()
        messages = [
            order_message(instance, uuid.uuid4(), 1, b"<order/>")[0]._replace(
                to_service=f"//flood/{n}"
            )
            for n in range(flood)
        ]
        await mallory.send_fragments([(h, b"<order/>") for h in messages])
        await _all_dropped(a, flood)
        pending = await stat(a, "pending_route_requests")
        assert pending <= limit, f"{pending} MissingRoute requests pending for {flood} services"
        assert await stat(a, "route_requests") == limit
        assert await stat(a, "route_requests_deferred") >= flood - limit
        reasons = [r["reason"] for r in await a.view("drops")]
        assert any("limits.route_requests" in r for r in reasons), reasons[-3:]
        # a database's own conversations are asked for in its own table's requests
        handle = await a.begin_dialog(INITIATOR, "//local/Unknown", database="AW")
        await a.send(handle, body=b"asked for")
        status = await wait_status(a, "//local/Unknown")
        assert "dynamic routing service is asked" in status, status
        assert await stat(a, "route_requests") == limit + 1
    finally:
        await mallory.close()
        await a.close()


async def test_conversations_past_the_route_request_limit_wait_and_are_asked_for_later(
    deployment: Deployment,
) -> None:
    """R-ROUTE-14, R-ROUTE-13: conversations to more unknown services than
    ``limits.route_requests`` stay DELAYED (a SEND is no error), with a status that names
    the limit; each is asked for once a request is answered, and all are delivered."""
    services = [f"//remote/T{n}" for n in range(6)]
    extra = "[limits]\nroute_requests = 2\n"
    deployment.add(
        "a",
        A,
        database("AW", [INITIATOR], [DYNAMIC]) + routing_service_database(),
        extra=extra,
    )
    deployment.add("b", B, database("Remote", services, [R("Back", addr(A), INITIATOR)]))
    deployment.start("a")
    deployment.start("b")
    a = await deployment.daemons["a"].client()
    b = await deployment.daemons["b"].client()
    for service in services:
        handle = await a.begin_dialog(INITIATOR, service, database="AW")
        await a.send(handle, body=service.encode())
    status = await wait_status(a, "limits.route_requests")
    assert "DELAYED" in status, status
    assert await stat(a, "pending_route_requests") <= 2
    router = await deployment.daemons["a"].client()
    stop = asyncio.Event()
    outcomes: list[str] = []
    table = {service: TableEntry(addr(B)) for service in services}
    serving = asyncio.create_task(serve(router, "RoutingQueue", table, stop, outcomes))
    try:
        for service in services:
            (got,) = await drain(b, queue_of(service), 1, timeout=30)
            assert got.message_body == service.encode()
    finally:
        stop.set()
        await serving
    assert await stat(a, "route_requests") == len(services)
