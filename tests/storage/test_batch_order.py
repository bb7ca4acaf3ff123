"""A group commit leaves the file as its jobs, committed one after the other in their
order, would have (R-DLG-13), where the engine's statements depend on their order: a
delete that keeps the rows held out of order (status 2) or the partial ones, and the
update of the same batch that releases or completes one of them.

Real SQLite files in a temporary directory; the committer is held by a job of its own
while the jobs under test queue up, so that they commit together, in their order."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from brokerd.storage import queries, schema
from brokerd.storage.store import Store

GROUP = str(uuid.uuid4())


def _row(handle: str, seq: int, status: int, body: bytes | None) -> schema.Statement:
    return queries.queued_message(
        "q", GROUP, handle, seq, status, "//s", "//c", "//t", 2, body, 1.0
    )


async def _commit(store: Store, statements: list[schema.Statement]) -> None:
    done = store.submit(statements, wait=True)
    assert done is not None
    await done


async def _together(store: Store, jobs: Sequence[list[schema.Statement]]) -> None:
    """``jobs`` committed in one transaction, in their order."""
    started, release = threading.Event(), threading.Event()

    def hold(_: Any) -> None:
        started.set()
        release.wait(10)

    busy = store.run(hold)
    held = asyncio.ensure_future(busy)
    await asyncio.to_thread(started.wait, 10)
    futures = [store.submit(statements, wait=True) for statements in jobs]
    release.set()
    await asyncio.gather(held, *[f for f in futures if f is not None])


async def _rows(store: Store, table: str, handle: str) -> list[tuple[Any, ...]]:
    rows = await store.query(
        f"SELECT message_sequence_number FROM {table} WHERE conversation_handle = ? ORDER BY 1",
        (handle,),
    )
    return [tuple(r) for r in rows]


async def test_an_end_after_a_release_in_one_commit_leaves_no_message_ready(
    tmp_path: Path,
) -> None:
    """R-DLG-1, R-DLG-10, SPEC §6: message 1 of a conversation arrives and releases message
    2, held; then this side ends the conversation, which takes what waits in its queue.
    In one commit behind another conversation's END, nothing of the conversation is
    left in its queue: no message 2 that recovery would hand out ready, without 1, on a
    conversation already ended."""
    store = Store(tmp_path / "warehouse.sqlite", "warehouse")
    await store.open()
    h, other = str(uuid.uuid4()), str(uuid.uuid4())
    await _commit(store, [_row(h, 2, 2, b"2"), _row(other, 7, 1, b"7")])
    await _together(
        store,
        [
            queries.discard_queued(other),  # another conversation ends first
            [_row(h, 1, 1, b"1"), *queries.promote(h, [2])],  # 1 arrives, 2 released
            queries.discard_queued(h),  # this side ends the conversation
        ],
    )
    assert await _rows(store, "queue_messages", h) == []
    assert await _rows(store, "queue_messages", other) == []
    await store.close()


async def test_a_message_completed_before_the_error_in_one_commit_is_kept(
    tmp_path: Path,
) -> None:
    """R-DLG-7, R-DLG-10: the last fragment of message 5 arrives, then the other side's
    Error (9), which abandons the partial messages before it. In one commit behind
    another conversation's abandonment, message 5, complete, keeps its row and its
    fragments: it is not taken for partial and lost."""
    store = Store(tmp_path / "warehouse.sqlite", "warehouse")
    await store.open()
    h, other = str(uuid.uuid4()), str(uuid.uuid4())
    await _commit(
        store,
        [_row(h, 5, 2, None), queries.fragment(h, 5, 0, 0, b"a"), _row(other, 2, 2, None)],
    )
    await _together(
        store,
        [
            queries.abandon_before(other, 3),
            [queries.fragment(h, 5, 1, 1, b"b"), queries.complete_in_fragments(h, 5)],
            queries.abandon_before(h, 9),
        ],
    )
    assert await _rows(store, "queue_messages", h) == [(5,)]
    assert await _rows(store, "message_fragments", h) == [(5,), (5,)]
    await store.close()
