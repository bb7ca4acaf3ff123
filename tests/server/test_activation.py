"""External activation (R-OBJ-3, SPEC §6 Decision on activation): a queue's configured
command is started by the daemon when messages wait and the queue is not drained, never
more than ``max_instances`` at once, reaped when it exits and started again when
messages wait again, and stopped with the daemon. Real daemon (``Solo`` on
127.0.0.1:4022), real processes: ``examples/activated_echo.py`` serves ``Q2`` and
answers each message on its conversation, so ``Q1`` receives one echo per message."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from brokerd.config import parse_config
from brokerd.errors import ConfigError
from brokerd.sdk.client import BrokerClient
from brokerd.server.activation import start_reason
from brokerd.tools.launcher import Deployment
from tests.daemons import SOLO_DATABASE, assert_exactly_once_in_order, drain, running, wait_until

ECHO = Path(__file__).resolve().parents[2] / "examples" / "activated_echo.py"


def _activated(max_instances: int, *args: str) -> str:
    command = ", ".join(f'"{a}"' for a in (sys.executable, str(ECHO), *args))
    return SOLO_DATABASE.replace(
        '[[database.queue]]\nname = "Q2"',
        '[[database.queue]]\nname = "Q2"\n'
        f"activation = {{ command = [{command}], max_instances = {max_instances}, "
        "interval = 0.5, stop_grace = 5 }",
    )


async def _row(client: BrokerClient) -> dict[str, Any]:
    (row,) = await client.view("activation")
    return row


async def _send(client: BrokerClient, dialogs: int, per_dialog: int, tag: str) -> None:
    handles = [(await client.begin_dialog("//solo/S1", "//solo/S2")).handle for _ in range(dialogs)]
    for k in range(per_dialog):
        await client.send_many(
            [(h, "DEFAULT", f"{tag} {n} {k}".encode()) for n, h in enumerate(handles)]
        )


def test_activation_is_needed_when_messages_wait_undrained() -> None:
    """Service Broker's rule: messages ready and nothing running, or messages ready, no
    RECEIVE waiting and none empty lately; never beyond the limit, one start an interval."""
    assert start_reason(0, 0, 2, 0, 99, 99, 1) is None
    assert start_reason(5, 0, 2, 0, 0, 99, 1) == "messages ready and no instance running"
    assert (
        start_reason(5, 1, 2, 0, 99, 99, 1) == "messages ready and the queue is not being drained"
    )
    assert start_reason(5, 1, 2, 1, 99, 99, 1) is None  # a RECEIVE waits: it is drained
    assert start_reason(5, 1, 2, 0, 0.5, 99, 1) is None  # an empty RECEIVE a moment ago
    assert start_reason(5, 2, 2, 0, 99, 99, 1) is None  # the limit
    assert start_reason(5, 0, 2, 0, 99, 0.5, 1) is None  # started a moment ago


def test_activation_config_is_checked(tmp_path: Path) -> None:
    base = """
data_dir = "data"
[endpoint]
certificate = "c.pem"
private_key = "c.key"
ca_certificate = "ca.pem"
[[client.token]]
name = "reader"
file = "reader.token"
role = "application"
queues = ["Q1"]
"""
    ok = parse_config(base + _activated(3), tmp_path / "b.toml")
    (solo,) = [db for db in ok.databases if db.name == "Solo"]
    activation = solo.queues[1].activation
    assert activation is not None and activation.max_instances == 3
    assert activation.command[1] == str(ECHO) and activation.directory == tmp_path
    for bad, says in (
        (_activated(0), "max_instances"),
        (_activated(65), "max_instances"),
        (_activated(1).replace(f'"{sys.executable}", "{ECHO}"', ""), "command"),
        (_activated(1).replace("max_instances", "instances"), "unknown key 'instances'"),
        (_activated(1).replace("interval = 0.5", 'user = "nobody"'), "no [[client.token]]"),
        (_activated(1).replace("interval = 0.5", 'user = "reader"'), "may not RECEIVE"),
    ):
        with pytest.raises(ConfigError, match=r"queue\[1\]\.activation") as caught:
            parse_config(base + bad, tmp_path / "b.toml")
        assert says in str(caught.value)


async def test_external_activation_starts_the_command_within_its_limit(tmp_path: Path) -> None:
    """400 messages on 20 conversations: the echo command is started when they arrive,
    a second instance while the first does not drain the queue, never a third; every
    message is answered exactly once; the instances exit when idle and are started
    again by the next messages; an instance running when the daemon stops is stopped
    with it."""
    d = Deployment(tmp_path)
    args = ("--readers", "1", "--top", "5", "--delay", "0.03", "--timeout", "0.3")
    daemon = d.add("solo", "127.0.0.1", _activated(2, *args))
    with running(d):
        client = await daemon.client()
        assert (await _row(client))["running"] == 0
        await _send(client, 20, 20, "first")
        most = 0

        async def all_answered_so_far() -> bool:
            nonlocal most
            row = await _row(client)
            most = max(most, row["running"])
            assert row["running"] <= 2, row
            queue = [r for r in await client.view("queues") if r["queue"] == "Q2"]
            return queue[0]["ready_messages"] == 0 and row["started"] > 0

        await wait_until(all_answered_so_far, timeout=60, interval=0.05)
        echoes = await drain(client, "Q1", 400, timeout=60)
        assert_exactly_once_in_order(echoes)
        assert sorted(m.message_body for m in echoes) == sorted(
            f"first {n} {k}".encode() for n in range(20) for k in range(20)
        )
        assert most == 2, "a second instance was never started"

        async def all_exited() -> bool:
            row = await _row(client)
            return row["running"] == 0 and row["exited"] == row["started"]

        await wait_until(all_exited, timeout=30)
        first = await _row(client)
        assert first["started"] == 2 and first["start_failures"] == 0

        # started again by the next messages; stopped with the daemon
        await _send(client, 5, 40, "second")

        async def one_running() -> bool:
            row = await _row(client)
            return row["running"] >= 1 and row["started"] > first["started"]

        await wait_until(one_running, timeout=30)
        pids: list[int] = (await _row(client))["pids"]
        (stats,) = await client.view("stats")
        assert stats["activation_starts"] > first["started"]
        await client.close()
        started = time.monotonic()
        d.stop("solo")
        assert time.monotonic() - started < 10
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        log = (daemon.directory / "data" / "activation" / "Solo.Q2.log").read_text()
        assert "messages in" in log  # each instance said what it did as it exited
        daemon_log = daemon.log_path.read_text()
        assert f"pid {pids[0]} exited" in daemon_log


async def test_instances_are_not_started_without_messages(tmp_path: Path) -> None:
    """An activated queue with nothing to receive starts nothing."""
    d = Deployment(tmp_path)
    daemon = d.add("solo", "127.0.0.1", _activated(2))
    with running(d):
        client = await daemon.client()
        dialog = await client.begin_dialog("//solo/S2", "//solo/S1")
        await client.send(dialog.handle, "DEFAULT", uuid.uuid4().bytes)  # to Q1, not Q2
        await asyncio.sleep(1.0)
        assert (await _row(client))["started"] == 0
        await client.close()


async def test_a_command_that_names_python_runs_the_daemons_interpreter(tmp_path: Path) -> None:
    """A command whose first word is ``python3`` (or ``python``) runs with the daemon's own
    interpreter, which has the SDK installed beside it: the program the example
    configuration names runs however ``PATH`` is set (a plain Debian has no ``python``,
    and its ``python3`` has no brokerd)."""
    database = _activated(1).replace(f'"{sys.executable}"', '"python3"')
    assert '"python3"' in database
    d = Deployment(tmp_path)
    daemon = d.add("solo", "127.0.0.1", database)
    with running(d):
        client = await daemon.client()
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        for n in range(3):
            await client.send(dialog.handle, "DEFAULT", f"ping {n}".encode())
        echoes = await drain(client, "Q1", 3, timeout=60)
        assert [m.message_body for m in echoes] == [b"ping 0", b"ping 1", b"ping 2"]
        assert (await _row(client))["started"] >= 1
        await client.close()
