"""Conversation handles sort in the order they were made (``brokerd.storage.keys``), so
the rows of conversations begun together stay together in every table a handle keys;
conversation ids, which cross the wire, stay random (R-ROUTE-5 spreads by them)."""

from __future__ import annotations

import asyncio
import functools
import operator
import os
import select
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from brokerd.storage import keys
from brokerd.storage.keys import POOL_BYTES, new_handle, random_bytes, random_id
from brokerd.tools import example
from brokerd.tools.launcher import Deployment
from tests.daemons import drain, running

HOST = "127.0.0.249"


def test_a_handle_is_a_version_7_uuid_with_74_random_bits() -> None:
    handles = [new_handle() for _ in range(2000)]
    assert {h.version for h in handles} == {7}
    assert {h.variant for h in handles} == {uuid.RFC_4122}
    assert len(set(handles)) == len(handles)
    # Made within a few milliseconds, they differ in their random bits, high and low.
    assert len({h.int >> 64 & 0xFFF for h in handles}) > 1000
    assert len({h.int & (1 << 62) - 1 for h in handles}) == len(handles)
    ms = time.time_ns() // 1_000_000
    assert abs((handles[-1].int >> 80) - ms) < 5_000  # its first 48 bits: the time in ms


def test_a_random_id_is_a_version_4_uuid_and_the_pool_hands_out_each_byte_once() -> None:
    """Conversation and group ids: version 4, as ``uuid.uuid4()`` makes them, drawn through
    the pool over many refills, every one different."""
    ids = [random_id() for _ in range(3 * POOL_BYTES)]  # about 12 refills of the pool
    assert {i.version for i in ids} == {4}
    assert {i.variant for i in ids} == {uuid.RFC_4122}
    assert len(set(ids)) == len(ids)
    # every random bit varies: none is fixed by the pool's slicing
    random_bits = (1 << 128) - 1 & ~(0xF << 76 | 0b11 << 62)
    assert functools.reduce(operator.or_, (i.int for i in ids)) & random_bits == random_bits
    assert functools.reduce(operator.and_, (i.int for i in ids)) & random_bits == 0


def test_threads_drawing_from_the_pool_at_once_never_share_bytes() -> None:
    drawn: list[list[bytes]] = [[] for _ in range(4)]

    def draw(out: list[bytes]) -> None:
        for _ in range(2000):
            out.append(random_bytes(10))

    threads = [threading.Thread(target=draw, args=(out,)) for out in drawn]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pieces = [piece for out in drawn for piece in out]
    assert all(len(piece) == 10 for piece in pieces)
    assert len(set(pieces)) == len(pieces)


def test_a_count_of_random_bytes_is_a_whole_non_negative_number() -> None:
    assert len(random_bytes(POOL_BYTES + 1)) == POOL_BYTES + 1  # beyond the pool: whole
    first = random_bytes(8)
    with pytest.raises(ValueError):
        random_bytes(-8)  # would hand the same bytes out again
    with pytest.raises(TypeError):
        random_bytes(1.5)  # type: ignore[arg-type]
    assert random_bytes(8) != first


def test_a_forked_child_does_not_hand_out_its_parents_pool() -> None:
    """Nor does it wait for ever on the lock a thread of the parent held at the fork."""
    random_id()  # the parent's pool holds bytes not handed out yet
    read, write = os.pipe()
    held = keys._lock
    held.acquire()  # as a thread of the parent drawing at the moment of the fork
    try:
        pid = os.fork()
        if pid == 0:  # the child: what it draws next, to the parent
            try:
                os.write(write, random_bytes(16))
            finally:
                os._exit(0)
    finally:
        held.release()  # in the parent (the child has left)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 10.0)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    child = os.read(read, 16) if ready else b""
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 16, "the child did not draw its bytes within 10 s"
    assert child != random_bytes(16)  # the parent's next bytes: not the child's


def test_handles_made_in_turn_sort_as_text_in_the_order_they_were_made() -> None:
    handles = []
    for _ in range(50):
        handles.append(new_handle())
        time.sleep(0.0011)  # the next millisecond
    texts = [str(h) for h in handles]
    assert sorted(texts) == texts


async def test_a_daemons_endpoints_have_time_ordered_handles_and_random_conversation_ids(
    tmp_path: Path,
) -> None:
    """Both ends of a real dialog: the initiator's handle is made at BEGIN DIALOG, the
    target's when the first message arrives (here through the local link between two
    databases); each is version 7, and conversations begun later sort later."""
    d = Deployment(tmp_path)
    d.add("solo", HOST, example.shop_database(None) + example.warehouse_database(None))
    with running(d):
        client = await d.daemons["solo"].client()
        try:
            begun, targets = [], []
            for n in range(3):  # each received before the next begins: made in turn
                dialog = await client.begin_dialog(
                    example.SHOP_SERVICE, example.WAREHOUSE_SERVICE, example.CONTRACT
                )
                handle = dialog.handle
                await client.send(handle, example.ORDER, f"order {n}".encode())
                (message,) = await drain(client, "OrderQueue", 1)
                begun.append(handle)
                targets.append(message.conversation_handle)
                await asyncio.sleep(0.002)
            endpoints = await client.view("conversation_endpoints")
        finally:
            await client.close()
    assert {h.version for h in begun + targets} == {7}
    for made in (begun, targets):
        assert [str(h) for h in made] == sorted(str(h) for h in made)
    ids = {uuid.UUID(str(e["conversation_id"])) for e in endpoints}
    assert len(ids) == 3 and {i.version for i in ids} == {4}
    assert {uuid.UUID(str(e["conversation_handle"])) for e in endpoints} == {*begun, *targets}
