"""Admin views page (SPEC R-PROTO-4, Decision; ``brokerd.server.client_views``): a cursor
that is a row's key, a bounded reply, every row once and in order while the view
changes; the queue view with each row's status (R-OBJ-3) and retained rows gone with
their conversation; the leak views (endpoints by state and age, the oldest waiting
message per conversation). A real daemon over its client port, real SQLite files."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokerd.dialogs.verbs.paging import PageRequest
from brokerd.sdk.client import BrokerClient
from brokerd.server.client_views import encode_page
from brokerd.server.daemon import Broker
from brokerd.tools.launcher import Deployment
from protocol.errors import InvalidRequest
from tests.daemons import client_of, in_process, wait_until

HOST = "127.0.0.103"
DATABASE = """
[[database]]
name = "Kept"
[[database.queue]]
name = "Asked"
[[database.queue]]
name = "Answered"
retention = true
[[database.service]]
name = "//kept/Asker"
queue = "Asked"
contracts = ["DEFAULT"]
[[database.service]]
name = "//kept/Answerer"
queue = "Answered"
contracts = ["DEFAULT"]
"""
"""One database; the answering service's queue keeps what it received (RETENTION)."""
ASKER, ANSWERER = "//kept/Asker", "//kept/Answerer"


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    daemon = Deployment(tmp_path).add(
        "kept", HOST, DATABASE, extra="[limits]\nclosed_endpoint_keep = 1\n"
    )
    async with in_process(daemon.config_path) as broker:
        yield broker


@pytest.fixture
async def client(broker: Broker) -> AsyncIterator[BrokerClient]:
    client = await client_of(broker)
    try:
        yield client
    finally:
        await client.close()


async def begin(client: BrokerClient, count: int) -> list[uuid.UUID]:
    handles: list[uuid.UUID] = []
    for start in range(0, count, 500):
        handles += await asyncio.gather(
            *(
                client.begin_dialog(ASKER, ANSWERER, "DEFAULT")
                for _ in range(start, min(count, start + 500))
            )
        )
    return handles


async def test_ten_thousand_endpoints_page_through_once_in_order(client: BrokerClient) -> None:
    """Every endpoint once, in handle order, pages of at most ``limit`` rows, while
    endpoints are added and removed between pages: the ones that stayed all along are
    all seen, none twice."""
    handles = await begin(client, 10_000)
    removed = set(handles[::7][:300])
    pages, seen, after = 0, [], None
    while True:
        rows, after = await client.view_page("conversation_endpoints", after, limit=1000)
        assert len(rows) <= 1000
        seen += [row["conversation_handle"] for row in rows]
        pages += 1
        if pages == 3:  # the view changes under the reader
            await begin(client, 50)
            for handle in removed:
                await client.end_conversation(handle, cleanup=True)
        if after is None:
            break
    assert seen == sorted(seen) and len(seen) == len(set(seen))
    stayed = {str(h) for h in handles} - {str(h) for h in removed}
    assert stayed <= set(seen)
    assert pages >= 10
    assert len([row async for row in client.view_rows("conversation_endpoints", 777)]) == (
        10_000 + 50 - len(removed)
    )


async def test_a_page_is_bounded_in_bytes_too() -> None:
    """However large the rows, a page stops before its byte bound (one row always goes),
    and its cursor goes on where it stopped."""
    rows = [{"k": f"{n:05d}", "text": "x" * 1000} for n in range(50)]
    body, count, cursor = encode_page(rows, ("k",), PageRequest("", 40), max_bytes=10_000)
    assert 0 < count < 10 and len(body) <= 10_000 and cursor == f"{count - 1:05d}"
    body, count, cursor = encode_page(rows, ("k",), PageRequest(cursor, 40), max_bytes=10)
    assert count == 1 and cursor is not None


async def test_bad_paging_requests_are_refused(client: BrokerClient) -> None:
    for limit in (0, 1001):
        with pytest.raises(InvalidRequest):
            await client.view_page("conversation_endpoints", None, limit)
    with pytest.raises(InvalidRequest):
        await client.view_page("queue_messages", "not a cursor", params={"queue": "Answered"})
    with pytest.raises(InvalidRequest):
        await client.view_page("queue_messages", params={"queue": "Nowhere"})
    with pytest.raises(InvalidRequest):
        await client.view_page("conversation_endpoints", "x" * 2000)


async def test_retained_rows_are_listed_with_their_status_and_go_with_the_conversation(
    broker: Broker, client: BrokerClient
) -> None:
    """R-OBJ-3: a ready message is status 1; received under RETENTION it stays, status 0;
    once both sides have ended, its rows are gone from the view and from the file."""
    (handle,) = await begin(client, 1)
    for n in range(3):
        await client.send(handle, "DEFAULT", f"question {n}".encode())
    rows = await client.view("queue_messages", queue="Answered")
    assert [(r["message_sequence_number"], r["status"], r["status_text"]) for r in rows] == [
        (1, 1, "ready"),
        (2, 1, "ready"),
        (3, 1, "ready"),
    ]
    got = await client.receive("Answered", top=2)
    target = got[0].conversation_handle
    rows = await client.view("queue_messages", queue="Answered")
    assert [(r["message_sequence_number"], r["status"]) for r in rows] == [(1, 0), (2, 0), (3, 1)]
    assert {r["conversation_handle"] for r in rows} == {str(target)}
    assert all(r["size"] == len(b"question 0") for r in rows)
    page, after = await client.view_page("queue_messages", None, 2, {"queue": "Answered"})
    rest, end = await client.view_page("queue_messages", after, 2, {"queue": "Answered"})
    assert [r["message_sequence_number"] for r in page + rest] == [1, 2, 3] and end is None

    await client.end_conversation(handle)
    await client.end_conversation(target)
    path = broker.engine.databases["Kept"].store.path

    def rows_of_conversation() -> int:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            return int(
                conn.execute(
                    "SELECT (SELECT COUNT(*) FROM queue_messages) + "
                    "(SELECT COUNT(*) FROM conversation_endpoints)"
                ).fetchone()[0]
            )

    async def gone() -> bool:
        return (
            not await client.view("queue_messages", queue="Answered")
            and rows_of_conversation() == 0
        )

    await wait_until(gone, 15)
    assert await client.view("conversation_endpoints") == []


async def test_leak_views_show_endpoints_by_state_and_age_and_the_oldest_waiting(
    client: BrokerClient,
) -> None:
    handles = await begin(client, 5)
    for handle in handles[:3]:
        await client.send(handle, "DEFAULT", b"unread")
    await client.send(handles[0], "DEFAULT", b"unread too")
    ages = await client.view("endpoint_ages")
    by_state = {(r["state"], r["age"]): r["endpoints"] for r in ages}
    # five initiators (three have sent) and the three targets their messages began
    assert by_state == {("CO", "under 1 min"): 6, ("SO", "under 1 min"): 2}

    async def acknowledged() -> bool:  # the first messages went by the transmission queue
        return all(
            r["waiting_in"] != "transmission_queue" for r in await client.view("oldest_waiting")
        )

    await wait_until(acknowledged, 10)
    waiting = await client.view("oldest_waiting")
    assert len(waiting) == 3 and all(r["waiting_in"] == "queue Answered" for r in waiting)
    assert [r["oldest_enqueued_at"] for r in waiting] == sorted(
        r["oldest_enqueued_at"] for r in waiting
    )
    assert sorted(r["waiting"] for r in waiting) == [1, 1, 2]
    assert all(r["oldest_sequence_number"] == 1 for r in waiting)
