"""The exactly-once-in-order audit after a mirrored principal is killed and never restarts
(R-TRACE-1, R-TRACE-2, R-TRACE-5, R-ROUTE-16; docs/traces.md "A promotion's inheritance").

Real daemons: an initiator ``a`` (127.0.0.111) streams orders on several dialogs to the
mirrored database ``Parts`` of ``p1`` (principal, 127.0.0.112) and ``p2`` (mirror,
127.0.0.113). ``p1``'s application receives a third of them; soon after, while the
stream flows, ``p1`` is SIGKILLed and never started again, and ``p2`` is promoted.

* Every order the application got from ``p1`` has its ``received`` event on ``p1``'s
  disk (a RECEIVE's reply waits for its events, R-TRACE-1).
* The orders ``p1`` delivered last have no ``delivered`` event there (the kill took its
  trace buffer); ``p2`` holds them from the replicated file and delivers them no more
  when the initiator resends them. While they wait in ``p2``'s queue, the audit of the
  three traces finds nothing: no gap, no lost order, nothing unknown.
* The application then gets the rest from ``p2``: every order exactly once, in order.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from brokerd.analytics.audit import violation_line
from brokerd.sdk.client import BrokerClient
from brokerd.tools.launcher import Deployment
from brokerd.traces.segments import segment_lines
from brokerd.traces.writer import segment_files
from tests.analytics.test_audit_daemons import run_audit
from tests.daemons import running, wait_until
from tests.routing.deploy import RETRY, R, addr, database, queue_of

A, P1, P2 = "127.0.0.111", "127.0.0.112", "127.0.0.113"
INITIATOR = "//shop/Orders"
PARTS = "//parts/Parts"
PARTS_INSTANCE = uuid.UUID("8f3e51a0-2b6c-4d1e-9a47-5c0d7e3b9f14")
DIALOGS, ORDERS, BURST = 4, 300, 10
"""Orders per dialog, sent ``BURST`` at a time on each: ``p1`` commits deliveries all the
time, so that it is killed with some committed and shipped whose trace events are still
in its writer's buffer."""


RARE_FLUSH = "[trace]\nflush_interval = 5.0\n"
"""``p1``'s trace is written when a commit's outcome waits for it (a barrier) and
otherwise every 5 s: the kill takes what it delivered since its last reply."""


def parts_database(role: str, partner: str) -> str:
    text = database(
        "Parts", [PARTS], [R("Back", addr(A), INITIATOR)], PARTS_INSTANCE, mirror_role=role
    )
    head, sep, tail = text.partition("[[database.queue]]")
    return f'{head}mirror_partner = "tcp://{partner}:4022"\n{sep}{tail}'


def deployment(root: Path) -> Deployment:
    d = Deployment(root, RETRY)
    route = R("PartsRoute", addr(P1), PARTS, mirror_address=addr(P2))
    d.add("a", A, database("Shop", [INITIATOR], [route]))
    d.add("p1", P1, parts_database("principal", P2), extra=RARE_FLUSH)
    d.add("p2", P2, parts_database("mirror", P1))
    return d


def trace_dirs(d: Deployment) -> list[Path]:
    return [d.daemons[name].directory / "data" / "traces" for name in ("a", "p1", "p2")]


async def attached(d: Deployment) -> bool:
    p1 = await d.daemons["p1"].client()
    try:
        (row,) = await p1.view("mirroring")
        return bool(row["mirror_attached"])
    finally:
        await p1.close()


def events(d: Deployment, name: str) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for segment in segment_files([d.daemons[name].directory / "data" / "traces"])
        for line in segment_lines(segment)
    ]


async def receive(client: BrokerClient, got: dict[uuid.UUID, list[int]], until: int) -> None:
    """RECEIVE outside a transaction (each message at most once, the commit's outcome in
    the reply) until ``got`` holds ``until`` orders, by conversation, in the order got."""
    while sum(map(len, got.values())) < until:
        for m in await client.receive(queue_of(PARTS), top=20, timeout=0.5):
            got.setdefault(m.conversation_handle, []).append(int(m.message_body))


async def stream(a: BrokerClient, handles: list[uuid.UUID]) -> None:
    """Every dialog's orders, ``BURST`` at a time on each, ``a`` never stopping."""
    for first in range(0, ORDERS, BURST):
        sends = [
            a.send_nowait(handle, body=str(n).encode())
            for n in range(first, first + BURST)
            for handle in handles
        ]
        await asyncio.gather(*sends)
        await asyncio.sleep(0.01)


async def test_a_principal_killed_and_never_restarted_leaves_no_finding(
    tmp_path: Path, spark: SparkSession
) -> None:
    d = deployment(tmp_path / "run")
    total = DIALOGS * ORDERS
    got: dict[uuid.UUID, list[int]] = {}
    with running(d):
        await wait_until(lambda: attached(d), 20)
        a = await d.daemons["a"].client()
        handles = [await a.begin_dialog(INITIATOR, PARTS, database="Shop") for _ in range(DIALOGS)]
        sending = asyncio.ensure_future(stream(a, handles))
        p1 = await d.daemons["p1"].client(reconnect=False)
        await receive(p1, got, total // 3)
        await p1.close()
        # Soon after a RECEIVE's reply, while deliveries commit: SIGKILL, and p1 is never
        # started again. What its trace writer held is gone.
        await asyncio.sleep(0.2)
        d.kill("p1")
        p2 = await d.daemons["p2"].client()
        await p2.set_mirror_role("Parts", "principal")
        await asyncio.wait_for(sending, 60)

        async def settled() -> bool:
            return not await a.view("transmission_queue")

        await wait_until(settled, 30)  # every order acknowledged by p1 or p2
        await a.close()
        await p2.close()
    received_at_p1 = sum(map(len, got.values()))

    # R-TRACE-1: what the application got from p1 has its received events on p1's disk.
    traced = {(e["conversation_id"], e["seq"]) for e in events(d, "p1") if e["event"] == "received"}
    assert len(traced) == received_at_p1
    # p1's trace ends without its stopped marker: it was killed and never restarted.
    assert events(d, "p1")[-1]["event"] != "stopped"
    # Orders p1 delivered last have no event of theirs on its disk; p2's file held them.
    evidenced: dict[str, int] = {}
    for e in events(d, "p1"):
        if e["event"] in ("delivered", "received"):
            evidenced[e["conversation_id"]] = max(evidenced.get(e["conversation_id"], 0), e["seq"])
    inherited = {
        e["conversation_id"]: e["received_through"]
        for e in events(d, "p2")
        if e["event"] == "inherited"
    }
    assert len(inherited) == DIALOGS
    assert any(inherited[c] > evidenced.get(c, 0) for c in inherited), (evidenced, inherited)

    # The orders p1 delivered last have no delivered event: p2 holds them, not received
    # yet, and delivered none of them again. The audit finds nothing: no gap, no lost
    # order, nothing unknown (no database file is needed to settle anything).
    result = run_audit(spark, trace_dirs(d))
    findings = [violation_line(v) for v in (*result.violations, *result.unknowns)]
    assert result.passed and result.unknown == 0, findings
    assert result.counts["gap"] == result.counts["lost"] == 0

    # Every order reaches the application once, in order on each dialog: from p1, then p2.
    with running(d, "p2"):
        p2 = await d.daemons["p2"].client()
        await receive(p2, got, total)
        assert await p2.receive(queue_of(PARTS), timeout=0.5) == []
        await p2.close()
    assert len(got) == DIALOGS
    for orders in got.values():
        assert orders == list(range(ORDERS))
