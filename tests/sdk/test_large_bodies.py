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

from brokerd.storage import body_files
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    two_services_database,
)
from brokerd.tools.launcher import Deployment
from tests.daemons import drain, running
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


async def test_a_large_body_sent_inside_one_database_is_stored_once(tmp_path: Path) -> None:
    """Both services in one database: a SEND goes straight into the target queue
    (R-DLG-13), and a large body into a segment file beside the file, not into
    SQLite's pages. The bodies survive a SIGKILL before RECEIVE and come out whole,
    exactly once and in order, an empty one among them; then no segment is left."""
    deployment = Deployment(tmp_path)
    solo = deployment.add("solo", "127.0.0.238", two_services_database("shop"))
    with running(deployment):
        client = await solo.client()
        handle = await client.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        # The first message takes the whole way (it makes the target's endpoint); the
        # ones after it go straight into the queue.
        bodies = [_order(0, 10), _order(1, 3 * FRAGMENT), b"", _order(2, FRAGMENT // 2 + 1)]
        for body in bodies:
            await client.send(handle, ORDER, body)
        await client.close()
        database = solo.directory / "data" / "shop.sqlite"
        with sqlite3.connect(database) as conn:
            rows = conn.execute(
                "SELECT length(body), stored_length FROM queue_messages "
                "ORDER BY message_sequence_number"
            ).fetchall()
        assert rows == [(len(bodies[0]), None), (0, len(bodies[1])), (0, None), (0, len(bodies[3]))]
        segments = body_files.directory_of(database)
        assert sum(p.stat().st_size for p in segments.iterdir()) == len(bodies[1]) + len(bodies[3])

        deployment.kill("solo")
        await asyncio.to_thread(deployment.start, "solo")
        fresh = await solo.client()
        got = await drain(fresh, "OrderQueue", 4, timeout=20)
        assert [m.message_sequence_number for m in got] == [1, 2, 3, 4]
        assert [m.message_body for m in got] == bodies
        assert await fresh.receive("OrderQueue", top=10, timeout=0.5) == []
        for _ in range(50):
            if not list(segments.iterdir()):
                break
            await asyncio.sleep(0.1)
        assert list(segments.iterdir()) == []
        await fresh.close()
