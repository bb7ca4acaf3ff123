"""Routing behaviour with real daemons on 127.0.0.7x:4022 and 127.0.24.2x:4022.

SPEC ids: R-ROUTE-3 and R-ROUTE-5 (a bound conversation keeps its broker when
routes change at run time, and by R-ROUTE-4 step 3 so does one not yet bound),
R-ROUTE-7 (the forwarding budget and a next hop that hangs), R-OBJ-5 (route names,
from the configuration and from run time).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid

from brokerd.sdk.client import BrokerClient
from brokerd.sdk.dialog import Dialog
from brokerd.tools.launcher import Deployment
from protocol.errors import RemoteError
from tests.daemons import drain, wait_until
from tests.routing.deploy import R, addr, database, queue_of, stat

A, T1, T2, T3 = "127.0.0.71", "127.0.0.72", "127.0.0.73", "127.0.0.74"
INITIATOR = "//aw/Initiator"
TARGET = "//remote/Target"


async def _endpoint(client: BrokerClient, handle: Dialog) -> dict[str, object]:
    (row,) = [
        r
        for r in await client.view("conversation_endpoints")
        if r["conversation_handle"] == str(handle)
    ]
    return row


async def _acknowledged(client: BrokerClient, handle: Dialog) -> None:
    async def check() -> bool:
        return not [
            r
            for r in await client.view("transmission_queue")
            if r["conversation_handle"] == str(handle)
        ]

    await wait_until(check, 20)


async def test_bound_conversation_keeps_its_broker_when_a_balanced_route_is_added(
    deployment: Deployment,
) -> None:
    """R-ROUTE-3, R-ROUTE-5: two load-balanced routes (NULL broker instance) to two
    brokers holding the target service. Each dialog picks one, gets its first
    acknowledgement and is bound to that broker instance. A third broker is then added to
    the pool with CREATE ROUTE at run time: a bound dialog's later messages must still go
    to the broker it is bound to (it keeps its choice), never to another one."""
    deployment.add(
        "a",
        A,
        database(
            "AW",
            [INITIATOR],
            [R("Pool1", addr(T1), TARGET), R("Pool2", addr(T2), TARGET)],
        ),
    )
    for name, host in (("t1", T1), ("t2", T2), ("t3", T3)):
        deployment.add(name, host, database("Remote", [TARGET], [R("Back", addr(A), INITIATOR)]))
    for name in ("a", "t1", "t2", "t3"):
        deployment.start(name)
    a = await deployment.daemons["a"].client()
    targets = {n: await deployment.daemons[n].client() for n in ("t1", "t2", "t3")}
    by_instance: dict[str, str] = {}
    for n, c in targets.items():
        (db,) = [d for d in await c.view("databases") if d["database"] == "Remote"]
        by_instance[str(db["broker_instance"])] = n

    handles = []
    for i in range(8):
        handle = await a.begin_dialog(INITIATOR, TARGET, database="AW")
        await a.send(handle, body=f"first {i}".encode())
        handles.append(handle)
    bound: dict[Dialog, str] = {}
    for handle in handles:
        await _acknowledged(a, handle)
        row = await _endpoint(a, handle)
        bound[handle] = by_instance[str(row["far_broker_instance"])]
    for n, c in targets.items():
        expected = sum(1 for b in bound.values() if b == n)
        await drain(c, queue_of(TARGET), expected, timeout=20)

    # A third broker joins the pool (a route that sorts before the others).
    await a.create_route("AW", "Pool0", addr(T3), remote_service_name=TARGET)

    for i, handle in enumerate(handles):
        await a.send(handle, body=f"later {i}".encode())
    arrived: dict[str, list[bytes]] = {n: [] for n in targets}

    async def all_later() -> bool:
        for n, c in targets.items():
            arrived[n] += [m.message_body for m in await c.receive(queue_of(TARGET), top=100)]
        return sum(len(v) for v in arrived.values()) >= len(handles)

    with contextlib.suppress(AssertionError):
        await wait_until(all_later, 15)
    missing = []
    for row in await a.view("transmission_queue"):
        handle = next(h for h in handles if str(h) == str(row["conversation_handle"]))
        missing.append(f"bound to {bound[handle]}: {row['transmission_status']}")
    assert not missing, "later messages of bound dialogs not delivered:\n" + "\n".join(missing)
    for i, handle in enumerate(handles):
        assert f"later {i}".encode() in arrived[bound[handle]], (bound, arrived)


F, C, HUNG, B = "127.0.0.75", "127.0.0.76", "127.0.0.78", "127.0.0.77"
SLOW = "//remote/Slow"
GOOD = "//remote/Good"
OTHER = "//bw/Initiator"


async def test_a_hung_next_hop_does_not_stop_forwarding_to_others(
    deployment: Deployment,
) -> None:
    """R-ROUTE-7: a forwarder holds at most message_forward_size of relayed messages, and
    over that budget drops what it cannot hold (the sender retries). Messages held for
    one next hop that hangs (it accepts TCP connections and never answers the
    handshake) must not stop the forwarder from relaying another sender's conversation
    to a healthy next hop."""
    hung = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    hung.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    hung.bind((HUNG, 4022))
    hung.listen(64)  # never accepts, never answers
    try:
        deployment.add("a", A, database("AW", [INITIATOR], [R("ToSlow", addr(F), SLOW)]))
        deployment.add("b", B, database("BW", [OTHER], [R("ToGood", addr(F), GOOD)]))
        deployment.add(
            "f",
            F,
            database(
                "msdb",
                routes=[
                    R("Slow", addr(HUNG), SLOW),
                    R("Good", addr(C), GOOD),
                    R("BackA", addr(A), INITIATOR),
                    R("BackB", addr(B), OTHER),
                ],
            ),
            endpoint_extra=("message_forwarding = true\nmessage_forward_size = 1\n"),
        )
        deployment.add("c", C, database("Remote", [GOOD], [R("Back", addr(F), OTHER)]))
        for name in ("a", "b", "f", "c"):
            deployment.start(name)
        a = await deployment.daemons["a"].client()
        b = await deployment.daemons["b"].client()
        f = await deployment.daemons["f"].client()
        c = await deployment.daemons["c"].client()

        slow = await a.begin_dialog(INITIATOR, SLOW, database="AW")
        for n in range(3):
            await a.send(slow, body=bytes([n]) * 400_000)

        async def holding() -> bool:  # most of the budget, taken while it connects
            return await stat(f, "forward_buffer_bytes") > 512 * 1024

        await wait_until(holding, 20)
        await asyncio.sleep(1.0)  # the next hop's grace to connect is over

        good = await b.begin_dialog(OTHER, GOOD, database="BW")
        for n in range(3):
            t0 = time.monotonic()
            await b.send(good, body=f"good {n}".encode())
            (got,) = await drain(c, queue_of(GOOD), 1, timeout=20)
            took = time.monotonic() - t0
            assert got.message_body == f"good {n}".encode()
            # Relayed at once when nothing else is held: tens of milliseconds.
            assert took < 2.0, (
                f"message {n} to the healthy next hop took {took:.1f} s; forwarder holds "
                f"{await stat(f, 'forward_buffer_bytes')} bytes for the hung one, "
                f"inbound_holds={await stat(f, 'inbound_holds')}"
            )
    finally:
        hung.close()


async def test_a_route_name_stays_unique_when_the_configuration_names_a_kept_route(
    deployment: Deployment,
) -> None:
    """R-OBJ-5: a route is known by its name, compared without regard to case (CREATE
    ROUTE refuses 'toremote' next to 'ToRemote'). A route created at run time lives in
    the database file; when the configuration file later declares a route of the same
    name, spelled with other capitals, the database must still hold one route of that
    name, and what is left must be administrable."""
    a_daemon = deployment.add("a", A, database("AW", [INITIATOR]))
    deployment.start("a")
    a = await a_daemon.client()
    await a.create_route("AW", "toremote", addr(T1), remote_service_name=TARGET)
    await a.close()
    deployment.stop("a")
    deployment.add("a", A, database("AW", [INITIATOR], [R("ToRemote", addr(T2), TARGET)]))
    deployment.start("a")
    a = await a_daemon.client()
    names = [str(r["name"]) for r in await a.view("routes") if r["database"] == "AW"]
    same = [n for n in names if n.casefold() == "toremote"]
    dropped = "dropped"
    try:
        await a.drop_route("AW", "toremote")
    except RemoteError as exc:
        dropped = str(exc)
    assert len(same) == 1, (
        f"database AW holds routes {same}: one name, two routes; DROP ROUTE toremote: {dropped}"
    )


U_A, U_X, U_Y = "127.0.24.20", "127.0.24.21", "127.0.24.22"
BROKER_X = uuid.UUID("00000000-0000-0000-0000-0000000000a1")
BROKER_Y = uuid.UUID("00000000-0000-0000-0000-0000000000b2")


async def test_an_unbound_conversation_keeps_the_broker_instance_chosen_for_it(
    deployment: Deployment,
) -> None:
    """R-ROUTE-4 step 3, R-ROUTE-5, R-ROUTE-3: a conversation that names no broker instance
    is routed by the routes naming one; of several broker instances one is chosen for it,
    and it keeps that choice until its first acknowledgement binds it. Its first message
    waits for broker X, which is down; CREATE ROUTE then adds broker Y for the same
    service, and Y would be the choice of a new conversation with the same id: the
    waiting message still goes to X once X is up, never to Y (two targets would each
    begin the dialog and deliver its messages)."""
    deployment.add(
        "a",
        U_A,
        database("AW", [INITIATOR], [R("ToX", addr(U_X), TARGET, broker_instance=BROKER_X)]),
    )
    for name, host, instance in (("x", U_X, BROKER_X), ("y", U_Y, BROKER_Y)):
        deployment.add(
            name,
            host,
            database("Remote", [TARGET], [R("Back", addr(U_A), INITIATOR)], instance),
        )
    for name in ("a", "y"):
        deployment.start(name)
    a = await deployment.daemons["a"].client()
    y = await deployment.daemons["y"].client()
    # step 3 spreads over the broker instances by the conversation id's high bits
    later_choice = sorted((BROKER_X, BROKER_Y), key=str).index(BROKER_Y)
    while True:
        handle = await a.begin_dialog(INITIATOR, TARGET, database="AW")
        conversation = uuid.UUID(str((await _endpoint(a, handle))["conversation_id"]))
        if (conversation.int >> 64) % 2 == later_choice:
            break
    await a.send(handle, body=b"for X")
    assert (await _endpoint(a, handle))["route"] == "ToX"

    await a.create_route(
        "AW", "ToY", addr(U_Y), remote_service_name=TARGET, broker_instance=BROKER_Y
    )

    assert (await _endpoint(a, handle))["route"] == "ToX"
    deployment.start("x")
    x = await deployment.daemons["x"].client()
    (got,) = await drain(x, queue_of(TARGET), 1, timeout=20)
    assert got.message_body == b"for X"
    await _acknowledged(a, handle)
    assert (await _endpoint(a, handle))["far_broker_instance"] == str(BROKER_X)
    assert await y.receive(queue_of(TARGET), timeout=0) == []
