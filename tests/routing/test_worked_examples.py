"""Service Broker's seven worked routing examples with real daemons on 127.0.0.31-34, port 4022.

SPEC ids: R-ROUTE-1 (AdventureWorks' routes for conversations begun there, msdb's
for traffic from outside), R-ROUTE-2 (replies by broker instance), R-ROUTE-3
(a conversation is bound to the broker instance that acknowledged it),
R-ROUTE-4/5 (matching and selection), R-ROUTE-6/7 (forwarding), R-ROUTE-10
(mirror), R-ROUTE-12 (local service in any database), R-ROUTE-13 (DELAYED for
conversations begun locally, even in example 1; drop, not acknowledged, for
messages from outside).

The deployments are in ``tests/routing/worked_examples.py``: "aw" holds AdventureWorks and msdb
with the example's tables; "outside" begins conversations that arrive at aw
from outside its instance. Every outcome is checked where it happens, and aw's
``explain`` must give the same decision.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.tools.launcher import Deployment
from tests.daemons import drain, wait_until
from tests.routing import worked_examples as s
from tests.routing.deploy import AW, queue_of, stat, wait_drops

TIMEOUT = 15.0


def tcp(host: str) -> str:
    """The normal form of a loopback host's broker address, as explain reports it."""
    return f"tcp://{host}:4022"


async def start(deployment: Deployment, example: s.Example) -> dict[str, BrokerClient]:
    for name in example.daemons:
        deployment.start(name)
    return {name: await deployment.daemons[name].client() for name in example.daemons}


# --------------------------------------------------------------------------- helpers


async def begin(
    client: BrokerClient,
    from_service: str,
    to_service: str,
    bodies: list[bytes],
    *,
    database: str | None = None,
    to_broker_instance: uuid.UUID | None = None,
) -> uuid.UUID:
    """BEGIN DIALOG and SEND each body; the initiator's handle."""
    handle = await client.begin_dialog(
        from_service, to_service, database=database, to_broker_instance=to_broker_instance
    )
    for body in bodies:
        await client.send(handle, body=body)
    return handle


async def from_aw(aw: BrokerClient, service: str, *bodies: bytes, **kw: Any) -> uuid.UUID:
    """A conversation begun in AdventureWorks on aw (routed with its routes, R-ROUTE-1)."""
    return await begin(aw, s.INITIATOR, service, list(bodies), database=AW, **kw)


async def from_outside(outside: BrokerClient, service: str, *bodies: bytes) -> uuid.UUID:
    """A conversation that arrives at aw from outside its instance (msdb's routes)."""
    return await begin(outside, s.OUTSIDE_INITIATOR, service, list(bodies))


async def received(
    client: BrokerClient, service: str, bodies: list[bytes], database: str | None = None
) -> list[ReceivedMessage]:
    """The application of ``service`` receives exactly ``bodies``, in order, on one dialog."""
    got = await drain(client, queue_of(service), len(bodies), TIMEOUT)
    while more := await client.receive(queue_of(service), database=database, top=100):
        got += more
    assert [m.message_body for m in got] == bodies
    assert {m.service_name for m in got} == {service}
    assert len({m.conversation_handle for m in got}) == 1
    assert [m.message_sequence_number for m in got] == list(range(1, len(bodies) + 1))
    return got


async def nothing_for(client: BrokerClient, service: str, database: str | None = None) -> None:
    """Nothing is ready in ``service``'s queue on this broker."""
    assert await client.receive(queue_of(service), database=database, top=100) == []


async def acknowledged(client: BrokerClient, handle: uuid.UUID) -> None:
    """Every message of the conversation was acknowledged: none left in the transmission queue."""

    async def done() -> bool:
        return not any(r["conversation_handle"] == str(handle) for r in await tq(client))

    await wait_until(done, TIMEOUT)


async def tq(client: BrokerClient) -> list[dict[str, Any]]:
    return await client.view("transmission_queue")


async def rows_of(client: BrokerClient, handle: uuid.UUID) -> list[dict[str, Any]]:
    return [r for r in await tq(client) if r["conversation_handle"] == str(handle)]


async def endpoint(client: BrokerClient, handle: uuid.UUID) -> dict[str, Any]:
    (row,) = [
        r
        for r in await client.view("conversation_endpoints")
        if r["conversation_handle"] == str(handle)
    ]
    return row


async def delayed(client: BrokerClient, handle: uuid.UUID, count: int = 1) -> list[dict[str, Any]]:
    """R-ROUTE-13: the conversation's messages wait in the transmission queue, DELAYED."""

    async def check() -> bool:
        rows = await rows_of(client, handle)
        return len(rows) == count and all(
            "DELAYED" in r["transmission_status"] and "R-ROUTE-13" in r["transmission_status"]
            for r in rows
        )

    try:
        await wait_until(check, TIMEOUT)
    except AssertionError:
        raise AssertionError(f"not DELAYED: {await rows_of(client, handle)}") from None
    rows = await rows_of(client, handle)
    assert [r["message_sequence_number"] for r in rows] == list(range(1, count + 1))
    assert all(r["attempts"] == 0 for r in rows), rows  # never sent anywhere
    return rows


async def dropped(
    receiver: BrokerClient, sender: BrokerClient, handle: uuid.UUID, service: str, text: str
) -> str:
    """``receiver`` dropped the conversation's message (reason contains ``text``), without
    acknowledging it: the sender keeps it in its transmission queue (R-ROUTE-13)."""
    conversation = (await endpoint(sender, handle))["conversation_id"]
    reason = await wait_drops(receiver, f"conversation {conversation} for {service!r}", TIMEOUT)
    assert text in reason, reason
    rows = await rows_of(sender, handle)
    assert [r["message_sequence_number"] for r in rows] == [1], rows
    assert "DELAYED" not in rows[0]["transmission_status"]
    assert rows[0]["attempts"] >= 1
    ids = [r["conversation_id"] for r in await receiver.view("conversation_endpoints")]
    assert conversation not in ids  # no endpoint was created for it
    return reason


async def explain(
    aw: BrokerClient,
    service: str,
    decision: str,
    *,
    from_outside: bool = False,
    broker_instance: uuid.UUID | None = None,
) -> dict[str, Any]:
    result = await aw.explain(
        service, database=AW, from_outside=from_outside, broker_instance=broker_instance
    )
    assert result["decision"] == decision, result
    assert result["steps"], result
    return result


async def explain_cases(aw: BrokerClient, example: s.Example) -> None:
    """Every case the docs print (worked_examples.Example.cases) has the decision it claims."""
    for case in example.cases:
        await explain(
            aw,
            case.service,
            case.expected,
            from_outside=case.from_outside,
            broker_instance=case.broker_instance,
        )


# --------------------------------------------------------------------------- example 1


async def test_worked_example_1_default_routing(deployment: Deployment) -> None:
    """Only AutoCreatedLocal: local services get everything; a missing one is DELAYED when the
    conversation begins in AdventureWorks (R-ROUTE-13 Decision) and dropped from outside."""
    ex = s.example_1(deployment)
    c = await start(deployment, ex)
    aw, outside = c["aw"], c["outside"]

    handle = await from_aw(aw, s.LOCAL_SERVICE, b"hello 1", b"hello 2")
    await received(aw, s.LOCAL_SERVICE, [b"hello 1", b"hello 2"])
    await acknowledged(aw, handle)
    r = await explain(aw, s.LOCAL_SERVICE, "local")
    assert (r["route"], r["target_database"]) == ("AutoCreatedLocal", AW)

    # R-ROUTE-12: a service in another database of the instance is local too.
    handle = await from_aw(aw, s.SALES_SERVICE, b"to sales")
    await received(aw, s.SALES_SERVICE, [b"to sales"], database="Sales")
    await acknowledged(aw, handle)
    r = await explain(aw, s.SALES_SERVICE, "local")
    assert r["target_database"] == "Sales"

    # The documentation says "dropped" here; R-ROUTE-13 decides DELAYED.
    missing = await from_aw(aw, s.MISSING, b"m1", b"m2")
    await delayed(aw, missing, 2)
    assert (await endpoint(aw, missing))["state"] in ("SO", "CO")
    r = await explain(aw, s.MISSING, "delayed")
    assert "R-ROUTE-13" in r["reason"]

    handle = await from_outside(outside, s.LOCAL_SERVICE, b"from outside")
    await received(aw, s.LOCAL_SERVICE, [b"from outside"])
    await acknowledged(outside, handle)
    r = await explain(aw, s.LOCAL_SERVICE, "local", from_outside=True)
    assert r["route"] == "AutoCreatedLocal" and r["database"] == "msdb"
    handle = await from_outside(outside, s.SALES_SERVICE, b"sales from outside")
    await received(aw, s.SALES_SERVICE, [b"sales from outside"], database="Sales")
    await acknowledged(outside, handle)
    r = await explain(aw, s.SALES_SERVICE, "local", from_outside=True)
    assert r["target_database"] == "Sales"

    lost = await from_outside(outside, s.MISSING, b"lost")
    await dropped(aw, outside, lost, s.MISSING, "R-ROUTE-13")
    await explain(aw, s.MISSING, "drop", from_outside=True)

    # Meanwhile the DELAYED conversation was neither sent nor dropped.
    await delayed(aw, missing, 2)
    conversation = (await endpoint(aw, missing))["conversation_id"]
    assert not any(conversation in d["reason"] for d in await aw.view("drops"))
    await explain_cases(aw, ex)

    # Beyond the example (R-ROUTE-13: "routing is retried"): a DELAYED conversation loses
    # nothing; once a route exists, its waiting messages are delivered in order.
    waiting = await from_aw(aw, s.OUTSIDE_INITIATOR, b"w1", b"w2", b"w3")
    await delayed(aw, waiting, 3)
    await aw.create_route(
        AW, "LateRoute", f"tcp://{s.OUTSIDE_HOST}:4022", remote_service_name=s.OUTSIDE_INITIATOR
    )
    await received(outside, s.OUTSIDE_INITIATOR, [b"w1", b"w2", b"w3"])
    await acknowledged(aw, waiting)
    await delayed(aw, missing, 2)


async def test_worked_example_2_network_route_to_one_service(deployment: Deployment) -> None:
    """OrderPartsRoute sends OrderParts to host2; everything else is AutoCreatedLocal."""
    ex = s.example_2(deployment)
    c = await start(deployment, ex)
    aw, host2, outside = c["aw"], c["host2"], c["outside"]

    handle = await from_aw(aw, s.ORDER_PARTS, b"order 1", b"order 2", b"order 3")
    got = await received(host2, s.ORDER_PARTS, [b"order 1", b"order 2", b"order 3"])
    await acknowledged(aw, handle)
    assert (await endpoint(aw, handle))["route"] == "OrderPartsRoute"
    r = await explain(aw, s.ORDER_PARTS, "network")
    assert (r["route"], r["address"]) == ("OrderPartsRoute", tcp(s.HOST_A))
    # The reply finds its way back (host2 routes //AW/Initiator to aw; R-ROUTE-2 there).
    await host2.send(got[0].conversation_handle, body=b"parts shipped")
    (reply,) = await drain(aw, queue_of(s.INITIATOR), 1, TIMEOUT)
    assert (reply.conversation_handle, reply.message_body) == (handle, b"parts shipped")

    handle = await from_aw(aw, s.LOCAL_SERVICE, b"local")
    await received(aw, s.LOCAL_SERVICE, [b"local"])
    r = await explain(aw, s.LOCAL_SERVICE, "local")
    assert r["route"] == "AutoCreatedLocal"

    missing = await from_aw(aw, s.MISSING, b"nowhere")
    await delayed(aw, missing)
    await explain(aw, s.MISSING, "delayed")

    handle = await from_outside(outside, s.LOCAL_SERVICE, b"from outside")
    await received(aw, s.LOCAL_SERVICE, [b"from outside"])
    await acknowledged(outside, handle)
    await explain(aw, s.LOCAL_SERVICE, "local", from_outside=True)

    # From outside, msdb has no OrderPartsRoute: OrderParts is not here, so it is dropped.
    lost = await from_outside(outside, s.ORDER_PARTS, b"not forwarded")
    await dropped(aw, outside, lost, s.ORDER_PARTS, "R-ROUTE-13")
    await explain(aw, s.ORDER_PARTS, "drop", from_outside=True)
    await nothing_for(host2, s.ORDER_PARTS)
    assert await stat(aw, "forwarded_fragments") == 0
    await delayed(aw, missing)
    await explain_cases(aw, ex)


# --------------------------------------------------------------------------- example 3


@pytest.mark.parametrize("principal", ["partner1", "partner2"])
async def test_worked_example_3_route_to_mirrored_database(
    deployment: Deployment, principal: str
) -> None:
    """OrderPartsRoute has address partner1 and mirror address partner2: aw asks both which
    one is principal and sends to the principal only (R-ROUTE-5 step 1, R-ROUTE-10)."""
    ex = s.example_3(deployment, principal)
    mirror = "partner2" if principal == "partner1" else "partner1"
    principal_host = s.HOST_A if principal == "partner1" else s.HOST_B
    c = await start(deployment, ex)
    aw, outside = c["aw"], c["outside"]

    handle = await from_aw(aw, s.ORDER_PARTS, b"part 1", b"part 2")
    got = await received(c[principal], s.ORDER_PARTS, [b"part 1", b"part 2"])
    await acknowledged(aw, handle)
    assert (await endpoint(aw, handle))["route"] == "OrderPartsRoute"
    assert await stat(c[mirror], "fragments_received") == 0  # the mirror got nothing
    assert await c[mirror].view("conversation_endpoints") == []
    (pair,) = [m for m in await aw.view("mirrors") if m["kind"] == "mirrored route"]
    assert pair["principal"] == tcp(principal_host)
    r = await explain(aw, s.ORDER_PARTS, "network")
    assert r["route"] == "OrderPartsRoute"
    assert (r["address"], r["mirror_address"]) == (tcp(s.HOST_A), tcp(s.HOST_B))
    assert any(f"principal is {tcp(principal_host)}" in step for step in r["steps"]), r

    await c[principal].send(got[0].conversation_handle, body=b"reply from the principal")
    (reply,) = await drain(aw, queue_of(s.INITIATOR), 1, TIMEOUT)
    assert (reply.conversation_handle, reply.message_body) == (handle, b"reply from the principal")

    await from_aw(aw, s.LOCAL_SERVICE, b"local")
    await received(aw, s.LOCAL_SERVICE, [b"local"])
    missing = await from_aw(aw, s.MISSING, b"nowhere")
    await delayed(aw, missing)

    handle = await from_outside(outside, s.LOCAL_SERVICE, b"from outside")
    await received(aw, s.LOCAL_SERVICE, [b"from outside"])
    await acknowledged(outside, handle)
    lost = await from_outside(outside, s.ORDER_PARTS, b"not forwarded")
    await dropped(aw, outside, lost, s.ORDER_PARTS, "R-ROUTE-13")
    assert await stat(c[mirror], "fragments_received") == 0
    await explain_cases(aw, ex)


# --------------------------------------------------------------------------- example 4


async def test_worked_example_4_catch_all_behind_local(deployment: Deployment) -> None:
    """ExternalRoute (NULL, NULL, forwarding) and AutoCreatedLocal both match; LOCAL is chosen
    when the service is here (R-ROUTE-5 step 2), ExternalRoute otherwise (step 3)."""
    ex = s.example_4(deployment)
    c = await start(deployment, ex)
    aw, fwd, outside = c["aw"], c["forwarding"], c["outside"]

    # LocalService exists on both brokers: the local one gets it.
    handle = await from_aw(aw, s.LOCAL_SERVICE, b"stay here")
    await received(aw, s.LOCAL_SERVICE, [b"stay here"])
    assert await stat(fwd, "fragments_received") == 0
    assert (await endpoint(aw, handle))["route"] == "AutoCreatedLocal"
    r = await explain(aw, s.LOCAL_SERVICE, "local")
    assert r["route"] == "AutoCreatedLocal"

    handle = await from_aw(aw, s.REMOTE_SERVICE, b"go 1", b"go 2")
    await received(fwd, s.REMOTE_SERVICE, [b"go 1", b"go 2"])
    await acknowledged(aw, handle)
    assert (await endpoint(aw, handle))["route"] == "ExternalRoute"
    r = await explain(aw, s.REMOTE_SERVICE, "network")
    assert (r["route"], r["address"]) == ("ExternalRoute", tcp(s.HOST_A))

    # A service that exists nowhere still takes ExternalRoute (not DELAYED); the far broker
    # drops it without acknowledging, so it waits in aw's transmission queue.
    missing = await from_aw(aw, s.MISSING, b"nobody")
    reason = await dropped(fwd, aw, missing, s.MISSING, "R-ROUTE-13")
    assert "R-ROUTE-13" in reason
    (row,) = await rows_of(aw, missing)
    assert f"sent to {tcp(s.HOST_A)}" in row["transmission_status"], row
    r = await explain(aw, s.MISSING, "network")
    assert r["route"] == "ExternalRoute"

    handle = await from_outside(outside, s.LOCAL_SERVICE, b"from outside")
    await received(aw, s.LOCAL_SERVICE, [b"from outside"])
    await acknowledged(outside, handle)
    await explain(aw, s.LOCAL_SERVICE, "local", from_outside=True)

    # msdb has only AutoCreatedLocal: RemoteService from outside is dropped at aw.
    lost = await from_outside(outside, s.REMOTE_SERVICE, b"not forwarded")
    await dropped(aw, outside, lost, s.REMOTE_SERVICE, "R-ROUTE-13")
    await explain(aw, s.REMOTE_SERVICE, "drop", from_outside=True)
    await nothing_for(fwd, s.REMOTE_SERVICE)
    await nothing_for(fwd, s.LOCAL_SERVICE)
    await explain_cases(aw, ex)


# --------------------------------------------------------------------------- example 5


async def test_worked_example_5_load_balancing(deployment: Deployment) -> None:
    """BalancedRouteOne/Two name different broker instances: each new dialog picks one
    (R-ROUTE-4 step 3) and keeps it (R-ROUTE-3); a named broker instance picks its route."""
    ex = s.example_5(deployment)
    c = await start(deployment, ex)
    aw, server1, server2, outside = c["aw"], c["server1"], c["server2"], c["outside"]
    servers = {s.BI_ONE: server1, s.BI_TWO: server2}
    dialogs, per_dialog = 16, 3

    def bodies(i: int) -> list[bytes]:
        return [f"dialog {i} message {k}".encode() for k in range(per_dialog)]

    handles = [await from_aw(aw, s.BALANCED, *bodies(i)) for i in range(dialogs)]
    named = {
        i: instance
        for i, instance in zip(range(dialogs, dialogs + 4), [s.BI_ONE, s.BI_TWO] * 2, strict=True)
    }
    for i, instance in named.items():
        handles.append(await from_aw(aw, s.BALANCED, *bodies(i), to_broker_instance=instance))
    total = (dialogs + len(named)) * per_dialog

    got: dict[uuid.UUID, list[ReceivedMessage]] = {s.BI_ONE: [], s.BI_TWO: []}

    async def all_arrived() -> bool:
        for instance, server in servers.items():
            got[instance] += await server.receive(queue_of(s.BALANCED), top=500)
        return sum(len(v) for v in got.values()) >= total

    await wait_until(all_arrived, TIMEOUT)
    landed: dict[int, uuid.UUID] = {}
    for instance, messages in got.items():
        per: dict[uuid.UUID, list[ReceivedMessage]] = {}
        for m in messages:
            per.setdefault(m.conversation_handle, []).append(m)
        for ms in per.values():
            first = ms[0].message_body.decode()
            i = int(first.split()[1])
            # All of a dialog's messages on one broker, exactly once, in order.
            assert [m.message_body for m in ms] == bodies(i), [m.message_body for m in ms]
            assert [m.message_sequence_number for m in ms] == list(range(1, per_dialog + 1))
            assert i not in landed, f"dialog {i} reached both brokers"
            landed[i] = instance
    assert sorted(landed) == list(range(dialogs + len(named)))
    unnamed = [landed[i] for i in range(dialogs)]
    assert set(unnamed) == {s.BI_ONE, s.BI_TWO}, unnamed  # both brokers receive dialogs
    for i, instance in named.items():
        assert landed[i] == instance, f"dialog {i} named {instance}, went to {landed[i]}"

    # R-ROUTE-3: after the first acknowledgement each dialog is bound to that broker instance.
    for i, handle in enumerate(handles):
        await acknowledged(aw, handle)
        row = await endpoint(aw, handle)
        assert row["far_broker_instance"] == str(landed[i])
        assert row["route"] == ("BalancedRouteOne" if landed[i] == s.BI_ONE else "BalancedRouteTwo")
    # Later messages of a bound dialog go to the same broker.
    for i in (0, 1):
        await aw.send(handles[i], body=b"later")
        (later,) = await drain(servers[landed[i]], queue_of(s.BALANCED), 1, TIMEOUT)
        assert (later.message_body, later.message_sequence_number) == (b"later", per_dialog + 1)

    routes = set()
    for _ in range(24):  # explain draws a new conversation id each time
        routes.add((await explain(aw, s.BALANCED, "network"))["route"])
    assert routes == {"BalancedRouteOne", "BalancedRouteTwo"}
    r = await explain(aw, s.BALANCED, "network", broker_instance=s.BI_TWO)
    assert (r["route"], r["address"]) == ("BalancedRouteTwo", tcp(s.HOST_B))
    r = await explain(aw, s.BALANCED, "network", broker_instance=s.BI_ONE)
    assert (r["route"], r["address"]) == ("BalancedRouteOne", tcp(s.HOST_A))

    missing = await from_aw(aw, s.MISSING, b"nowhere")
    await delayed(aw, missing)
    await explain(aw, s.MISSING, "delayed")

    handle = await from_outside(outside, s.LOCAL_SERVICE, b"from outside")
    await received(aw, s.LOCAL_SERVICE, [b"from outside"])
    await acknowledged(outside, handle)
    lost = await from_outside(outside, s.BALANCED, b"not balanced")
    await dropped(aw, outside, lost, s.BALANCED, "R-ROUTE-13")
    await explain(aw, s.BALANCED, "drop", from_outside=True)
    await explain_cases(aw, ex)


# --------------------------------------------------------------------------- example 6


async def test_worked_example_6_forwarding_one_service(deployment: Deployment) -> None:
    """msdb's ForwardingRoute sends ElsewhereService arriving from outside to elsewhere, even
    though AdventureWorks holds an ElsewhereService; conversations begun in AdventureWorks
    never use msdb's routes (R-ROUTE-1)."""
    ex = s.example_6(deployment, forwarding=True, local_elsewhere=True)
    c = await start(deployment, ex)
    aw, elsewhere, outside = c["aw"], c["elsewhere"], c["outside"]

    relayed = await from_outside(outside, s.ELSEWHERE, b"relay 1", b"relay 2")
    await received(elsewhere, s.ELSEWHERE, [b"relay 1", b"relay 2"])
    assert await stat(aw, "forwarded_fragments") >= 2
    conversation = (await endpoint(outside, relayed))["conversation_id"]
    assert conversation not in [
        r["conversation_id"] for r in await aw.view("conversation_endpoints")
    ]
    await nothing_for(aw, s.ELSEWHERE)  # not delivered to the local ElsewhereService
    r = await explain(aw, s.ELSEWHERE, "network", from_outside=True)
    assert (r["route"], r["address"]) == ("ForwardingRoute", tcp(s.HOST_A))

    handle = await from_outside(outside, s.LOCAL_SERVICE, b"from outside")
    await received(aw, s.LOCAL_SERVICE, [b"from outside"])
    await acknowledged(outside, handle)
    await explain(aw, s.LOCAL_SERVICE, "local", from_outside=True)

    lost = await from_outside(outside, s.MISSING, b"lost")
    await dropped(aw, outside, lost, s.MISSING, "R-ROUTE-13")
    await explain(aw, s.MISSING, "drop", from_outside=True)

    handle = await from_aw(aw, s.ELSEWHERE, b"begun here")
    await received(aw, s.ELSEWHERE, [b"begun here"])
    assert (await endpoint(aw, handle))["route"] == "AutoCreatedLocal"
    r = await explain(aw, s.ELSEWHERE, "local")
    assert r["route"] == "AutoCreatedLocal"

    missing = await from_aw(aw, s.MISSING, b"nowhere")
    await delayed(aw, missing)
    await explain(aw, s.MISSING, "delayed")
    # The example's msdb has no route back to //Outside/Initiator: elsewhere's acknowledgements
    # stop at aw (R-ROUTE-1), the outside broker retransmits, and elsewhere does not enqueue
    # the copies again (R-DLG-4).
    assert len(await rows_of(outside, relayed)) == 2

    async def retransmitted() -> bool:
        return await stat(elsewhere, "duplicates") >= 1

    await wait_until(retransmitted, TIMEOUT)
    await nothing_for(elsewhere, s.ELSEWHERE)  # no duplicate, nothing from AdventureWorks
    await explain_cases(aw, ex)


async def test_worked_example_6_begun_locally_never_uses_msdb(deployment: Deployment) -> None:
    """Without a local ElsewhereService a conversation begun in AdventureWorks is DELAYED:
    msdb's ForwardingRoute is not used for it."""
    ex = s.example_6(deployment, forwarding=True, local_elsewhere=False)
    c = await start(deployment, ex)
    aw, elsewhere = c["aw"], c["elsewhere"]
    handle = await from_aw(aw, s.ELSEWHERE, b"stays here")
    await delayed(aw, handle)
    r = await explain(aw, s.ELSEWHERE, "delayed")
    assert "R-ROUTE-13" in r["reason"]
    assert await stat(aw, "forwarded_fragments") == 0
    assert await stat(elsewhere, "fragments_received") == 0
    await explain_cases(aw, ex)


async def test_worked_example_6_forwarding_disabled(deployment: Deployment) -> None:
    """Forwarding off: ForwardingRoute is still the matched route, so ElsewhereService from
    outside is dropped (R-ROUTE-6), not delivered to the local ElsewhereService."""
    ex = s.example_6(deployment, forwarding=False, local_elsewhere=True)
    c = await start(deployment, ex)
    aw, elsewhere, outside = c["aw"], c["elsewhere"], c["outside"]

    lost = await from_outside(outside, s.ELSEWHERE, b"not relayed")
    reason = await dropped(aw, outside, lost, s.ELSEWHERE, "message forwarding is disabled")
    assert "R-ROUTE-6" in reason and "ForwardingRoute" in reason
    r = await explain(aw, s.ELSEWHERE, "drop", from_outside=True)
    assert r["route"] == "ForwardingRoute"
    await nothing_for(aw, s.ELSEWHERE)
    assert await stat(aw, "forwarded_fragments") == 0
    assert await stat(elsewhere, "fragments_received") == 0

    handle = await from_outside(outside, s.LOCAL_SERVICE, b"from outside")
    await received(aw, s.LOCAL_SERVICE, [b"from outside"])
    await acknowledged(outside, handle)

    handle = await from_aw(aw, s.ELSEWHERE, b"begun here")
    await received(aw, s.ELSEWHERE, [b"begun here"])
    await explain(aw, s.ELSEWHERE, "local")
    await nothing_for(aw, s.ELSEWHERE)
    await explain_cases(aw, ex)


# --------------------------------------------------------------------------- example 7


async def test_worked_example_7_forwarding_every_missing_service(deployment: Deployment) -> None:
    """msdb's ForwardingRoute (NULL, NULL) forwards what is not here; LOCAL comes first for
    what is (R-ROUTE-5 step 2). AdventureWorks' conversations do not use it."""
    ex = s.example_7(deployment, forwarding=True)
    c = await start(deployment, ex)
    aw, fwd, outside = c["aw"], c["forwarding"], c["outside"]

    # LocalService exists on aw and on the forwarding host: aw keeps it.
    handle = await from_outside(outside, s.LOCAL_SERVICE, b"stay")
    await received(aw, s.LOCAL_SERVICE, [b"stay"])
    await acknowledged(outside, handle)
    assert await stat(aw, "forwarded_fragments") == 0
    r = await explain(aw, s.LOCAL_SERVICE, "local", from_outside=True)
    assert r["route"] == "AutoCreatedLocal"

    relayed = await from_outside(outside, s.REMOTE_SERVICE, b"relay 1", b"relay 2")
    await received(fwd, s.REMOTE_SERVICE, [b"relay 1", b"relay 2"])
    assert await stat(aw, "forwarded_fragments") >= 2
    conversation = (await endpoint(outside, relayed))["conversation_id"]
    assert conversation not in [
        r["conversation_id"] for r in await aw.view("conversation_endpoints")
    ]
    r = await explain(aw, s.REMOTE_SERVICE, "network", from_outside=True)
    assert (r["route"], r["address"]) == ("ForwardingRoute", tcp(s.HOST_A))

    # Not present anywhere: forwarded all the same; the forwarding host drops it.
    lost = await from_outside(outside, s.MISSING, b"nobody")
    await dropped(fwd, outside, lost, s.MISSING, "R-ROUTE-13")
    await explain(aw, s.MISSING, "network", from_outside=True)

    handle = await from_aw(aw, s.LOCAL_SERVICE, b"begun here")
    await received(aw, s.LOCAL_SERVICE, [b"begun here"])
    await explain(aw, s.LOCAL_SERVICE, "local")

    # Begun in AdventureWorks: only AutoCreatedLocal there, so DELAYED, not forwarded.
    missing = await from_aw(aw, s.REMOTE_SERVICE, b"stays here")
    await delayed(aw, missing)
    await explain(aw, s.REMOTE_SERVICE, "delayed")
    await nothing_for(fwd, s.REMOTE_SERVICE)
    await nothing_for(fwd, s.LOCAL_SERVICE)
    await explain_cases(aw, ex)


async def test_worked_example_7_forwarding_disabled(deployment: Deployment) -> None:
    """Forwarding off: a service that is not here is dropped (R-ROUTE-6); local ones are
    still delivered."""
    ex = s.example_7(deployment, forwarding=False)
    c = await start(deployment, ex)
    aw, fwd, outside = c["aw"], c["forwarding"], c["outside"]

    handle = await from_outside(outside, s.LOCAL_SERVICE, b"stay")
    await received(aw, s.LOCAL_SERVICE, [b"stay"])
    await acknowledged(outside, handle)
    await explain(aw, s.LOCAL_SERVICE, "local", from_outside=True)

    lost = await from_outside(outside, s.REMOTE_SERVICE, b"not relayed")
    reason = await dropped(aw, outside, lost, s.REMOTE_SERVICE, "message forwarding is disabled")
    assert "R-ROUTE-6" in reason
    r = await explain(aw, s.REMOTE_SERVICE, "drop", from_outside=True)
    assert r["route"] == "ForwardingRoute"
    assert await stat(aw, "forwarded_fragments") == 0
    assert await stat(fwd, "fragments_received") == 0
    await explain_cases(aw, ex)
