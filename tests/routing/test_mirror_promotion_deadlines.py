"""Conversation timers due as a mirror is promoted, with real daemons on 127.0.28.21:4022
(the principal) and 127.0.28.22:4022 (the mirror).

SPEC ids: R-DLG-11 (a conversation timer puts a DialogTimer message in its side's queue
when it fires), R-ROUTE-16 (at promotion the new principal rebuilds its image from its
file and resumes every conversation where the old principal stood; the mirror's own
writes to the mirrored database fail).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from brokerd.tools.launcher import Deployment
from protocol.dialog import DIALOG_TIMER
from tests.daemons import wait_until
from tests.routing.deploy import wait_caught_up
from tests.routing.test_mirror_start_catalog import PARTS, parts_database

P1, P2 = "127.0.28.21", "127.0.28.22"
DIALOGS = 2000
"""Dialogs whose timers are due at the promotion (enough that the engine's tick comes
while the promotion waits for its ``inherited`` events to be on disk)."""


async def test_timers_due_at_a_promotion_fire_once_it_is_the_principal(tmp_path: Path) -> None:
    """R-DLG-11, R-ROUTE-16: conversation timers that fell due while the principal was
    down fire on the promoted mirror, written as the principal's. Before, they were watched
    as soon as the image was rebuilt, while the database was still the mirror: a timer the
    engine's tick reached before the role changed wrote into a file that takes only what
    the principal ships, was refused (logged as a store error) and came only when the
    failed write was tried again, a second later."""
    deployment = Deployment(tmp_path, {"initial": 0.04, "maximum": 0.5})
    try:
        deployment.add("p1", P1, parts_database("principal", P2, changed=False))
        deployment.add("p2", P2, parts_database("mirror", P1, changed=False))
        deployment.start("p1")
        deployment.start("p2")
        await wait_caught_up(deployment, "p1", "p2")
        p1 = await deployment.daemons["p1"].client()
        dialogs = await asyncio.gather(
            *(p1.begin_dialog(PARTS, PARTS, database="Parts") for _ in range(DIALOGS))
        )
        handles = [dialog.handle for dialog in dialogs]
        await asyncio.gather(*(p1.begin_conversation_timer(h, 1.0) for h in handles))
        due = time.time() + 1.0
        await p1.close()
        await wait_caught_up(deployment, "p1", "p2")
        deployment.kill("p1")
        while time.time() < due:  # the timers' wall-clock deadline passes while none serves
            await asyncio.sleep(due - time.time())
        p2 = await deployment.daemons["p2"].client()
        await p2.set_mirror_role("Parts", "principal")

        async def fired() -> bool:
            (queue,) = [q for q in await p2.queues() if q.queue == "Q_Parts"]
            return queue.ready_messages >= DIALOGS

        await wait_until(fired, 10)
        (first,) = await p2.receive("Q_Parts", top=1)
        assert first.message_type_name == DIALOG_TIMER and first.conversation_handle in handles
        (queue,) = [q for q in await p2.queues() if q.queue == "Q_Parts"]
        assert queue.ready_messages == DIALOGS - 1  # each timer fired once
        await p2.close()
        log = deployment.daemons["p2"].log_path.read_text().splitlines()
        refused = [line for line in log if "store error while queueing" in line]
        assert not refused, f"{len(refused)} refused, the first: {refused[:1]}"
    finally:
        deployment.stop_all()
