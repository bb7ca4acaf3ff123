"""Running the soak inside a network namespace of its own, so that its daemons'
127.0.0.x:4022 listeners collide with nothing else on the host.

:func:`available` tells whether this process may create one (root and ``ip``);
:func:`run_inside` creates a namespace, brings its loopback up, runs a command in
it with ``ip netns exec`` and deletes it afterwards. The command dies with the
process that runs it (``setpriv --pdeathsig``, :mod:`brokerd.parent_death`), so a
soak killed with SIGKILL leaves no process behind; SIGTERM and SIGINT are passed on
to the command, which ends as a run does, and the namespace is deleted. A namespace
of the same name that a killed run left (it could not delete it) is deleted and
created again when no process is left in it, and refused, naming its processes,
when some are.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from types import FrameType

from brokerd.parent_death import DIES_WITH_PARENT


def _ip(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["ip", *args], capture_output=True, check=False)


def available() -> tuple[bool, str]:
    """Whether ``ip netns add`` works here, and why not if it does not."""
    if shutil.which("ip") is None:
        return False, "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return False, "creating a network namespace needs root"
    probe = f"brokerd-probe-{os.getpid()}"
    added = _ip("netns", "add", probe)
    if added.returncode != 0:
        return False, f"ip netns add failed: {added.stderr.decode().strip()}"
    _ip("netns", "delete", probe)
    return True, ""


def _exists(name: str) -> bool:
    listed = _ip("netns", "list")
    return name in (line.split()[0] for line in listed.stdout.decode().splitlines() if line)


def _add(name: str) -> None:
    """Create namespace ``name``; one left by a run that died is deleted first, if no
    process is left in it."""
    if _exists(name):
        pids = _ip("netns", "pids", name).stdout.decode().split()
        if pids:
            raise RuntimeError(
                f"network namespace {name} exists with processes {' '.join(pids)} in it "
                "(another run of that name?): choose another name, or end them and "
                f"`ip netns delete {name}`"
            )
        print(
            f"network namespace {name} was left by an earlier run, with no process in it: "
            "deleted and created again",
            file=sys.stderr,
            flush=True,
        )
        _ip("netns", "delete", name)
    added = _ip("netns", "add", name)
    if added.returncode != 0:
        raise RuntimeError(f"ip netns add {name}: {added.stderr.decode().strip()}")


def run_inside(name: str, command: Sequence[str]) -> int:
    """Run ``command`` in a fresh namespace ``name`` (loopback up); delete it afterwards.
    SIGTERM and SIGINT received meanwhile are passed on to the command, which is waited
    for; the command gets SIGKILL if this process is killed."""
    _add(name)
    try:
        up = _ip("-n", name, "link", "set", "lo", "up")
        if up.returncode != 0:
            raise RuntimeError(f"loopback of {name}: {up.stderr.decode().strip()}")
        # ip netns exec executes the command in its own place (the same pid): the
        # parent-death signal setpriv set stays with it.
        child = subprocess.Popen([*DIES_WITH_PARENT, "ip", "netns", "exec", name, *command])

        def pass_on(signum: int, _: FrameType | None) -> None:
            if child.poll() is None:
                child.send_signal(signum)

        previous = {s: signal.signal(s, pass_on) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            return child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        _ip("netns", "delete", name)
