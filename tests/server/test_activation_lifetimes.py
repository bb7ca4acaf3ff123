"""How long an activated instance and what it started live (R-OBJ-3, SPEC §6 Decision on
activation): not beyond a daemon killed with SIGKILL once it starts again, and not
beyond a daemon that stops while it was starting one. Real daemons on 127.0.13.1:4022
and 127.0.13.2:4022, real processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import uvloop

from brokerd.config import ActivationConfig
from brokerd.sdk.client import BrokerClient
from brokerd.server.activation import QueueMonitor, login_for
from brokerd.server.activation_leftovers import RUN_VARIABLE, RunMark, end_marked
from brokerd.tools.launcher import Deployment
from tests.daemons import SOLO_DATABASE, client_of, in_process, running, solo_database, wait_until

HOST = "127.0.13.1"
STOPPING_HOST = "127.0.13.2"
BUSY = 0.3
"""Seconds the daemon's event loop is kept busy while an instance starts."""


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's name (state first), None
    for a process that is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields


def _children(parent: int) -> list[int]:
    """The live processes whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == parent:
                found.append(int(entry.name))
    return found


async def _instance(client: BrokerClient, children: int) -> tuple[int, list[int]]:
    """The pid of the one running instance, once it has started ``children`` processes,
    and theirs."""
    row: dict[str, Any] = {}
    found: list[int] = []

    async def started() -> bool:
        nonlocal row, found
        (row,) = await client.view("activation")
        if row["running"] < 1:
            return False
        found = _children(row["pids"][0])
        return len(found) >= children

    await wait_until(started, timeout=30)
    return int(row["pids"][0]), found


async def test_what_an_instance_started_ends_when_its_killed_daemon_starts_again(
    tmp_path: Path,
) -> None:
    """R-OBJ-3: never more than ``max_instances`` of a queue's command run, and the daemon
    counts only the instances it started. A daemon killed with SIGKILL stops nothing;
    what its instances started (a shell's background job, in the instance's process
    group or in a session of its own) must not run on beside the instances its restart
    starts, as readers of the same queue that no one counts. A process that is not the
    daemon's, although it carries a daemon's mark, is left alone."""
    command = '["sh", "-c", "sleep 300 & setsid sleep 301 & wait"]'
    database = solo_database(
        f"activation = {{ command = {command}, max_instances = 1, interval = 0.3, stop_grace = 2 }}"
    )
    d = Deployment(tmp_path / "deployment")
    daemon = d.add("solo", HOST, database)
    seen: list[int] = []
    stranger = subprocess.Popen(
        ["sleep", "300"],
        env={**os.environ, "BROKERD_ACTIVATION_RUN": "0" * 32},
        start_new_session=True,
    )
    try:
        with running(d):
            client = await daemon.client()
            dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
            await client.send(dialog.handle, "DEFAULT", b"never received")
            first, started = await _instance(client, 2)
            seen += [first, *started]
            await client.close()
            d.kill("solo")

            d.start("solo")  # the message is still ready: the command starts again
            client = await daemon.client()
            second, again = await _instance(client, 2)
            seen += [second, *again]
            await client.close()
            deadline = time.monotonic() + 5
            while any(map(_stat, started)) and time.monotonic() < deadline:
                time.sleep(0.05)
            left = [pid for pid in [first, *started] if _stat(pid) is not None]
            assert not left, f"left running by the killed daemon's instance: {left}"
            assert _stat(stranger.pid) is not None, "a process not the daemon's was killed"
    finally:
        stranger.kill()
        stranger.wait()
        for pid in seen:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def test_a_stop_during_a_start_stops_the_instance_being_started(tmp_path: Path) -> None:
    """R-OBJ-3, SPEC §6 Decision on activation: when the daemon stops, every instance gets
    SIGTERM, and SIGKILL after ``stop_grace`` seconds; the stop ends once they have
    ended. One whose start was under way when the stop began is an instance too: a
    command that ignores SIGTERM is killed once the grace is over, and the stop ends,
    however late in the grace the new process comes to be. Run in the daemon's event
    loop (uvloop), with a grace shorter than the start of a process."""
    asyncio.Runner(loop_factory=uvloop.new_event_loop).run(_stop_during_a_start(tmp_path))


async def _stop_during_a_start(tmp_path: Path) -> None:
    daemon = Deployment(tmp_path / "deployment").add("solo", STOPPING_HOST, SOLO_DATABASE)
    mark = RunMark(tmp_path / "run")
    async with in_process(daemon.config_path) as broker:
        client = await client_of(broker)
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        await client.send(dialog.handle, "DEFAULT", b"never received")
        await client.close()
        ready = broker.databases["Solo"].ready

        async def delivered() -> bool:
            return "Q2" in ready and ready["Q2"].count == 1

        await wait_until(delivered, timeout=10)
        activation = ActivationConfig(
            command=("sh", "-c", 'trap "" TERM; sleep 300'),
            directory=tmp_path,
            interval=60.0,
            stop_grace=0.001,
        )
        monitor = QueueMonitor(
            broker.databases["Solo"],
            "Q2",
            activation,
            login_for(broker.config, activation),
            tmp_path / "Q2.log",
            broker.trace,
            mark,
        )
        try:
            loop = asyncio.get_running_loop()
            monitor.check(loop.time())  # a start under way
            assert monitor.running == 1
            # the loop is busy (a large commit, say) as the process starts: it has ignored
            # SIGTERM, and the grace is over, by the time its start is seen to be done
            loop.call_soon(time.sleep, BUSY)
            async with asyncio.timeout(5):  # in this task: the stop begins now
                await monitor.stop()
            assert (monitor.started, monitor.exited) == (1, 1)
            left = end_marked(f"{RUN_VARIABLE}={mark.token}".encode())
            assert not left, f"left running after the stop: {left}"
        finally:
            end_marked(f"{RUN_VARIABLE}={mark.token}".encode())
