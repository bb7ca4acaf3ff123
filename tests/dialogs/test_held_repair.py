"""Recovery repairs a message left held below its endpoint's receive sequence (R-DLG-1,
R-DLG-5, R-DLG-7).

A tree before the fix of ``queries.complete_in_fragments`` could leave a complete message
of several fragments held (status 2, its body kept in its fragments) although its release
had committed (the endpoint's ``receive_sequence`` counts it). Recovery took it for a
message received beyond a gap: it was never delivered, and every acknowledgement of the
dialog carried a range at or below ``through``, which the sender refuses ("acknowledgement
range 2..2 is out of order"), so the dialog stalled. The test writes that state into a
real file with sqlite3, exactly as that tree wrote it, and restarts the receiver.

Two rarer shapes are checked on a file recovered by a ``Database`` alone: a message whose
side has ended the conversation is removed as what arrives after an END is (R-DLG-10), and
a *partial* message below the receive sequence (no tree is known to write one) is left in
the file, never delivered, and kept out of the acknowledgement state (its fragments would
make every acknowledgement invalid).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import uuid
from pathlib import Path

import pytest

from brokerd.config import DatabaseConfig, QueueConfig
from brokerd.dialogs.endpoints.database import Database
from brokerd.sdk.client import BrokerClient
from brokerd.storage import queries
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from protocol.dialog import Acknowledgement
from tests.daemons import FAST_RETRY, drain, running, wait_until

FRAGMENT = 64 * 1024


def _order(n: int, pad: int) -> bytes:
    return f"<order n='{n}' pad='".encode() + bytes([97 + n]) * pad + b"'/>"


async def _queue_empties(shop: BrokerClient, timeout: float = 20) -> None:
    async def empty() -> bool:
        return await shop.view("transmission_queue") == []

    await wait_until(empty, timeout)


async def test_a_held_message_below_the_receive_sequence_is_made_ready_at_start(
    tmp_path: Path,
) -> None:
    d = shop_and_warehouse(tmp_path / "deployment", FAST_RETRY)
    with running(d):
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        bodies = [_order(0, 10), _order(1, 2 * FRAGMENT + 17), _order(2, 10)]
        for body in bodies:
            await shop.send(handle, ORDER, body)
        # Only the first is received: messages 2 and 3 stay in the queue.
        (first,) = await warehouse.receive("OrderQueue", top=1, timeout=10.0)
        assert first.message_body == bodies[0]
        await _queue_empties(shop)  # every message acknowledged: nothing is resent
        await warehouse.close()
        d.stop("beta")

        # What the old tree left: message 2, complete in its fragments (empty body), its
        # release committed (receive_sequence 3, message 3 ready), but the row held.
        path = d.daemons["beta"].directory / "data" / "warehouse.sqlite"
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE queue_messages SET status = 2 WHERE message_sequence_number = 2")
            rows = conn.execute(
                "SELECT message_sequence_number, status, length(body) FROM queue_messages "
                "ORDER BY message_sequence_number"
            ).fetchall()
            (through,) = conn.execute(
                "SELECT receive_sequence FROM conversation_endpoints"
            ).fetchone()
            (fragments,) = conn.execute("SELECT count(*) FROM message_fragments").fetchone()
        assert rows == [(2, 2, 0), (3, 1, len(bodies[2]))] and through == 3 and fragments == 3

        await asyncio.to_thread(d.start, "beta")
        fresh = await d.daemons["beta"].client()
        got = await drain(fresh, "OrderQueue", 2, timeout=10)
        assert [m.message_sequence_number for m in got] == [2, 3]
        assert [m.message_body for m in got] == bodies[1:]
        assert "repaired" in d.daemons["beta"].log_path.read_text()

        # Later messages on the dialog flow, and their acknowledgements are valid: the
        # sender's transmission queue empties.
        later = [_order(3, FRAGMENT + 5), _order(4, 7)]
        for body in later:
            await shop.send(handle, ORDER, body)
        got = await drain(fresh, "OrderQueue", 2, timeout=20)
        assert [m.message_sequence_number for m in got] == [4, 5]
        assert [m.message_body for m in got] == later
        await _queue_empties(shop)
        assert await fresh.receive("OrderQueue", top=10, timeout=0.5) == []
        with sqlite3.connect(path) as conn:
            left = conn.execute("SELECT count(*) FROM queue_messages").fetchone()
            left += conn.execute("SELECT count(*) FROM message_fragments").fetchone()
        assert left == (0, 0)
        assert "out of order" not in d.daemons["alpha"].log_path.read_text()
        for client in (shop, fresh):
            await client.close()


async def test_recovery_leaves_a_partial_message_and_removes_an_ended_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = DatabaseConfig(name="shop", queues=(QueueConfig("q"),))
    db = Database(config, tmp_path)
    await db.open()
    await db.store.close()
    talking, ended = str(uuid.uuid4()), str(uuid.uuid4())
    conn = sqlite3.connect(tmp_path / "shop.sqlite", isolation_level=None)
    for handle, state in ((talking, "CO"), (ended, "DO")):
        group = str(uuid.uuid4())
        endpoint = [handle, str(uuid.uuid4()), 0, group, "//s", "//f", None]
        endpoint += ["//c", state, 0, 1.0, 0, 3, 0, 0, None, None]
        conn.execute(queries.ENDPOINT_ADD, endpoint)
        for seq, status, body in ((1, 1, b"<a/>"), (2, 2, None), (3, 1, b"<c/>")):
            if handle == ended:
                body = b"" if seq == 2 else None  # complete in its fragments; 1, 3 gone
                if body is None:
                    continue
            row = ("q", group, handle, seq, status, "//s", "//c", "//t", 9, body, 1.0)
            conn.execute(*queries.queued_message(*row))
        conn.execute(*queries.fragment(handle, 2, 0, 0, b"<b"))  # of 2: '<b/>' lacks 1 of 2
    conn.close()
    again = Database(config, tmp_path)
    await again.open()
    try:
        with caplog.at_level(logging.WARNING, "brokerd.dialogs.database"):
            await again.recover()
        await again.store.wait_idle()
        ep = again.endpoints[uuid.UUID(talking)]
        assert ep.accepted.acknowledgement() == Acknowledgement(3, (), ())
        assert ep.durable.acknowledgement() == Acknowledgement(3, (), ())
        assert again.ready["q"].groups[ep.group_id] == [(ep.handle, 1), (ep.handle, 3)]
        assert "partial message at or below its receive sequence 3" in caplog.text
        assert "removed (this side has ended the conversation)" in caplog.text
        left = await again.store.query(
            "SELECT conversation_handle, message_sequence_number, status, body IS NULL "
            "FROM queue_messages ORDER BY conversation_handle = ?, message_sequence_number",
            (ended,),
        )
        assert [tuple(r) for r in left] == [
            (talking, 1, 1, 0),
            (talking, 2, 2, 1),
            (talking, 3, 1, 0),
        ]
        fragments = await again.store.query("SELECT conversation_handle FROM message_fragments", ())
        assert [r[0] for r in fragments] == [talking]
    finally:
        await again.store.close()
