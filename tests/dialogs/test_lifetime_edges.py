"""Edges of a dialog's end: the clean-up of closed endpoints (SPEC §5, Decision;
``brokerd.dialogs.lifetime.cleanup``) and conversation timers (R-DLG-11) when the
database file is slow or failing.

Real daemons of one database (``//solo/S1`` and ``//solo/S2``): in this process
(``Broker``, as ``brokerd run`` builds it) on 127.0.0.184, 127.0.0.186 and 127.0.31.1, so
that the test can look at the endpoints in memory; in a process of its own on 127.0.0.185.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from brokerd.dialogs.endpoints.states import State
from brokerd.sdk.client import BrokerClient
from brokerd.server.daemon import Broker
from brokerd.tools.launcher import Deployment
from protocol.dialog import END_DIALOG
from tests.daemons import (
    SOLO_DATABASE,
    client_of,
    drain,
    in_process,
    solo_broker,
    solo_daemon,
    wait_until,
)

T = TypeVar("T")
HOST = "127.0.0.184"
HOST_2 = "127.0.0.185"
KEEP = 5.0


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    extra = f"[limits]\nclosed_endpoint_keep = {KEEP}\n"
    async with solo_broker(tmp_path, HOST, extra) as broker:
        yield broker


async def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def _dialog_ended(client: BrokerClient) -> tuple[uuid.UUID, uuid.UUID]:
    """A dialog of //solo/S1 with //solo/S2, one message, ended by both sides (the target
    first): its (initiator, target) handles."""
    initiator = await client.begin_dialog("//solo/S1", "//solo/S2")
    await client.send(initiator, body=b"one")
    (message,) = await drain(client, "Q2", 1, timeout=10)
    target = message.conversation_handle
    await client.end_conversation(target)
    (end,) = await drain(client, "Q1", 1, timeout=10)
    assert end.message_type_name == END_DIALOG
    await client.end_conversation(initiator)
    return initiator.handle, target


def _state(broker: Broker, handle: uuid.UUID) -> State | None:
    ep = broker.databases["Solo"].endpoints.get(handle)
    return None if ep is None else ep.state


async def test_a_target_due_while_a_removal_commits_is_not_kept_again(broker: Broker) -> None:
    """Target B's keep passes while the clean-up's job for target A has not committed yet
    (its file is slow): B goes once that job is done, not a whole keep later."""
    client = await client_of(broker)
    try:
        _, a = await _dialog_ended(client)
        await _until(lambda: _state(broker, a) is State.CLOSED)
        began = time.monotonic()
        await asyncio.sleep(1.5)
        _, b = await _dialog_ended(client)
        await _until(lambda: _state(broker, b) is State.CLOSED)
        b_closed = time.monotonic()
        store = broker.databases["Solo"].store
        await asyncio.sleep(began + KEEP - 0.5 - time.monotonic())
        # a slow file: the next commits wait 3.5 s (A's removal is submitted meanwhile)
        stall = asyncio.ensure_future(store.run(lambda _: time.sleep(3.5)))
        await _until(lambda: _state(broker, a) is None, KEEP)  # A's removal in flight
        await _until(lambda: _state(broker, b) is None, 2 * KEEP)
        await stall
        waited = time.monotonic() - b_closed
        assert waited < KEEP + 3.5, f"B kept {waited:.1f} s, its keep is {KEEP} s"
    finally:
        await client.close()


MANY = 2300
"""More dialogs than a clean-up job may hold (``cleanup.BATCH``, 2,000)."""


async def _many_ended(client: BrokerClient, count: int) -> None:
    """``count`` dialogs of //solo/S1 with //solo/S2 ended by both sides, many at a time."""

    async def chunked(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
        out: list[T] = []
        for start in range(0, len(calls), 100):
            out += await asyncio.gather(*calls[start : start + 100])
        return out

    dialogs = await chunked([client.begin_dialog("//solo/S1", "//solo/S2") for _ in range(count)])
    initiators = [d.handle for d in dialogs]
    await chunked([client.send(h, body=b"one") for h in initiators])
    targets = [m.conversation_handle for m in await drain(client, "Q2", count)]
    await chunked([client.end_conversation(h) for h in targets])
    await drain(client, "Q1", count)
    await chunked([client.end_conversation(h) for h in initiators])


@pytest.mark.soak  # 2,300 dialogs and two busy timeouts: about 40 s
async def test_a_file_that_fails_for_a_while_does_not_make_a_job_ever_larger(
    tmp_path: Path,
) -> None:
    """Another process holds the file's lock while the targets' keep passes: each job
    fails after the busy timeout (5 s) and is tried again, with the endpoints that came
    due meanwhile. A job tried again takes no more than a job may hold: no removal job
    holds more than 2,000 endpoints, however long the file fails."""
    extra = "[limits]\nclosed_endpoint_keep = 8\n"
    async with solo_daemon(tmp_path, HOST_2, extra=extra) as (deployment, client):
        await _many_ended(client, MANY)
        path = Path(
            next(r["file"] for r in await client.view("databases") if r["database"] == "Solo")
        )
        (stats,) = await client.view("stats")
        assert stats["closed_targets_kept"] == MANY
        lock = sqlite3.connect(path, isolation_level=None)
        try:
            lock.execute("BEGIN IMMEDIATE")  # the file's writers wait, then fail

            async def failed_twice() -> bool:  # after a busy timeout (5 s) each
                log = deployment.daemons["solo"].log_path.read_text()
                return log.count("closed endpoints from Solo failed") >= 2

            await wait_until(failed_twice, 40, 0.2)
        finally:
            lock.execute("ROLLBACK")
            lock.close()

        async def all_removed() -> bool:
            (stats,) = await client.view("stats")
            return bool(stats["closed_endpoints_removed"] == 2 * MANY)

        await wait_until(all_removed, 30, 0.2)
        log = deployment.daemons["solo"].log_path.read_text()
        sizes = [int(n) for n in re.findall(r"removing (\d+) closed endpoints from Solo", log)]
        assert sizes and max(sizes) <= 2000, sizes


HOST_3 = "127.0.0.186"


def _timer_rows(path: Path) -> list[tuple[str, float]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return [(str(h), float(d)) for h, d in conn.execute("SELECT * FROM conversation_timers")]


async def test_a_timer_set_as_the_old_one_fires_survives_a_restart(tmp_path: Path) -> None:
    """R-DLG-11: a timer set while the conversation's previous timer fires (both commits
    in one group commit of a busy file) is in the file, so it survives a restart."""
    daemon = Deployment(tmp_path).add("solo", HOST_3, SOLO_DATABASE)
    async with in_process(daemon.config_path) as broker:
        client = await client_of(broker)
        try:
            handle = (await client.begin_dialog("//solo/S1", "//solo/S2")).handle
            store = broker.databases["Solo"].store
            path = store.path
            await client.begin_conversation_timer(handle, 0.3)
            stall = asyncio.ensure_future(store.run(lambda _: time.sleep(1.5)))  # a slow file
            ep = broker.databases["Solo"].endpoints[handle]
            await _until(lambda: ep.timer_due == 0.0)  # fired: its DialogTimer commits next
            await client.begin_conversation_timer(handle, 600)  # a new timer, same commit
            await stall
            (fired,) = await drain(client, "Q1", 1, timeout=10)
            assert fired.is_timer
            assert ep.timer_due > time.time() + 500
        finally:
            await client.close()
        in_file = _timer_rows(path)
    assert [h for h, _ in in_file] == [str(handle)], "the new timer is not in the file"
    async with in_process(daemon.config_path) as broker:
        restarted = broker.databases["Solo"].endpoints[handle]
        assert restarted.timer_due > time.time() + 500


HOST_4 = "127.0.31.1"


def _queued_rows(path: Path, handle: uuid.UUID) -> int:
    with sqlite3.connect(path) as conn:
        (count,) = conn.execute(
            "SELECT COUNT(*) FROM queue_messages WHERE conversation_handle = ?", (str(handle),)
        ).fetchone()
    return int(count)


async def test_a_timer_fired_as_its_conversation_ends_is_not_ready(tmp_path: Path) -> None:
    """SPEC §6, R-DLG-10, R-DLG-11: a DialogTimer whose commit joins that of a local END
    CONVERSATION (one group commit of a busy file) is removed by the END's; it is not
    listed ready in memory either, where the file has none."""
    daemon = Deployment(tmp_path).add("solo", HOST_4, SOLO_DATABASE)
    async with in_process(daemon.config_path) as broker:
        client = await client_of(broker)
        try:
            db = broker.databases["Solo"]
            handle = (await client.begin_dialog("//solo/S1", "//solo/S2")).handle
            await client.begin_conversation_timer(handle, 0.3)
            stall = asyncio.ensure_future(db.store.run(lambda _: time.sleep(1.0)))
            ep = db.endpoints[handle]
            await _until(lambda: ep.timer_due == 0.0)  # fired: its DialogTimer commits next
            await client.end_conversation(handle)  # the END, in the same commit
            await stall
            assert _queued_rows(db.store.path, handle) == 0
            index = db.ready["Q1"]
            listed = [item for items in index.groups.values() for item in items]
            assert [item for item in listed if item[0] == handle] == []
            assert index.count == len(listed) == 0
        finally:
            await client.close()
