"""External activation (R-OBJ-3, SPEC §6 Decision on activation) at its edges: a daemon
killed with SIGKILL, a command that leaves a process running as it exits, a queue
whose name makes no file name, a command no program can take. Real daemon on
127.0.0.35:4022, real processes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from brokerd.config import parse_config
from brokerd.errors import ConfigError
from brokerd.sdk.client import BrokerClient
from brokerd.server.activation import log_name
from brokerd.tools.launcher import Deployment
from tests.daemons import running, solo_database, wait_until

HOST = "127.0.0.35"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie left to a container's init does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _forever(tmp_path: Path, max_instances: int) -> str:
    """Queue ``Q2`` activated with a program that serves until it is stopped."""
    program = tmp_path / "forever.py"
    program.write_text("import time\nwhile True:\n    time.sleep(0.2)\n")
    return solo_database(
        f'activation = {{ command = ["{sys.executable}", "{program}"], '
        f"max_instances = {max_instances}, interval = 0.5, stop_grace = 5 }}"
    )


async def _running_pids(client: BrokerClient, count: int) -> list[int]:
    row: dict[str, Any] = {}

    async def started() -> bool:
        nonlocal row
        (row,) = await client.view("activation")
        return bool(row["running"] >= count)

    await wait_until(started, timeout=30)
    return list(row["pids"])


async def test_instances_do_not_outlive_a_killed_daemon(tmp_path: Path) -> None:
    """R-OBJ-3: never more than ``max_instances`` of a queue's command run, and the daemon
    counts only the instances it started. A daemon killed with SIGKILL cannot stop its
    instances: they must go with it, or the restarted daemon, which knows nothing of
    them, starts ``max_instances`` more beside them, readers of the same queue."""
    d = Deployment(tmp_path / "deployment")
    daemon = d.add("solo", HOST, _forever(tmp_path, 1))
    seen: set[int] = set()
    try:
        with running(d):
            client = await daemon.client()
            dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
            await client.send(dialog.handle, "DEFAULT", b"wake up")
            (first,) = await _running_pids(client, 1)
            seen.add(first)
            await client.close()
            d.kill("solo")
            deadline = time.monotonic() + 5
            while _alive(first) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _alive(first), "the instance outlived its daemon's SIGKILL"

            d.start("solo")  # the message is still ready: one instance again, not two
            client = await daemon.client()
            (second,) = await _running_pids(client, 1)
            seen.add(second)
            await client.close()
            assert [pid for pid in seen if _alive(pid)] == [second]
    finally:
        for pid in seen:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def _members(group: int) -> list[int]:
    """The live processes (not zombies) of process group ``group``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            found.append(int(entry.name))
    return found


def _started_pids(log: Path) -> list[int]:
    return [
        int(line.split("(pid ", 1)[1].split(",", 1)[0])
        for line in log.read_text().splitlines()
        if "queue Solo.Q2: started" in line
    ]


async def test_an_instance_is_its_process_group_until_the_group_ends(tmp_path: Path) -> None:
    """R-OBJ-3, SPEC §6 Decision on activation: an instance is its process group, never
    more than ``max_instances`` run, and when the daemon stops every instance stops. A
    command whose first process exits while what it started goes on (a shell that put
    a worker in the background) is still running: the daemon neither starts another
    beside it nor leaves it running when it stops."""
    command = '["sh", "-c", "sleep 300 & exit 0"]'
    database = solo_database(
        f"activation = {{ command = {command}, max_instances = 1, interval = 0.3, stop_grace = 2 }}"
    )
    d = Deployment(tmp_path / "deployment")
    daemon = d.add("solo", HOST, database)
    groups: list[int] = []
    try:
        with running(d):
            client = await daemon.client()
            dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
            await client.send(dialog.handle, "DEFAULT", b"never received")

            async def started() -> bool:
                (row,) = await client.view("activation")
                return bool(row["started"] >= 1)

            await wait_until(started, timeout=30)
            await asyncio.sleep(2.0)  # the message is still ready: interval after interval
            groups = _started_pids(daemon.log_path)
            live = [group for group in groups if _members(group)]
            assert len(live) <= 1, f"{len(live)} instances' groups run, max_instances is 1"
            await client.close()
            d.stop("solo")
            left = {group: _members(group) for group in groups if _members(group)}
            assert not left, f"left running after the daemon stopped: {left}"
    finally:
        for group in _started_pids(daemon.log_path) if daemon.log_path.exists() else groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)


async def test_a_queue_with_a_long_name_is_activated(tmp_path: Path) -> None:
    """R-OBJ-3, SPEC §6 Decision on activation: a queue's command is started when
    messages wait, whatever the queue's name (up to the 1024 bytes a name may have):
    the name of the command's output file must not stop the command from starting."""
    queue = "Orders" * 50  # 300 bytes: more than a file name may have (255)
    database = solo_database(
        f'activation = {{ command = ["{sys.executable}", "-c", "pass"], '
        "max_instances = 1, interval = 0.3, stop_grace = 2 }"
    ).replace('"Q2"', f'"{queue}"')
    d = Deployment(tmp_path / "deployment")
    daemon = d.add("solo", HOST, database)
    with running(d):
        client = await daemon.client()
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        await client.send(dialog.handle, "DEFAULT", b"wake up")

        async def started() -> bool:
            (row,) = await client.view("activation")
            assert row["start_failures"] == 0, daemon.log_tail()
            return bool(row["started"] >= 1)

        await wait_until(started, timeout=30)
        await client.close()


def test_a_command_no_program_can_take_is_refused(tmp_path: Path) -> None:
    """R-OBJ-3: an activation's command is a program and its arguments, run as they are
    written (no shell). A NUL character (``\\u0000`` in TOML) is in no argument a program
    can be given: the daemon's event loop (uvloop) cuts the argument there and runs
    another command line than the one configured; asyncio's own loop raises
    ``ValueError``, outside the start's error handling, and the start then counts as
    running for ever. Refused with the configuration, which names it."""
    config = """
data_dir = "data"
[endpoint]
certificate = "c.pem"
private_key = "c.key"
ca_certificate = "ca.pem"
""" + solo_database(f'activation = {{ command = ["{sys.executable}", "-c", "pass\\u0000"] }}')
    with pytest.raises(ConfigError, match=r"queue\[1\]\.activation\.command") as caught:
        parse_config(config, tmp_path / "b.toml")
    assert "NUL" in str(caught.value)


def _safe_file_name(name: str) -> bool:
    return (
        "/" not in name
        and "\0" not in name
        and name.isprintable()
        and name not in (".", "..")
        and len(name.encode()) <= 255
    )


def test_every_queue_has_a_log_of_its_own() -> None:
    """R-OBJ-3, SPEC §6 Decision on activation: the command of each activated queue has
    its output in a file of its own in ``<data_dir>/activation``. Two queues whose names
    differ give two file names (else both commands write into one log), each one safe
    (one file name, printable, at most 255 bytes) and readable for a plain name."""
    long_queue = "Orders" * 60
    old_digest = hashlib.sha256(b"Solo\0a/b").hexdigest()[:16]
    pairs = [
        ("a.b", "c"),
        ("a", "b.c"),
        ("Solo", "a/b"),
        ("Solo", f"a%2Fb.{old_digest}"),  # the name of the one above, written plainly
        ("Solo", "a%2Fb"),
        ("Solo", "a~b"),
        ("Solo", "line\nbreak"),
        ("Solo", "tab\tname"),
        ("Solo", "."),
        ("Solo", ".."),
        ("Solo", "Очередь"),
        ("Solo", long_queue),
        ("Solo", long_queue + "x"),
        ("Solo", long_queue[:-1] + "y"),
        ("S" * 300, "Q2"),
        ("S" * 300, "Q3"),
    ]
    names = [log_name(database, queue) for database, queue in pairs]
    assert len(set(names)) == len(pairs), names
    assert all(map(_safe_file_name, names)), names
    assert log_name("Solo", "Q2") == "Solo.Q2.log"
    assert log_name("Solo", "orders.v2") == "Solo.orders.v2.log"
