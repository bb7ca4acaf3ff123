"""A link's send window across lost connections, with real daemons on 127.0.26.x:4022 and
a fault proxy.

SPEC ids: R-DLG-13 (the send window), R-DLG-6 (what was not acknowledged goes again on
the next connection), R-DLG-1 (exactly once and in order).
"""

from __future__ import annotations

from pathlib import Path

from brokerd.tools.faultproxy import FaultPlan, FaultProxy
from brokerd.tools.launcher import Deployment
from tests.daemons import FAST_RETRY, assert_exactly_once_in_order, drain, wait_until
from tests.routing.deploy import R, addr, database, queue_of

A, B, PROXY = "127.0.26.11", "127.0.26.12", "127.0.26.13"
SENDER = "//winlost/Sender"
TARGET = "//winlost/Target"
SMALL_WINDOW = "[limits]\nsend_window = 3\nbacklog_send_window = 3\n"


async def test_a_small_window_delivers_everything_across_lost_connections(
    tmp_path: Path,
) -> None:
    """R-DLG-13, R-DLG-6: a window of three messages, the connection cut while messages
    are in flight and others wait for room, again and again: each connection's window
    counts what is handed to it, and every message arrives exactly once and in order."""
    deployment = Deployment(tmp_path, FAST_RETRY)
    deployment.add(
        "a",
        A,
        database("A", [SENDER], [R("ToTarget", addr(PROXY), TARGET)]),
        extra=SMALL_WINDOW,
    )
    deployment.add("b", B, database("B", [TARGET], [R("Back", addr(A), SENDER)]))
    proxy = FaultProxy(PROXY, 4022, B, 4022, FaultPlan(delay=0.01))
    await proxy.start()
    try:
        deployment.start("a")
        deployment.start("b")
        a = await deployment.daemons["a"].client()
        b = await deployment.daemons["b"].client()
        handle = await a.begin_dialog(SENDER, TARGET, database="A")
        bodies = [f"message {n}".encode() for n in range(1, 61)]
        received = []
        for round_ in range(4):
            for body in bodies[round_ * 15 : (round_ + 1) * 15]:
                await a.send(handle, body=body)
            before = proxy.stats.connections

            async def reconnected(before: int = before) -> bool:
                return proxy.stats.connections > before

            proxy.cut()
            await wait_until(reconnected, 15)
            received += await drain(b, queue_of(TARGET), 15, timeout=20)
        assert_exactly_once_in_order(received)
        assert [m.message_body for m in received] == bodies

        async def settled() -> bool:
            return await a.view("transmission_queue") == []

        await wait_until(settled, 20)
    finally:
        deployment.stop_all()
        await proxy.stop()
