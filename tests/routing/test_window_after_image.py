"""A link's send window after a mirrored database's image is dropped and rebuilt, with
real daemons on 127.0.26.x:4022 and a fault proxy.

SPEC ids: R-DLG-13 (the send window: messages wait in it and go as acknowledgements
return), R-ROUTE-16 (a promoted partner's image is rebuilt from its file and its traffic
resumes), R-DLG-1 (every message delivered, exactly once and in order).
"""

from __future__ import annotations

import uuid

from brokerd.tools.faultproxy import FaultPlan, FaultProxy
from brokerd.tools.launcher import Deployment
from tests.daemons import drain, stats_with, wait_until
from tests.routing.deploy import R, addr, database, queue_of

A, P, PROXY = "127.0.26.1", "127.0.26.2", "127.0.26.3"
INITIATOR = "//win/Initiator"
PARTS = "//win/Parts"
PARTS_INSTANCE = uuid.UUID("5d0c8a31-7e42-4b9a-a1f6-2c9e0b7d4a63")
SMALL_WINDOW = "[limits]\nsend_window = 2\nbacklog_send_window = 2\n"


async def test_a_window_full_of_a_dropped_image_s_messages_opens_for_the_rebuilt_one(
    deployment: Deployment,
) -> None:
    """R-DLG-13, R-ROUTE-16: the principal's replies fill its link's window (two in
    flight, the rest waiting for room) while the peer does not read; the image is then
    dropped and rebuilt (a demotion and a promotion). The dropped image's places leave
    the window, and the rebuilt image's messages must not queue behind the dropped ones
    that waited: they go as soon as the window has room, and all arrive in order."""
    deployment.add("a", A, database("AW", [INITIATOR], [R("ToParts", addr(P), PARTS)]))
    deployment.add(
        "p",
        P,
        database(
            "Parts",
            [PARTS],
            [R("Back", addr(PROXY), INITIATOR)],
            PARTS_INSTANCE,
            mirror_role="principal",
        ),
        extra=SMALL_WINDOW,
    )
    proxy = FaultProxy(PROXY, 4022, A, 4022, FaultPlan())
    await proxy.start()
    try:
        deployment.start("a")
        deployment.start("p")
        a = await deployment.daemons["a"].client()
        p = await deployment.daemons["p"].client()
        handle = await a.begin_dialog(INITIATOR, PARTS, database="AW")
        await a.send(handle, body=b"request")
        (request,) = await drain(p, queue_of(PARTS), 1)
        reply = request.conversation_handle
        await p.send(reply, body=b"reply 1")
        (first,) = await drain(a, queue_of(INITIATOR), 1)
        assert first.message_body == b"reply 1"

        proxy.plan.stall = True  # the peer reads nothing more: nothing is acknowledged
        bodies = [f"reply {n}".encode() for n in range(2, 9)]
        for body in bodies:
            await p.send(reply, body=body)

        async def window_full() -> bool:  # reply 1, then the two the window lets go
            return int((await stats_with(p, "fragments_sent"))["fragments_sent"]) >= 3

        await wait_until(window_full, 10)
        await p.set_mirror_role("Parts", "mirror")
        await p.set_mirror_role("Parts", "principal")
        proxy.plan.stall = False

        got = await drain(a, queue_of(INITIATOR), len(bodies), timeout=20)
        assert [m.message_body for m in got] == bodies
        assert [m.message_sequence_number for m in got] == list(range(2, 9))
    finally:
        deployment.stop_all()
        await proxy.stop()
