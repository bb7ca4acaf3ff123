"""How a soak run (``python -m brokerd.tools.soak --netns NAME``) ends when it is
killed: its daemons and consumers die with it (SIGKILL), a SIGTERM ends it as a run
ends (everything stopped, a summary that is not clean, exit status 1, its network
namespace deleted), and a namespace a dead run left behind does not keep the next
run with the same name from starting.

Each run is small (no mirror, one dialog per stream) in a network namespace of its own
named ``soakfix-...``; the tests need root and ``ip`` (skipped otherwise)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.tools.soak import netns

pytestmark = pytest.mark.skipif(not netns.available()[0], reason=netns.available()[1])


@pytest.fixture
def name() -> Iterator[str]:
    namespace = f"soakfix-end-{os.getpid()}"
    yield namespace
    for pid in namespace_pids(namespace):
        os.kill(pid, signal.SIGKILL)  # what a failed test left: only this test's run
    subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, check=False)


def namespace_pids(name: str) -> set[int]:
    listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, check=False)
    return {int(p) for p in listed.stdout.split()}


def namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, check=True)
    return {line.split()[0] for line in listed.stdout.decode().splitlines() if line.strip()}


def start(workdir: Path, name: str) -> subprocess.Popen[bytes]:
    command = ["--seconds", "120", "--seed", "1", "--workdir", str(workdir), "--no-mirror"]
    command += ["--dialogs", "1", "--local-dialogs", "1", "--netns", name]
    return subprocess.Popen(
        [sys.executable, "-m", "brokerd.tools.soak", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_started(workdir: Path, run: subprocess.Popen[bytes], timeout: float = 90) -> None:
    """Until the run's daemons and consumers are up (its ``started`` event)."""
    deadline = time.monotonic() + timeout
    events = workdir / "events.log"
    while not (events.exists() and " started; " in events.read_text()):
        if run.poll() is not None:
            _, err = run.communicate()
            pytest.fail(f"the soak ended with {run.returncode}:\n{err.decode()[-3000:]}")
        assert time.monotonic() < deadline, "the soak did not start"
        time.sleep(0.1)


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    """The processes of ``pids`` still alive after ``timeout`` seconds (zombies count as
    gone: they have ended)."""
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = {p for p in alive if _running(p)}
    return alive


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


def test_a_soak_killed_takes_its_daemons_and_consumers_with_it(tmp_path: Path, name: str) -> None:
    run = start(tmp_path, name)
    wait_started(tmp_path, run)
    pids = namespace_pids(name)
    assert len(pids) >= 1 + 3 + 4, pids  # the driver, 3 daemons, 4 consumers
    run.kill()
    run.wait()
    assert wait_gone(pids, 15) == set()


def test_a_namespace_with_processes_in_it_is_refused_naming_them(tmp_path: Path, name: str) -> None:
    subprocess.run(["ip", "netns", "add", name], capture_output=True, check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "60"])
    try:
        run = start(tmp_path, name)
        _, err = run.communicate(timeout=30)
        assert run.returncode == 2 and f"processes {sleeper.pid} in it" in err.decode()
        assert namespace_pids(name) == {sleeper.pid}  # left alone
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_soak_terminated_ends_as_a_run_does_after_a_dead_run_left_its_namespace(
    tmp_path: Path, name: str
) -> None:
    # What a run killed with SIGKILL leaves: its namespace, with no process left in it.
    subprocess.run(["ip", "netns", "add", name], capture_output=True, check=True)
    run = start(tmp_path, name)
    wait_started(tmp_path, run)
    pids = namespace_pids(name)
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 1, err.decode()[-3000:]
    summary = json.loads(out)
    assert summary["interrupted"] == "SIGTERM" and not summary["clean"], summary
    assert any("SIGTERM" in e for e in summary["errors"]), summary["errors"]
    assert name not in namespaces()
    assert wait_gone(pids, 5) == set()
