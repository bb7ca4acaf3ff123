"""Running the soak inside a network namespace of its own, so that its daemons'
127.0.0.x:4022 listeners collide with nothing else on the host.

:func:`available` tells whether this process may create one (root and ``ip``);
:func:`run_inside` creates a namespace, brings its loopback up, runs a command in
it with ``ip netns exec`` and deletes it afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence


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


def run_inside(name: str, command: Sequence[str], timeout: float | None = None) -> int:
    """Run ``command`` in a fresh namespace ``name`` (loopback up); delete it afterwards."""
    added = _ip("netns", "add", name)
    if added.returncode != 0:
        raise RuntimeError(f"ip netns add {name}: {added.stderr.decode().strip()}")
    try:
        up = _ip("-n", name, "link", "set", "lo", "up")
        if up.returncode != 0:
            raise RuntimeError(f"loopback of {name}: {up.stderr.decode().strip()}")
        return subprocess.run(
            ["ip", "netns", "exec", name, *command], check=False, timeout=timeout
        ).returncode
    finally:
        _ip("netns", "delete", name)
