"""Route choice against R-ROUTE-3, R-ROUTE-5 and R-ROUTE-8, with real daemons.

* Load balancing over equal routes when one of them leads back to this instance: a
  conversation whose chosen route's address is this instance's own is routed again
  with msdb's routes (R-ROUTE-8). That outcome holds only for the conversations whose
  spread over the equal routes picked the route to this instance: the others keep the
  other route (R-ROUTE-5). Every new conversation must still be spread.
* A conversation bound to the broker instance of the target's first answer is routed
  by that broker instance from then on (R-ROUTE-3, R-ROUTE-4 step 1), also when that
  answer is a reply message carrying the acknowledgement.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from brokerd.tools.launcher import Deployment
from tests.daemons import drain, running, wait_until
from tests.routing.deploy import R, addr, database, queue_of

HOST = "127.0.0.221"
FAR = "//far/Target"
ELSEWHERE = "tcp://127.0.0.225:4022"
BEYOND = "tcp://127.0.0.226:4022"
TRIES = 40

DATABASE = """
[[database]]
name = "Solo"
[[database.queue]]
name = "Q1"
[[database.service]]
name = "//solo/S1"
queue = "Q1"
contracts = ["DEFAULT"]
"""


def forwarder(tmp_path: Path) -> Deployment:
    d = Deployment(tmp_path, {"delayed_retry": 0.5})
    d.add("solo", HOST, DATABASE, client_port=4033, endpoint_extra="message_forwarding = true\n")
    return d


async def _explained(
    tmp_path: Path, routes: list[tuple[str, str, str]], database: str, field: str
) -> list[str]:
    """On the forwarding daemon with ``routes`` (database, name, address) for the far
    service: ``field`` of :data:`TRIES` explanations of a new conversation to it from
    ``database`` (``msdb``: a message from outside)."""
    d = forwarder(tmp_path)
    with running(d):
        client = await d.daemons["solo"].client()
        try:
            for db, name, address in routes:
                await client.create_route(db, name, address, remote_service_name=FAR)
            outside = database == "msdb"
            return [
                str((await client.explain(FAR, database=database, from_outside=outside))[field])
                for _ in range(TRIES)
            ]
        finally:
            await client.close()


async def test_a_route_back_to_this_instance_keeps_the_spread_of_new_conversations(
    tmp_path: Path,
) -> None:
    """R-ROUTE-5, R-ROUTE-8: two equal routes, one to this instance's own address (routed
    again with msdb's routes) and one elsewhere: conversations keep being spread over
    both, also after a conversation took the route back to this instance."""
    routes = [
        ("Solo", "A_Self", f"tcp://{HOST}:4022"),
        ("Solo", "B_Elsewhere", ELSEWHERE),
        ("msdb", "M_Beyond", BEYOND),
    ]
    addresses = await _explained(tmp_path, routes, "Solo", "address")
    later = addresses[TRIES // 2 :]
    assert set(addresses) == {ELSEWHERE, BEYOND}, addresses
    assert ELSEWHERE in later and BEYOND in later, addresses


async def test_a_route_back_whose_msdb_route_loops_keeps_the_spread_too(tmp_path: Path) -> None:
    """R-ROUTE-5, R-ROUTE-8, R-ROUTE-13: the database's one route leads back to this
    instance, and of msdb's two equal routes one leads back again (a routing loop): the
    conversations msdb's spread sends round the loop wait, DELAYED, and that outcome is
    theirs alone; the others go beyond."""
    routes = [
        ("Solo", "A_Self", f"tcp://{HOST}:4022"),
        ("msdb", "M_Loop", f"tcp://{HOST}:4022"),
        ("msdb", "M_Beyond", BEYOND),
    ]
    kinds = await _explained(tmp_path, routes, "Solo", "decision")
    later = kinds[TRIES // 2 :]
    assert set(kinds) == {"delayed", "network"}, kinds
    assert "delayed" in later and "network" in later, kinds


async def test_messages_from_outside_are_not_all_dropped_after_one_took_the_route_back(
    tmp_path: Path,
) -> None:
    """R-ROUTE-5, R-ROUTE-6, R-ROUTE-8: msdb holds two equal routes for a service, one to
    this instance's own address, one to another broker, and forwarding is on. A message
    from outside whose conversation took the route back is dropped; that decision must
    not be reused for the conversations that take the other route (they are forwarded)."""
    routes = [("msdb", "A_Self", f"tcp://{HOST}:4022"), ("msdb", "B_Elsewhere", ELSEWHERE)]
    kinds = await _explained(tmp_path, routes, "msdb", "decision")
    later = kinds[TRIES // 2 :]
    assert set(kinds) == {"drop", "network"}, kinds
    assert "drop" in later and "network" in later, kinds


A, F, C = "127.0.0.222", "127.0.0.223", "127.0.0.224"
INITIATOR = "//bound/Initiator"
TARGET = "//bound/Target"
C_INSTANCE = uuid.UUID("6a6b6c6d-0000-4000-8000-000000000066")


async def test_a_reply_binds_the_conversation_to_its_broker_instance_routes(
    tmp_path: Path,
) -> None:
    """R-ROUTE-3, R-ROUTE-4 steps 1-2: before the target answers, A's conversation (naming
    no broker instance) takes the route with a NULL broker instance, through forwarder
    F. The target answers with a reply that carries the acknowledgement of the first
    message; from then on the conversation names the target's broker instance, and its
    later messages take the route for that broker instance, straight to C (they still
    arrive once F is stopped)."""
    # Slow acknowledgements: the reply, sent at once, carries the acknowledgement.
    d = Deployment(
        tmp_path,
        {"initial": 5.0, "maximum": 8.0, "ack_delay": 3.0, "delayed_retry": 0.5},
    )
    d.add(
        "a",
        A,
        database(
            "AW",
            [INITIATOR],
            [R("Any", addr(F), TARGET), R("Direct", addr(C), TARGET, C_INSTANCE)],
        ),
        client_port=4034,
    )
    d.add(
        "f",
        F,
        database("msdb", routes=[R("Fwd", addr(C), TARGET)]),
        client_port=4035,
        endpoint_extra="message_forwarding = true\n",
    )
    d.add(
        "c",
        C,
        database("Remote", [TARGET], [R("Back", addr(A), INITIATOR)], broker_instance=C_INSTANCE),
        client_port=4036,
    )
    with running(d):
        a = await d.daemons["a"].client()
        c = await d.daemons["c"].client()
        try:
            handle = await a.begin_dialog(INITIATOR, TARGET, database="AW")
            await a.send(handle, body=b"first")
            (first,) = await drain(c, queue_of(TARGET), 1, timeout=20)
            assert first.message_body == b"first"
            await c.send(first.conversation_handle, body=b"reply")
            (reply,) = await drain(a, queue_of(INITIATOR), 1, timeout=20)
            assert reply.message_body == b"reply"
            (row,) = await a.view("conversation_endpoints")
            assert row["far_broker_instance"] == str(C_INSTANCE), row

            d.stop("f")
            await a.send(handle, body=b"second")

            seen: list[str] = []

            async def routed_direct() -> bool:
                (ep,) = await a.view("conversation_endpoints")
                seen.append(str(ep["route"]))
                return seen[-1] == "Direct"

            try:
                await wait_until(routed_direct, 10)
            except AssertionError:
                raise AssertionError(f"the conversation kept route {seen[-1]!r}") from None
            (second,) = await drain(c, queue_of(TARGET), 1, timeout=20)
            assert second.message_body == b"second"
        finally:
            await a.close()
            await c.close()
