"""``brokerctl`` at its edges, run as an operator runs it against a real daemon (one
database, ``Solo``, on 127.0.0.197): a queue's messages (R-OBJ-3) page after page, a
rollback's reason of several lines in the ``quarantined`` view, ``--json`` of the commands
that change the daemon, a locale that is not UTF-8, the time ``watch`` prints, and
``brokerctl trace`` (R-REPORT-2) of a dialog inside one daemon and of one that sent
nothing."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.tools.launcher import Deployment
from tests.commands import brokerctl
from tests.daemons import solo_database

HOST = "127.0.0.197"
MESSAGES = 520
"""More than a page (500 rows): the queue is read page after page."""
REASON = "Traceback (most recent call last):\n  File 'x'\nValueError: bad\x1b[31m order"
"""A rollback's reason with line breaks and an escape sequence."""
NOT_UTF8 = {"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
"""A locale whose standard output is ASCII."""


async def _client(d: Deployment) -> BrokerClient:
    return await d.daemons["solo"].client()


async def _fill(d: Deployment) -> None:
    """``MESSAGES`` dialogs from //solo/S1, one message each, waiting in Q2; the first one's
    message rolled back until its conversation is quarantined, with :data:`REASON`."""
    client = await _client(d)
    try:
        for n in range(MESSAGES):
            handle = await client.begin_dialog("//solo/S1", "//solo/S2", "DEFAULT")
            await client.send(handle, "DEFAULT", f"order {n}".encode())
        for _ in range(5):
            tx = await client.begin_transaction()
            assert await tx.receive("Q2", top=1, timeout=5)
            await tx.rollback(reason=REASON)
        deadline = time.monotonic() + 10
        while not await client.view("quarantined"):
            assert time.monotonic() < deadline, "no conversation was quarantined"
            await asyncio.sleep(0.1)
    finally:
        await client.close()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    d = Deployment(tmp_path_factory.mktemp("ctl-edges"))
    d.add("solo", HOST, solo_database())
    try:
        d.start("solo")
        asyncio.run(_fill(d))
        yield d
    finally:
        d.stop_all()


@pytest.fixture
def config(deployment: Deployment) -> str:
    return str(deployment.daemons["solo"].config_path)


def ok(*args: str, env: dict[str, str] | None = None) -> str:
    done = brokerctl(*args, env=env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def ok_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json"))


def test_queue_lists_every_message_as_a_table_and_as_json(config: str) -> None:
    """``brokerctl queue QUEUE`` prints the queue's rows, all of them (R-OBJ-3)."""
    rows = ok_json("--config", config, "queue", "Q2")
    assert len(rows) == MESSAGES
    assert len({(r["conversation_handle"], r["message_sequence_number"]) for r in rows}) == MESSAGES
    assert {r["queue"] for r in rows} == {"Q2"} and {r["status"] for r in rows} <= {0, 1}
    table = ok("--config", config, "queue", "Q2").splitlines()
    assert table[0].split()[:5] == ["database", "queue", "handle", "group", "seq"]
    assert len(table) == 1 + MESSAGES
    assert {r["conversation_handle"][-8:] for r in rows} == {line.split()[2] for line in table[1:]}


def test_a_reason_of_several_lines_stays_in_its_row(config: str) -> None:
    """A row is one line: a line break or an escape sequence in a cell is shown escaped."""
    [row] = ok_json("--config", config, "quarantined")
    assert row["last_error"] == REASON  # --json: the daemon's value, unchanged
    for wide in ((), ("--wide",)):
        out = ok("--config", config, "quarantined", *wide)
        header, *body = out.splitlines()
        assert len(body) == 1, out
        assert "\x1b" not in out
        assert body[0].split()[-1] == str(row["messages_set_aside"])
        assert header.split()[-1] == "messages_set_aside"
    wide_out = ok("--config", config, "--wide", "quarantined")
    assert "recent call last):\\n  File 'x'\\nValueError: bad\\x1b[31m order" in wide_out


def test_json_of_the_commands_that_change_the_daemon(config: str) -> None:
    """``--json`` prints JSON for every command, those that create a route or release a
    quarantine too."""
    made = ok_json("--config", config, "route", "create", "Solo", "Edge", "--address", "LOCAL")
    assert made["database"] == "Solo" and made["name"] == "Edge" and made["done"] == "created"
    changed = ok_json("--config", config, "route", "alter", "Solo", "Edge", "--service", "//x")
    assert changed["done"] == "altered"
    assert ok_json("--config", config, "route", "drop", "Solo", "Edge")["done"] == "dropped"
    assert "Edge" not in {r["name"] for r in ok_json("--config", config, "routes")}


def test_a_locale_that_is_not_utf8_gets_escapes_not_a_traceback(config: str) -> None:
    """Cut text ends with an ellipsis and ``watch``'s title has a dash: in an ASCII
    locale they are written as escapes."""
    table = ok("--config", config, "quarantined", env=NOT_UTF8)
    assert "\\u2026" in table and len(table.splitlines()) == 2
    screen = ok("--config", config, "watch", "queues", "--count", "1", env=NOT_UTF8)
    assert "Q2" in screen
    assert ok("--config", config, "--json", "queues", env=NOT_UTF8)


def test_watch_prints_the_time_in_utc_as_the_views_do(config: str) -> None:
    """The views' times are UTC, marked ``Z``; ``watch``'s clock is too, whatever the
    machine's time zone."""
    screen = ok(
        "--config", config, "watch", "ages", "--count", "1", env={"TZ": "Asia/Tokyo"}
    ).splitlines()
    stamp = re.search(r"(\d\d):(\d\d):(\d\d)(Z?)$", screen[0])
    assert stamp is not None, screen[0]
    now = datetime.now(UTC)
    shown = int(stamp[1]) * 3600 + int(stamp[2]) * 60 + int(stamp[3])
    utc = now.hour * 3600 + now.minute * 60 + now.second
    assert min((utc - shown) % 86400, (shown - utc) % 86400) < 30, screen[0]
    assert stamp[4] == "Z"
    assert screen[2].split()[-1] == "oldest_created_at" and screen[3].endswith("Z")


def _trace(config: str, *args: str, expect: str) -> str:
    """``brokerctl trace ...`` until the daemon's trace segment holds ``expect``."""
    deadline = time.monotonic() + 15
    while True:
        done = brokerctl("trace", *args, "--config", config)
        assert "Traceback" not in done.stderr
        if expect in done.stdout + done.stderr or time.monotonic() > deadline:
            return done.stdout + done.stderr
        time.sleep(0.2)


async def _conversation_id(client: BrokerClient, handle: uuid.UUID) -> str:
    rows = await client.view("conversation_endpoints")
    return next(str(r["conversation_id"]) for r in rows if r["conversation_handle"] == str(handle))


def test_trace_of_a_dialog_inside_one_daemon(config: str, deployment: Deployment) -> None:
    """Both ends in one daemon: the message's first arrival is not said to arrive again."""

    async def one_message() -> str:
        client = await _client(deployment)
        try:
            handle = await client.begin_dialog("//solo/S2", "//solo/S1", "DEFAULT")
            await client.send(handle, "DEFAULT", b"local")
            assert await client.receive("Q1", top=1, timeout=10)
            return await _conversation_id(client, handle)
        finally:
            await client.close()

    conversation = asyncio.run(one_message())
    out = _trace(config, conversation, "1", expect="received")
    [arrival] = [line for line in out.splitlines() if " fragment_received " in line]
    assert "arrived again" not in arrival, out


def test_trace_of_a_conversation_that_sent_nothing(config: str, deployment: Deployment) -> None:
    """A conversation begun, with no message yet: one line that says so."""

    async def begun() -> str:
        client = await _client(deployment)
        try:
            handle = await client.begin_dialog("//solo/S1", "//solo/S2", "DEFAULT")
            return await _conversation_id(client, handle)
        finally:
            await client.close()

    conversation = asyncio.run(begun())
    done = brokerctl("trace", conversation, "--config", config)
    deadline = time.monotonic() + 15
    while "no trace event" in done.stderr and time.monotonic() < deadline:
        time.sleep(0.2)
        done = brokerctl("trace", conversation, "--config", config)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("brokerctl: error: ") and done.stderr.count("\n") == 1
    assert "None" not in done.stderr and "no message" in done.stderr, done.stderr


def test_quarantine_release_as_json(config: str, deployment: Deployment) -> None:
    """Last: releases the conversation the other tests read."""
    [row] = ok_json("--config", config, "quarantined")
    handle = row["conversation_handle"]
    released = ok_json("--config", config, "quarantine", "release", handle)
    assert released["conversation_handle"] == handle and released["released"] == 1
    assert ok_json("--config", config, "quarantined") == []
