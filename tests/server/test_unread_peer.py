"""A peer that sends and never reads (R-PROTO-3, the daemon's bounds on what a peer's
frames make it send): it still delivers what the peer sends, keeps one acknowledgement
waiting per endpoint, drops broker errors past a bound, goes on serving, and stops
gracefully.

beta (127.0.0.131, the example warehouse) is a real daemon; the peer is a broker with a
deployment certificate whose socket reads nothing after the handshake.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from brokerd.sdk.client import BrokerClient
from brokerd.server.outbox import MAX_QUEUED_ERRORS
from brokerd.tools.example import warehouse_database
from brokerd.tools.launcher import Deployment
from protocol.dialog import FLAG_SEQUENCED
from tests.daemons import FAST_RETRY, running, wait_until
from tests.hostile import HostileBroker, order_message

BETA = "127.0.0.131"
DIALOGS = 500
BATCH_ROUNDS = 40
MAX_ROUNDS = 2000


async def _connection(client: BrokerClient, name: str) -> dict[str, Any]:
    rows = await client.view("broker_connections")
    (row,) = [r for r in rows if r["peer"] == name and r["state"] == "open"]
    return dict(row)


async def test_a_peer_that_never_reads_is_served_within_bounds(tmp_path: Path) -> None:
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("beta", BETA, warehouse_database(None))
    with running(d):
        warehouse = await d.daemons["beta"].client()
        mallory = HostileBroker(d.cert_dir)
        await mallory.connect(BETA, receive_buffer=4096)
        try:
            instance = uuid.uuid4()
            dialogs = [uuid.uuid4() for _ in range(DIALOGS)]
            rounds = 0

            async def all_stored() -> bool:
                (queue,) = [q for q in await warehouse.view("queues") if q["queue"] == "OrderQueue"]
                return queue["ready_messages"] == DIALOGS * rounds

            async def send_batch() -> None:
                """Rounds of a message on each dialog, a little over the acknowledgement
                delay apart: each round the daemon owes every dialog an acknowledgement."""
                nonlocal rounds
                for _ in range(BATCH_ROUNDS):
                    rounds += 1
                    await mallory.send_fragments(
                        [order_message(instance, cid, rounds, b"<order/>") for cid in dialogs]
                    )
                    await asyncio.sleep(0.01)
                await wait_until(all_stored, 60)

            # how much the kernel takes before the daemon's writes stop depends on the
            # machine, so batches go on until acknowledgements are left waiting
            while True:
                await send_batch()
                await asyncio.sleep(0.2)
                held = await _connection(warehouse, mallory.name)
                # at most one acknowledgement waits per endpoint, however many rounds
                # came since the daemon's writes stopped
                assert int(held["acknowledgements_waiting"]) <= DIALOGS, held
                if int(held["acknowledgements_waiting"]) > 0:
                    break
                assert rounds < MAX_ROUNDS, f"the daemon's writes never stopped: {held}"
            # the batch after the writes stopped: without the bound it leaves another
            # acknowledgement per endpoint and round
            await send_batch()
            held = await _connection(warehouse, mallory.name)
            assert 0 < int(held["acknowledgements_waiting"]) <= DIALOGS, held

            # messages from the target side of conversations this daemon has no
            # initiator endpoint of, each answered with a broker error (conversation not
            # found): past the bound, the answers are dropped
            refused = [
                (h._replace(flags=FLAG_SEQUENCED), b)
                for h, b in (
                    order_message(instance, uuid.uuid4(), 2, b"<order/>")
                    for _ in range(3 * MAX_QUEUED_ERRORS)
                )
            ]
            for start in range(0, len(refused), 500):
                await mallory.send_fragments(refused[start : start + 500])

            async def errors_dropped() -> bool:
                row = await _connection(warehouse, mallory.name)
                return int(row["broker_errors_dropped"]) > 0

            await wait_until(errors_dropped, 30)
            # the daemon goes on serving its application: a RECEIVE takes one of the
            # flood's dialogs, every message once and in order (R-DLG-1)
            got = await warehouse.receive("OrderQueue", top=rounds + 1, timeout=10)
            assert [m.message_sequence_number for m in got] == list(range(1, rounds + 1))
            assert len({m.conversation_handle for m in got}) == 1
            await warehouse.close()
            # and stops gracefully (not killed after the launcher's 15 s), the peer still
            # connected and reading nothing
            assert d.stop("beta") == 0
        finally:
            await mallory.close()
