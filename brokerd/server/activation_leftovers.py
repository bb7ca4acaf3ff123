"""What the activated instances of a daemon killed with SIGKILL left running, ended when
the daemon starts again (SPEC §6 Decision on activation).

An instance's first process dies with the daemon (``setpriv --pdeathsig KILL``), but the
parent-death signal is not inherited: what the instance started (a shell's background
job, a worker in a session of its own) runs on, and the restarted daemon, which counts
only the instances it starts, would run ``max_instances`` more beside it. So every
instance of one run of the daemon is started with ``BROKERD_ACTIVATION_RUN`` set to a
random token of that run, kept in ``<data_dir>/activation/run``, and inherited by all it
starts; the next run, before it starts any instance, kills (SIGKILL) each process whose
environment (``/proc/<pid>/environ``, as the process was started) holds the previous
run's token, with its process group. The token is what makes a process verifiably the
daemon's: a process group id, or a pid, recorded alone may have been given to another
program since. Not a subreaper: a killed daemon reaps nothing, and its orphans go to
init alive; not a cgroup: a daemon outside a container or a systemd unit may have none
of its own. A process that clears or rewrites its environment and leaves its instance's
process group escapes (as a cgroup-free daemon cannot tell it from any other program).

May import what the server may; it imports nothing of brokerd.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import signal
from pathlib import Path

log = logging.getLogger("brokerd.activation")

RUN_VARIABLE = "BROKERD_ACTIVATION_RUN"
"""The environment variable that marks every process an instance starts."""

PASSES = 5
"""Times the processes are looked for again: one forked while the previous look killed
its parent is in the parent's process group, or else found by the next look."""

_TOKEN = re.compile(r"[0-9a-f]{32}")


class RunMark:
    """The token of this run of the daemon, given to its instances, and the token of the
    previous run, in ``path``, whose instances' leftovers are ended."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.token = secrets.token_hex(16)

    def take_over(self, activates: bool) -> list[int]:
        """Kill what the previous run's instances left running, then record this run's
        token (``activates``: it may start instances) or none. The pids killed."""
        killed: list[int] = []
        try:
            previous = self.path.read_text().strip()
        except FileNotFoundError:
            previous = ""
        if _TOKEN.fullmatch(previous):
            killed = end_marked(f"{RUN_VARIABLE}={previous}".encode())
        if killed:
            log.warning(
                "ended %d processes left running by the activated commands of this "
                "daemon's previous run: pids %s",
                len(killed),
                " ".join(map(str, killed)),
            )
        if activates:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(f"{self.token}\n")
        else:
            self.path.unlink(missing_ok=True)
        return killed

    @property
    def environment(self) -> dict[str, str]:
        return {RUN_VARIABLE: self.token}


def end_marked(mark: bytes) -> list[int]:
    """SIGKILL to each process whose environment has the entry ``mark`` and to its process
    group; the pids found (none where there is no procfs)."""
    found: list[int] = []
    own_group = os.getpgrp()
    for _ in range(PASSES):
        marked = _marked(mark)
        if not marked:
            break
        for pid, group in marked:
            found.append(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if group == own_group:
                    os.kill(pid, signal.SIGKILL)
                else:
                    os.killpg(group, signal.SIGKILL)
    return sorted(set(found))


def _marked(mark: bytes) -> list[tuple[int, int]]:
    """The live processes (pid, process group) whose environment has the entry ``mark``,
    the daemon aside."""
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return []
    own = os.getpid()
    marked = []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            with open(os.path.join(entry.path, "environ"), "rb") as environ:
                if mark not in environ.read().split(b"\0"):
                    continue
            with open(os.path.join(entry.path, "stat"), "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] != b"Z":
            marked.append((int(entry.name), int(fields[2])))
    return marked
