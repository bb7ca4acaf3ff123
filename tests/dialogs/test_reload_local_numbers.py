"""The numbers of the messages a broker queues itself (a DialogTimer, a broker Error) stay
unique while its database reloads what it received from its file after a failed write
(R-DLG-11, R-DLG-1).

The daemon runs in this process (``Broker``, as ``brokerd run`` builds it) so that the
test can queue a DialogTimer at the moment a reload reads the file. One database,
``Solo``: ``//solo/S1`` (queue ``Q1``) talks to ``//solo/S2`` (queue ``Q2``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.endpoint import Endpoint
from protocol.dialog import DIALOG_TIMER
from tests.daemons import client_of, solo_broker

HOST = "127.0.22.1"
S1, S2 = "//solo/S1", "//solo/S2"


async def test_a_dialog_timer_queued_during_a_reload_keeps_its_number_for_itself(
    tmp_path: Path,
) -> None:
    """R-DLG-11: a DialogTimer is queued while the database reloads its queues (its read of
    the file is already submitted, so it does not see the timer's row). The next one
    queued after the reload takes a number of its own: every timer reaches the queue,
    none is dropped as a copy of the one before it."""
    async with solo_broker(tmp_path, HOST) as broker:
        client = await client_of(broker)
        try:
            dialog = await client.begin_dialog(S1, S2)
            db: Database = broker.databases["Solo"]
            ep: Endpoint = db.endpoints[dialog.handle]
            delivery = broker.engine.delivery

            delivery.queue_local(db, ep, DIALOG_TIMER, b"", [])
            await db.store.wait_idle()
            reload = asyncio.create_task(db.reload_received())
            await asyncio.sleep(0)  # its read is submitted: it is ordered before what follows
            delivery.queue_local(db, ep, DIALOG_TIMER, b"", [])
            await reload
            delivery.queue_local(db, ep, DIALOG_TIMER, b"", [])
            await db.store.wait_idle()

            received = await client.receive("Q1", top=10, timeout=5)
            assert [m.message_type_name for m in received] == [DIALOG_TIMER] * 3
            assert len({m.message_sequence_number for m in received}) == 3
        finally:
            await client.close()
