"""A message of several fragments is stored once by the receiving broker (R-DLG-7, R-DLG-5).

Its fragments are stored as they arrive (each acknowledged after the commit that
stores it) and, once the last one is in, they *are* the body: the queue row gets an
empty body and RECEIVE joins the fragments. The body is not read back, joined and
written a second time when the message completes. What must hold besides:

- the body survives a SIGKILL of the receiver between completion and RECEIVE, and
  comes out whole, exactly once and in order;
- RECEIVE removes the fragments with the row, END CONVERSATION removes those of
  the messages it discards, and recovery does not take a complete message's
  fragments for a partial message's.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from brokerd.tools.example import CONTRACT, ORDER, SHOP_SERVICE, WAREHOUSE_SERVICE
from brokerd.tools.launcher import Deployment
from tests.daemons import drain
from tests.sdk.orders import wait_ready

FRAGMENT = 64 * 1024


def _stored(deployment: Deployment) -> tuple[list[tuple[int, int | None, int]], int, int]:
    """Per queue row (sequence number, length of its body column, its length); the
    fragment rows and their bytes, read from the receiver's file (a full fragment's
    bytes are in a segment file beside it, ``storage.body_files``)."""
    database: Path = deployment.daemons["beta"].directory / "data" / "warehouse.sqlite"
    with sqlite3.connect(database) as conn:
        rows = conn.execute(
            "SELECT message_sequence_number, length(body), message_length FROM queue_messages "
            "ORDER BY message_sequence_number"
        ).fetchall()
        count, size = conn.execute(
            "SELECT count(*), coalesce(sum(coalesce(stored_length, length(data))), 0) "
            "FROM message_fragments"
        ).fetchone()
    return [(int(s), b, int(n)) for s, b, n in rows], int(count), int(size)


def _order(n: int, pad: int) -> bytes:
    return f"<order n='{n}' pad='".encode() + bytes([97 + n]) * pad + b"'/>"


async def test_a_large_body_is_stored_once_and_received_whole_after_a_kill(
    deployment: Deployment,
) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    bodies = [_order(0, 3 * FRAGMENT + 123), _order(1, 10), _order(2, 2 * FRAGMENT)]
    for body in bodies:
        await shop.send(handle, ORDER, body)
    await wait_ready(warehouse, 3)
    await warehouse.close()

    rows, fragments, fragment_bytes = _stored(deployment)
    # The large bodies live in their fragments only (an empty body column); the small
    # one, a single fragment, in its row.
    assert rows == [
        (1, 0, len(bodies[0])),
        (2, len(bodies[1]), len(bodies[1])),
        (3, 0, len(bodies[2])),
    ]
    assert fragments == 4 + 3
    assert fragment_bytes == len(bodies[0]) + len(bodies[2])
    segments = deployment.daemons["beta"].directory / "data" / "warehouse.sqlite-bodies"
    assert sum(p.stat().st_size for p in segments.iterdir()) >= 5 * FRAGMENT  # the full ones

    deployment.kill("beta")  # SIGKILL between completion and RECEIVE
    await asyncio.to_thread(deployment.start, "beta")
    fresh = await deployment.daemons["beta"].client()
    got = await drain(fresh, "OrderQueue", 3, timeout=20)
    assert [m.message_sequence_number for m in got] == [1, 2, 3]
    assert [m.message_body for m in got] == bodies
    assert _stored(deployment) == ([], 0, 0)

    # More after the restart on the same dialog: in order, nothing received twice.
    later = [_order(3, 2 * FRAGMENT + 5), _order(4, 7)]
    for body in later:
        await shop.send(handle, ORDER, body)
    got = await drain(fresh, "OrderQueue", 2, timeout=20)
    assert [m.message_sequence_number for m in got] == [4, 5]
    assert [m.message_body for m in got] == later
    assert await fresh.receive("OrderQueue", top=10, timeout=0.5) == []
    assert _stored(deployment) == ([], 0, 0)
    for client in (shop, fresh):
        await client.close()


async def test_end_conversation_removes_the_fragments_of_what_it_discards(
    deployment: Deployment,
) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    for n in range(2):
        await shop.send(handle, ORDER, _order(n, 2 * FRAGMENT))
    await wait_ready(warehouse, 2)
    assert _stored(deployment)[1] == 6
    (first,) = await warehouse.receive("OrderQueue", top=1, timeout=5)
    assert _stored(deployment)[1] == 3  # the received message's fragments went with it
    await warehouse.end_conversation(first.conversation_handle)
    assert _stored(deployment)[1:] == (0, 0)
    for client in (shop, warehouse):
        await client.close()
