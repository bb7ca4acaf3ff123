"""Edges of the store against real SQLite files and real segment files (R-DLG-1, R-DLG-5):
a batch that removes one endpoint row and writes another of the same conversation and
role, a fragment row whose stored length cannot be right, and a RECEIVE of large stored
bodies cut short by its budget.
"""

from __future__ import annotations

import asyncio
import sqlite3
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import pytest

from brokerd.errors import StoreError
from brokerd.storage import queries, reads, schema
from brokerd.storage.body_files import STORED_FROM
from brokerd.storage.store import Store

LARGE = bytes(range(256)) * (STORED_FROM // 256 + 3)


async def _commit(store: Store, statements: list[schema.Statement]) -> None:
    future = store.submit(statements, wait=True)
    assert future is not None
    await future


def _endpoint(handle: str, conversation: str, send_sequence: int) -> schema.Statement:
    return (
        queries.ENDPOINT_SNAPSHOT,
        (
            handle,
            conversation,
            0,
            str(uuid.uuid4()),
            "//s",
            "//far",
            None,
            "DEFAULT",
            "CO",
            0,
            1.0,
            send_sequence,
            0,
            0,
            0,
            None,
            None,
        ),
    )


async def test_an_endpoint_row_removed_and_one_of_its_conversation_made_in_one_batch(
    tmp_path: Path,
) -> None:
    """A batch may remove a closed endpoint's row (the clean-up of closed endpoints) and
    write the row of a new endpoint of the same conversation and role (a late copy of the
    initiator's first message, arriving as the old target goes). The new row must be in
    the file once the batch has committed: a committed job's endpoint is never missing."""
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    conversation = str(uuid.uuid4())
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    await _commit(store, [_endpoint(old, conversation, 3)])
    await _commit(store, [(queries.ENDPOINT_DELETE, (old,)), _endpoint(new, conversation, 1)])
    await store.close()
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT conversation_handle, send_sequence FROM conversation_endpoints"
        ).fetchall()
    assert rows == [(new, 1)]


async def test_a_fragment_whose_stored_length_cannot_be_right_is_refused(
    tmp_path: Path,
) -> None:
    """A message kept in its fragments, stored one after the other in a segment: a
    ``stored_length`` that cannot be right (a damaged row) fails the RECEIVE with an
    error naming the segment, never a body of other bytes than were stored (R-DLG-1)."""
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    handle = str(uuid.uuid4())
    pieces = [LARGE, LARGE[::-1], LARGE]
    at = [0, len(LARGE), 2 * len(LARGE)]
    await _commit(
        store,
        [
            queries.queued_message(
                "q", "g", handle, 1, 2, "//s", "//c", "//t", 3 * len(LARGE), None, 1.0
            ),
            *(queries.fragment(handle, 1, i, at[i], pieces[i]) for i in range(3)),
            queries.complete_in_fragments(handle, 1),
            *queries.promote(handle, [1]),
        ],
    )
    await store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE message_fragments SET stored_length = -100 WHERE fragment_index = 1")

    store = Store(path, "shop")
    await store.open()
    items = [(uuid.UUID(handle), 1)]
    try:
        with pytest.raises(StoreError, match=r"0000000001\.seg"):
            await store.run(lambda conn: reads.read_received(conn, items, bodies=store.bodies))
    finally:
        await store.close()


async def test_a_receive_cut_by_its_budget_reads_only_the_bodies_it_keeps(
    tmp_path: Path,
) -> None:
    """RECEIVE TOP (n) of large bodies kept in segment files, cut by the reply's budget to
    the first: the bodies beyond the cut are not read into memory (a TOP of thousands of
    large messages must not read them all to hand on one frame's worth)."""
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    handle = str(uuid.uuid4())
    size = 2 * 1024 * 1024
    count = 16
    for seq in range(1, count + 1):
        body = seq.to_bytes(4, "big") * (size // 4)
        await _commit(
            store,
            [
                queries.queued_message(
                    "q", "g", handle, seq, 1, "//s", "//c", "//t", size, body, 1.0
                )
            ],
        )
    items = [(uuid.UUID(handle), seq) for seq in range(1, count + 1)]
    seen: list[int] = []

    def budget(rows: list[dict[str, Any]]) -> int:
        seen.extend(len(row["message_body"]) for row in rows)
        return 1

    def receive(conn: sqlite3.Connection) -> tuple[list[dict[str, Any]], int, int]:
        tracemalloc.start()
        try:
            rows, used = reads.read_received(conn, items, budget, remove=True, bodies=store.bodies)
            return rows, used, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    rows, used, peak = await store.run(receive)
    assert seen == [size] * count  # the budget saw every row's length
    assert used == 1
    assert [r["message_body"] for r in rows] == [(1).to_bytes(4, "big") * (size // 4)]
    assert type(rows[0]["message_body"]) is bytes
    assert peak < 4 * size, f"{peak} bytes held to hand on one body of {size}"
    left = await store.fetchall("SELECT count(*) FROM queue_messages")
    assert [tuple(r) for r in left] == [(count - 1,)]
    await store.close()


async def test_a_batch_refused_by_a_lock_held_elsewhere_fails_at_once(tmp_path: Path) -> None:
    """Another process holds the file's write lock (a tool writing to it): the group
    commit's BEGIN waits out SQLite's busy timeout and fails. Every job of the batch is
    answered then, with a clear error; the batch is not tried again job by job, which
    would hold the committer for a timeout per job (a batch of hundreds: many minutes
    in which no job of the database commits)."""
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    handle = str(uuid.uuid4())
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        futures = [
            store.submit([queries.sent_message(handle, seq, "//t", 3, b"x", 1.0)], wait=True)
            for seq in range(1, 7)
        ]
        loop = asyncio.get_running_loop()
        started = loop.time()
        outcomes = await asyncio.gather(
            *(f for f in futures if f is not None), return_exceptions=True
        )
        took = loop.time() - started
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert len(outcomes) == 6
    assert all(isinstance(o, StoreError) and "locked" in str(o) for o in outcomes), outcomes
    # the first job goes alone (the committer was waiting), the others as one batch: two
    # busy timeouts of 5 s, where one per job was waited out (35 s)
    assert took < 14.0, f"{took:.1f} s to answer jobs refused by a lock"
    await _commit(store, [queries.sent_message(handle, 1, "//t", 3, b"x", 1.0)])
    await store.close()


@pytest.mark.parametrize(("key", "value"), [("schema_version", "7x"), ("broker_instance", "nope")])
async def test_a_damaged_meta_table_is_refused_naming_the_file(
    tmp_path: Path, key: str, value: str
) -> None:
    """A file whose schema version or broker instance cannot be read is refused at open
    with a StoreError that names the file, not a bare ValueError at start-up."""
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    await store.close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE meta SET value = ? WHERE key = '{key}'", (value,))
    damaged = Store(path, "shop")
    with pytest.raises(StoreError, match=r"shop\.sqlite: a damaged meta table"):
        await damaged.open()
