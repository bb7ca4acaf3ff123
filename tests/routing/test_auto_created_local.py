"""``AutoCreatedLocal`` is an ordinary route, as in SQL Server (R-OBJ-6, R-ROUTE-4,
R-ROUTE-1), with real daemons on 127.0.0.5x:4022.

* Dropped from a database, R-ROUTE-4's later steps apply to what it matched: a
  conversation that names no broker instance is DELAYED (step 7), one that names the
  broker instance of a database here holding the service is delivered as if a route
  (service, LOCAL) existed (step 6). Created again, the DELAYED one flows.
* Dropped from msdb, messages from outside reach only the services msdb routes
  explicitly: the administrator's lock-down. They are dropped, never acknowledged,
  until such a route exists; then they arrive, once and in order.
* Dropped, it stays dropped across a restart: it lives in the database file, not in
  the configuration.
"""

from __future__ import annotations

from brokerd.sdk.client import BrokerClient
from brokerd.tools.launcher import Deployment
from tests.daemons import drain, wait_until
from tests.routing.deploy import R, addr, database, queue_of, stat, wait_drops, wait_status

A, B = "127.0.0.51", "127.0.0.52"
AUTO = "AutoCreatedLocal"
ORDERS = "//aw/Orders"
STOCK = "//aw/Stock"
REMOTE = "//remote/Sender"


async def test_a_database_without_it_takes_the_later_steps(deployment: Deployment) -> None:
    daemon = deployment.add("a", A, database("AW", [ORDERS, STOCK]))
    deployment.start("a")
    a = await daemon.client()
    await a.drop_route("AW", AUTO)
    assert AUTO not in [r["name"] for r in await a.view("routes") if r["database"] == "AW"]
    explained = await a.explain(STOCK, database="AW")
    assert explained["decision"] == "delayed", explained  # R-ROUTE-4 step 7

    # Step 7: no broker instance named, nothing matches: DELAYED, waiting in the queue.
    delayed = await a.begin_dialog(ORDERS, STOCK, database="AW")
    await a.send(delayed, body=b"waits for a route")
    await wait_status(a, "DELAYED")

    # Step 6: the conversation names this database's broker instance, which holds the
    # service: delivered as if a route (service, LOCAL) existed.
    (aw,) = [d for d in await a.view("databases") if d["database"] == "AW"]
    named = await a.begin_dialog(
        ORDERS, STOCK, database="AW", to_broker_instance=aw["broker_instance"]
    )
    await a.send(named, body=b"by broker instance")
    (got,) = await drain(a, queue_of(STOCK), 1, timeout=20)
    assert got.message_body == b"by broker instance"

    # Dropped, it stays dropped across a restart.
    await a.close()
    deployment.stop("a")
    deployment.start("a")
    a = await daemon.client()
    assert AUTO not in [r["name"] for r in await a.view("routes") if r["database"] == "AW"]
    await wait_status(a, "DELAYED")

    # Created again, as the store made it: the DELAYED conversation flows (R-ROUTE-13).
    await a.create_route("AW", AUTO, "LOCAL")
    (route,) = [r for r in await a.view("routes") if r["database"] == "AW" and r["name"] == AUTO]
    assert (route["address"], route["source"]) == ("LOCAL", "system")
    (got,) = await drain(a, queue_of(STOCK), 1, timeout=20)
    assert got.message_body == b"waits for a route"
    await a.close()


async def test_msdb_without_it_lets_in_only_what_it_routes(deployment: Deployment) -> None:
    a_daemon = deployment.add("a", A, database("Remote", [REMOTE], [R("ToB", addr(B), ORDERS)]))
    b_daemon = deployment.add("b", B, database("AW", [ORDERS], [R("Back", addr(A), REMOTE)]))
    deployment.start("a")
    deployment.start("b")
    a = await a_daemon.client()
    b = await b_daemon.client()
    await b.drop_route("msdb", AUTO)

    handle = await a.begin_dialog(REMOTE, ORDERS, database="Remote")
    bodies = [f"order {n}".encode() for n in range(3)]
    for body in bodies:
        await a.send(handle, body=body)
    # B refuses what msdb does not route: dropped, not acknowledged; A keeps resending.
    await wait_drops(b, f"no route to service {ORDERS!r}")
    assert await b.receive(queue_of(ORDERS), timeout=0.5) == []
    assert len(await a.view("transmission_queue")) == 3
    await wait_until(lambda: _resent(a), 20)

    # The administrator routes the service explicitly in msdb: it is let in.
    await b.create_route("msdb", "OrdersHere", "LOCAL", remote_service_name=ORDERS)
    got = await drain(b, queue_of(ORDERS), 3, timeout=30)
    assert [m.message_body for m in got] == bodies
    await wait_until(lambda: _empty(a), 20)
    await a.close()
    await b.close()


async def _resent(client: BrokerClient) -> bool:
    return await stat(client, "retransmissions") >= 1


async def _empty(client: BrokerClient) -> bool:
    return not await client.view("transmission_queue")
