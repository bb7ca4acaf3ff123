"""Forwarding through a middle broker, with real daemons on 127.0.0.x:4022.

SPEC ids: R-ROUTE-1 (msdb routes for traffic from outside), R-ROUTE-2 (replies
by broker instance), R-ROUTE-6 (the forwarding gate), R-ROUTE-7 (relaying,
hop count, routing loops), R-ROUTE-13 (drops are not acknowledged).
Worked example 6 (forwarding for one service) is in tests/routing/test_worked_examples.py; here
the loop between two forwarders and the reply path back through a forwarder.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from brokerd.tools.launcher import Deployment
from brokerd.traces.writer import read_events, segment_files
from tests.daemons import drain, wait_until
from tests.routing.deploy import R, addr, database, queue_of, stat, wait_drops

A, F1, F2, C = "127.0.0.21", "127.0.0.22", "127.0.0.23", "127.0.0.24"
INITIATOR = "//aw/Initiator"
ELSEWHERE = "ElsewhereService"
FORWARDING = "message_forwarding = true\n"


def start_a_f1_c(deployment: Deployment, forward_size_mb: int | None = None) -> None:
    """A -> F1 -> C: F1 forwards by msdb routes, both ways (R-ROUTE-7), holding at most
    ``forward_size_mb`` MB (``message_forward_size``, its default if None)."""
    deployment.add("a", A, database("AW", [INITIATOR], [R("ToElsewhere", addr(F1), ELSEWHERE)]))
    budget = "" if forward_size_mb is None else f"message_forward_size = {forward_size_mb}\n"
    deployment.add(
        "f1",
        F1,
        database("msdb", routes=[R("Fwd", addr(C), ELSEWHERE), R("Back", addr(A), INITIATOR)]),
        endpoint_extra=FORWARDING + budget,
    )
    deployment.add("c", C, database("Remote", [ELSEWHERE], [R("Back", addr(F1), INITIATOR)]))
    for name in ("a", "f1", "c"):
        deployment.start(name)


async def test_request_and_reply_through_a_forwarder(deployment: Deployment) -> None:
    """A -> F1 -> C and back: F1 relays both directions by msdb routes (R-ROUTE-7)."""
    start_a_f1_c(deployment)
    a = await deployment.daemons["a"].client()
    f1 = await deployment.daemons["f1"].client()
    c = await deployment.daemons["c"].client()
    handle = await a.begin_dialog(INITIATOR, ELSEWHERE, database="AW")
    for n in range(20):
        await a.send(handle, body=f"request {n}".encode())
    got = await drain(c, queue_of(ELSEWHERE), 20)
    assert [m.message_body for m in got] == [f"request {n}".encode() for n in range(20)]
    target = got[0].conversation_handle
    await c.send(target, body=b"reply")
    (reply,) = await drain(a, queue_of(INITIATOR), 1)
    assert reply.message_body == b"reply" and reply.conversation_handle == handle
    await a.end_conversation(handle)
    (end,) = await drain(c, queue_of(ELSEWHERE), 1)
    assert end.is_end_dialog
    await c.end_conversation(target)

    async def closed() -> bool:
        # SPEC §5: the initiator's closed endpoint is removed at once, the target's kept
        initiator = [r["state"] for r in await a.view("conversation_endpoints")]
        target = [r["state"] for r in await c.view("conversation_endpoints")]
        return (
            initiator in ([], ["CD"])
            and target == ["CD"]
            and not await a.view("transmission_queue")
        )

    await wait_until(closed, 20)
    assert not await c.view("transmission_queue")
    assert await f1.view("conversation_endpoints") == []  # a forwarder keeps no dialog state
    assert await stat(f1, "forwarded_fragments") >= 22
    assert await stat(f1, "forwarded_acks") >= 1
    assert await stat(f1, "forward_buffer_bytes") == 0


async def test_routing_loop_is_stopped_by_the_hop_count(deployment: Deployment) -> None:
    """F1 and F2 forward every service to each other: the hop count ends the loop."""
    deployment.add("a", A, database("AW", [INITIATOR], [R("ToF1", addr(F1), ELSEWHERE)]))
    loop_extra = FORWARDING + "max_hop_count = 8\n"
    deployment.add(
        "f1", F1, database("msdb", routes=[R("All", addr(F2))]), endpoint_extra=loop_extra
    )
    deployment.add(
        "f2", F2, database("msdb", routes=[R("All", addr(F1))]), endpoint_extra=loop_extra
    )
    for name in ("a", "f1", "f2"):
        deployment.start(name)
    a = await deployment.daemons["a"].client()
    f1 = await deployment.daemons["f1"].client()
    f2 = await deployment.daemons["f2"].client()
    handle = await a.begin_dialog(INITIATOR, ELSEWHERE, database="AW")
    await a.send(handle, body=b"lost in a loop")
    reason = await wait_drops(f1, "max_hop_count 8")
    assert "routing loop" in reason and "R-ROUTE-7" in reason
    forwarded = await stat(f1, "forwarded_fragments") + await stat(f2, "forwarded_fragments")
    # Each transmission crosses exactly 8 hops (A->F1 is hop 0) and is then dropped.
    assert forwarded % 8 == 0 and forwarded >= 8
    assert await stat(f1, "hop_limit_drops") + await stat(f2, "hop_limit_drops") >= 1
    # Nothing spins: between A's retransmissions (every 2 s at most) the relays are quiet.
    (row,) = await a.view("transmission_queue")  # never acknowledged: it stays with its sender
    assert row["message_sequence_number"] == 1
    before = await stat(f1, "forwarded_fragments") + await stat(f2, "forwarded_fragments")
    await asyncio.sleep(3.0)
    after = await stat(f1, "forwarded_fragments") + await stat(f2, "forwarded_fragments")
    assert after - before <= 8 * 3, (before, after)  # at most 3 retransmissions x 8 hops


async def test_forwarding_disabled_drops_without_acknowledging(deployment: Deployment) -> None:
    """R-ROUTE-6: a message from outside whose route is not LOCAL needs forwarding enabled."""
    deployment.add("a", A, database("AW", [INITIATOR], [R("ToF1", addr(F1), ELSEWHERE)]))
    deployment.add("f1", F1, database("msdb", routes=[R("Fwd", addr(C), ELSEWHERE)]))
    deployment.add("c", C, database("Remote", [ELSEWHERE]))
    for name in ("a", "f1", "c"):
        deployment.start(name)
    a = await deployment.daemons["a"].client()
    f1 = await deployment.daemons["f1"].client()
    handle = await a.begin_dialog(INITIATOR, ELSEWHERE, database="AW")
    await a.send(handle, body=b"x")
    reason = await wait_drops(f1, "message forwarding is disabled")
    assert "R-ROUTE-6" in reason
    (row,) = await a.view("transmission_queue")  # not acknowledged: still waiting at A
    assert row["message_sequence_number"] == 1
    assert await stat(f1, "forwarded_fragments") == 0


async def test_forwarding_buffer_limit_drops_and_the_sender_keeps_the_message(
    deployment: Deployment,
) -> None:
    """R-ROUTE-7: at most message_forward_size MB held; over it a message is dropped (not
    acknowledged) and waits at its sender."""
    deployment.add("a", A, database("AW", [INITIATOR], [R("ToF1", addr(F1), ELSEWHERE)]))
    deployment.add(
        "f1",
        F1,
        database("msdb", routes=[R("Fwd", addr(C), ELSEWHERE)]),
        endpoint_extra=FORWARDING + "message_forward_size = 0\n",
    )
    deployment.add("c", C, database("Remote", [ELSEWHERE]))
    for name in ("a", "f1", "c"):
        deployment.start(name)
    a = await deployment.daemons["a"].client()
    f1 = await deployment.daemons["f1"].client()
    handle = await a.begin_dialog(INITIATOR, ELSEWHERE, database="AW")
    await a.send(handle, body=b"too much")
    reason = await wait_drops(f1, "forwarding buffer full")
    assert "message_forward_size" in reason
    assert await stat(f1, "forward_buffer_drops") >= 1
    (row,) = await a.view("transmission_queue")
    assert row["message_sequence_number"] == 1


async def test_a_sender_faster_than_the_next_hop_waits_instead_of_being_dropped(
    deployment: Deployment,
) -> None:
    """R-ROUTE-7: F1 holds at most message_forward_size MB (4 here). A sender pipelining
    18 MB through it is read no faster than F1 relays: F1 stops reading it while over half
    its budget is held, so nothing is dropped and nothing resent, and every message
    arrives once and in order."""
    start_a_f1_c(deployment, forward_size_mb=4)
    a = await deployment.daemons["a"].client()
    f1 = await deployment.daemons["f1"].client()
    c = await deployment.daemons["c"].client()
    handle = await a.begin_dialog(INITIATOR, ELSEWHERE, database="AW")
    bodies = [bytes([n]) * 300_000 for n in range(60)]
    sent = await asyncio.gather(*(a.send_nowait(handle, body=body) for body in bodies))
    assert sent == list(range(1, 61))
    got = await drain(c, queue_of(ELSEWHERE), 60, timeout=60)
    assert [m.message_body for m in got] == bodies

    async def acknowledged() -> bool:
        return not await a.view("transmission_queue")

    await wait_until(acknowledged, 30)
    assert await stat(f1, "forward_buffer_drops") == 0
    assert await stat(a, "retransmissions") == 0
    assert await stat(f1, "inbound_holds") > 0  # A was made to wait
    assert 0 < await stat(f1, "forward_buffer_peak") <= 4 * 1024 * 1024
    for client in (a, f1, c):
        await client.close()


async def test_reply_is_delivered_by_broker_instance_before_msdb_routes(
    deployment: Deployment,
) -> None:
    """R-ROUTE-2: a reply from a target names the initiator's broker instance; held here, it is
    delivered locally even though msdb's route for that service points elsewhere."""
    misleading = R("Elsewhere", "tcp://127.0.0.29:4022", INITIATOR)
    deployment.add(
        "a",
        A,
        database("AW", [INITIATOR], [R("ToC", addr(C), ELSEWHERE)])
        + database("msdb", routes=[misleading]),
    )
    deployment.add("c", C, database("Remote", [ELSEWHERE], [R("Back", addr(A), INITIATOR)]))
    deployment.start("a")
    deployment.start("c")
    a = await deployment.daemons["a"].client()
    c = await deployment.daemons["c"].client()
    explained = await a.explain(INITIATOR, from_outside=True)
    assert explained["decision"] == "drop"  # a new conversation from outside would not get in
    handle = await a.begin_dialog(INITIATOR, ELSEWHERE, database="AW")
    await a.send(handle, body=b"question")
    (question,) = await drain(c, queue_of(ELSEWHERE), 1)
    await c.send(question.conversation_handle, body=b"answer")
    (answer,) = await drain(a, queue_of(INITIATOR), 1)
    assert answer.message_body == b"answer" and answer.conversation_handle == handle
    assert await a.view("drops") == []


async def test_a_forwarder_stopped_mid_traffic_exits_cleanly(deployment: Deployment) -> None:
    """SIGTERM of a forwarder while it relays large bodies both ways: it exits with status 0
    and logs no traceback; after its restart every message arrives exactly once, in order
    (R-ROUTE-7: a forwarder holds relayed messages only in memory, so the senders resend)."""
    start_a_f1_c(deployment)
    a = await deployment.daemons["a"].client()
    c = await deployment.daemons["c"].client()
    handles = [await a.begin_dialog(INITIATOR, ELSEWHERE, database="AW") for _ in range(4)]
    big = b"x" * 200_000
    for n in range(10):
        for h in handles:
            await a.send(h, body=big + str(n).encode())
    await asyncio.sleep(0.3)  # relaying is under way
    assert deployment.stop("f1") == 0
    log = deployment.daemons["f1"].log_tail(400)
    assert "Traceback" not in log, log
    deployment.start("f1")
    got = await drain(c, queue_of(ELSEWHERE), 40, timeout=90)
    per: dict[object, list[bytes]] = {}
    for m in got:
        per.setdefault(m.conversation_handle, []).append(m.message_body[len(big) :])
    assert sorted(per.values()) == [[str(n).encode() for n in range(10)]] * 4


async def test_pipelined_runs_are_relayed_once_in_order_and_traced_once(
    deployment: Deployment,
) -> None:
    """Frames carry runs of one dialog; F1 relays a run's fragments after its first
    without deciding again (R-ROUTE-7), each within the budget, and traces every one as
    it would alone: one ``fragment_received`` and one ``forwarded`` line each."""
    start_a_f1_c(deployment)
    a = await deployment.daemons["a"].client()
    c = await deployment.daemons["c"].client()
    handle = await a.begin_dialog(INITIATOR, ELSEWHERE, database="AW")
    bodies = [b"x" * (150_000 if n % 100 == 99 else 100 + n // 50 % 3 * 40) for n in range(600)]
    sent = await asyncio.gather(*(a.send_nowait(handle, body=body) for body in bodies))
    assert sent == list(range(1, 601))
    got = await drain(c, queue_of(ELSEWHERE), 600, timeout=60)
    assert [m.message_body for m in got] == bodies
    assert [m.message_sequence_number for m in got] == list(range(1, 601))

    async def acknowledged() -> bool:
        return not await a.view("transmission_queue")

    await wait_until(acknowledged, 30)
    assert await stat(a, "retransmissions") == 0
    f1 = await deployment.daemons["f1"].client()
    assert await stat(f1, "fragments_in_runs") > 0  # relayed without a new decision
    await f1.close()
    await a.close()
    await c.close()
    deployment.stop("f1")
    traced = [
        e
        for e in read_events(
            segment_files([deployment.daemons["f1"].directory / "data" / "traces"])
        )
        if e["event"] in ("fragment_received", "forwarded") and e.get("seq")
    ]
    fragments = {
        (seq, index): len(bodies[seq - 1][index * 65536 : (index + 1) * 65536])
        for seq in range(1, 601)
        for index in range(-(-len(bodies[seq - 1]) // 65536))
    }
    for event in ("fragment_received", "forwarded"):
        lines = [e for e in traced if e["event"] == event]
        assert Counter((e["seq"], e["fragment"]) for e in lines) == Counter(list(fragments)), event
        assert {(e["seq"], e["fragment"]): e["size"] for e in lines} == fragments, event
    assert {e["hop"] for e in traced if e["event"] == "forwarded"} == {1}
    assert {e["address"] for e in traced if e["event"] == "forwarded"} == {f"tcp://{C}:4022"}
