"""External activation (R-OBJ-3, SPEC §6 Decision on activation): the daemon starts a
queue's configured command when the queue has messages that its readers do not drain,
as SQL Server's external activator starts a program on a QUEUE_ACTIVATION event.

One :class:`QueueMonitor` per queue with ``activation`` configured, as Service Broker
keeps one queue monitor per activated queue ("Understanding When Activation
Occurs"). Every :data:`CHECK_EVERY` seconds it decides (:func:`start_reason`):
activation is necessary when the queue has messages ready and no instance of the
command runs, or when it has messages ready, no RECEIVE waits on it and none came
back empty for ``interval`` seconds (the queue is not being drained); it occurs when
fewer than ``max_instances`` run and the last start is ``interval`` seconds old. The
command runs in the configuration file's directory, with the daemon's environment and
``BROKERD_HOST``, ``BROKERD_PORT``, ``BROKERD_TLS`` (``1`` when the client port speaks
TLS), ``BROKERD_USER``, ``BROKERD_TOKEN_FILE``, ``BROKERD_DATABASE``, ``BROKERD_QUEUE``
and ``BROKERD_ACTIVATION_RUN`` (the mark of the daemon's run); its standard output and error go to
``<data_dir>/activation/<database>.<queue>.log`` (:func:`log_name`: a character that
is not printable, or could make two queues share a log, written ``%XX``; a name too long
cut and told apart by a digest). An instance is its
process group: it runs, counted against ``max_instances``, until its command and
whatever the command left running have exited; it is then reaped (its exit in the log,
the trace and the ``activation_exits`` counter) and may be started again; when the
daemon stops, no instance starts any more, and every instance (one being started
included) gets SIGTERM, and SIGKILL after ``stop_grace`` seconds. On
Linux an instance's first process also dies with the daemon (SIGKILL from the kernel,
``PR_SET_PDEATHSIG``), and what it started, which that signal does not reach, is killed
when the daemon starts again, before it starts any instance
(:mod:`.activation_leftovers`): a daemon killed with SIGKILL, which stops nothing, leaves
no instance that its restart would not count, running beside those it starts.

May import what the server may: ``brokerd.dialogs`` (a database's ready index) and below.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokerd.config import ActivationConfig, BrokerConfig
from brokerd.dialogs.endpoints.database import Database
from brokerd.parent_death import DIES_WITH_PARENT
from brokerd.server.activation_leftovers import RunMark
from brokerd.traces.writer import TraceWriter

log = logging.getLogger("brokerd.activation")

CHECK_EVERY = 0.25
"""Seconds between two checks of an activated queue."""

GROUP_POLL = 0.2
"""Seconds between two looks at an instance whose first process exited while others of
its process group run on."""


def start_reason(
    ready: int,
    running: int,
    max_instances: int,
    waiting: int,
    since_empty: float,
    since_start: float,
    interval: float,
) -> str | None:
    """Why another instance is to be started now, None if not. ``ready``: messages ready
    to RECEIVE; ``running``: instances running (or starting); ``waiting``: RECEIVEs
    waiting on the queue; ``since_empty`` and ``since_start``: seconds since a RECEIVE
    came back empty and since the last start."""
    if ready == 0 or running >= max_instances or since_start < interval:
        return None
    if running == 0:
        return "messages ready and no instance running"
    if waiting == 0 and since_empty >= interval:
        return "messages ready and the queue is not being drained"
    return None


@dataclass(frozen=True, slots=True)
class Login:
    """What an activated command is told of the daemon's client port."""

    host: str
    port: int
    tls: bool
    user: str
    token_file: Path


def login_for(config: BrokerConfig, activation: ActivationConfig) -> Login:
    """The client port and the token the command of ``activation`` logs in with: its
    ``user``'s ``[[client.token]]``, or the admin token under a name no token has."""
    client = config.client
    tokens = {token.name: token for token in client.tokens}
    if activation.user is not None:
        token_file = tokens[activation.user].file
        user = activation.user
    else:
        token_file = client.token_file
        user = next(
            name
            for name in ("app", "activation", *(f"activation-{n}" for n in range(len(tokens) + 1)))
            if name not in tokens
        )
    return Login(client.host, client.port, client.tls, user, token_file)


MAX_LOG_NAME = 255
"""Bytes a file name may have (``NAME_MAX``); a name may have 1024."""

LOG_DIGEST_MARK = "~"
"""Put before the digest of a log's name that is too long to be written out in full: no
written out name has it (:func:`_escaped`)."""


def _escaped(name: str, also: str) -> str:
    """``name`` with each character that is not printable, or is ``%``, ``/``,
    :data:`LOG_DIGEST_MARK` or in ``also``, written as ``%XX`` per UTF-8 byte: the same
    name back for an ordinary one, and two names never give one."""
    kept_out = "%/" + LOG_DIGEST_MARK + also
    return "".join(
        ch
        if ch.isprintable() and ch not in kept_out
        else "".join(f"%{byte:02X}" for byte in ch.encode())
        for ch in name
    )


def log_name(database: str, queue: str) -> str:
    """The file, in ``<data_dir>/activation``, of the output of ``queue``'s command:
    ``<database>.<queue>.log``, each name written with :func:`_escaped` (a ``.`` in the
    database's name too, so the first ``.`` ends it: two queues never share a log), a
    printable file name that no ``/`` makes a path. A name longer than
    :data:`MAX_LOG_NAME` bytes is cut and ends with :data:`LOG_DIGEST_MARK` and the
    SHA-256 of the whole, so that a queue whose names make no file name is activated
    still, and writes nowhere outside that directory."""
    whole = f"{_escaped(database, '.')}.{_escaped(queue, '')}"
    plain = f"{whole}.log"
    if len(plain.encode()) <= MAX_LOG_NAME:
        return plain
    ending = f"{LOG_DIGEST_MARK}{hashlib.sha256(whole.encode()).hexdigest()}.log"
    cut = whole.encode()[: MAX_LOG_NAME - len(ending)].decode(errors="ignore")
    return f"{cut}{ending}"


class QueueMonitor:
    """One activated queue: the decision to start its command, and the instances running."""

    def __init__(
        self,
        db: Database,
        queue: str,
        activation: ActivationConfig,
        login: Login,
        log_path: Path,
        trace: TraceWriter,
        mark: RunMark,
    ) -> None:
        self.db = db
        self.queue = queue
        self.activation = activation
        self.log_path = log_path
        self.trace = trace
        self.env = {
            **os.environ,
            "BROKERD_HOST": login.host,
            "BROKERD_PORT": str(login.port),
            "BROKERD_TLS": "1" if login.tls else "0",
            "BROKERD_USER": login.user,
            "BROKERD_TOKEN_FILE": str(login.token_file),
            "BROKERD_DATABASE": db.name,
            "BROKERD_QUEUE": queue,
            **mark.environment,
        }
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        """The instances started, by pid (their process group's id), until their group ends."""
        self.spawns: set[asyncio.Task[asyncio.subprocess.Process | None]] = set()
        """The starts under way: each ends with its process in :attr:`processes`, or none."""
        self.reapers: set[asyncio.Task[None]] = set()
        self.last_start = float("-inf")
        self.started = 0
        self.exited = 0
        self.start_failures = 0
        self.stopping = False

    @property
    def running(self) -> int:
        return len(self.processes) + len(self.spawns)

    def check(self, now: float) -> None:
        """Start an instance if activation is necessary and may occur now."""
        if self.stopping:
            return
        info = self.db.catalog.queues.get(self.queue)
        index = self.db.ready.get(self.queue)
        if info is None or index is None or not info.status:
            return
        reason = start_reason(
            index.count,
            self.running,
            self.activation.max_instances,
            index.waiting,
            now - index.last_empty,
            now - self.last_start,
            self.activation.interval,
        )
        if reason is None:
            return
        self.last_start = now
        loop = asyncio.get_running_loop()
        spawn = loop.create_task(self._spawn(reason))
        self.spawns.add(spawn)
        spawn.add_done_callback(self.spawns.discard)
        reaper = loop.create_task(self._reap(spawn))
        self.reapers.add(reaper)
        reaper.add_done_callback(self.reapers.discard)

    async def _spawn(self, reason: str) -> asyncio.subprocess.Process | None:
        """Start one instance: its process, in :attr:`processes` as soon as it exists."""
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as output:
                process = await asyncio.create_subprocess_exec(
                    *DIES_WITH_PARENT,
                    *command_line(self.activation.command),
                    cwd=self.activation.directory,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            self.start_failures += 1
            log.error(
                "queue %s.%s: cannot start %s: %s",
                self.db.name,
                self.queue,
                self.activation.command[0],
                exc,
            )
            self._emit("activation_failed", reason=str(exc))
            return None
        pid = process.pid
        self.processes[pid] = process
        self.started += 1
        log.info(
            "queue %s.%s: started %s (pid %d, %d running): %s",
            self.db.name,
            self.queue,
            self.activation.command[0],
            pid,
            len(self.processes),
            reason,
        )
        self._emit("activation_started", pid=pid, reason=reason)
        return process

    async def _reap(self, spawn: asyncio.Task[asyncio.subprocess.Process | None]) -> None:
        """Once the instance ``spawn`` starts has exited, and its process group has ended
        too, reap it."""
        process = await spawn
        if process is None:
            return
        pid = process.pid
        code = await process.wait()
        # an instance is its process group: what the command started and left running
        # (a shell's background job) is still the instance, counted against
        # max_instances and stopped with the daemon, until the group ends
        while _group_alive(pid):
            await asyncio.sleep(GROUP_POLL)
        del self.processes[pid]
        self.exited += 1
        how = f"exit code {code}" if code >= 0 else f"signal {-code}"
        log.info("queue %s.%s: pid %d exited (%s)", self.db.name, self.queue, pid, how)
        self._emit("activation_exited", pid=pid, reason=how)

    def _emit(self, event: str, **fields: Any) -> None:
        self.trace.emit(event, database=self.db.name, queue=self.queue, **fields)

    async def stop(self) -> None:
        """SIGTERM to every instance, SIGKILL to those still running after the grace; done
        when every instance's process group has ended.

        No start begins once the stop has; those under way are waited for first (a fork
        and an exec), so that every instance, however late its process came to be, gets
        the same SIGTERM and the same SIGKILL at the end of the same grace. An instance is
        its process group (each starts a session of its own): a command run through a
        shell, and whatever it started, stops with it."""
        self.stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.activation.stop_grace
        if self.spawns:
            await asyncio.wait(self.spawns)
        for process in list(self.processes.values()):
            _signal_group(process, signal.SIGTERM)
        if not self.reapers:
            return
        _, pending = await asyncio.wait(self.reapers, timeout=max(0.0, deadline - loop.time()))
        if pending:
            for process in list(self.processes.values()):
                log.warning(
                    "queue %s.%s: pid %d did not exit within %.0f s of SIGTERM: SIGKILL",
                    self.db.name,
                    self.queue,
                    process.pid,
                    self.activation.stop_grace,
                )
                _signal_group(process, signal.SIGKILL)
            await asyncio.wait(pending)

    def view(self) -> dict[str, Any]:
        return {
            "database": self.db.name,
            "queue": self.queue,
            "command": " ".join(self.activation.command),
            "max_instances": self.activation.max_instances,
            "running": len(self.processes),
            "pids": sorted(self.processes),
            "started": self.started,
            "exited": self.exited,
            "start_failures": self.start_failures,
        }


class ExternalActivation:
    """Every activated queue of the instance, checked every :data:`CHECK_EVERY` s."""

    def __init__(
        self, config: BrokerConfig, databases: dict[str, Database], trace: TraceWriter
    ) -> None:
        self.mark = RunMark(config.data_dir / "activation" / "run")
        self.monitors = [
            QueueMonitor(
                databases[db.name],
                queue.name,
                queue.activation,
                login_for(config, queue.activation),
                config.data_dir / "activation" / log_name(db.name, queue.name),
                trace,
                self.mark,
            )
            for db in config.databases
            for queue in db.queues
            if queue.activation is not None
        ]
        self._task: asyncio.Task[None] | None = None

    def take_over(self) -> None:
        """What the instances of the daemon's previous run left running is killed (a
        daemon killed with SIGKILL stopped nothing; :mod:`.activation_leftovers`), before
        the client port listens and before any instance of this run starts."""
        self.mark.take_over(bool(self.monitors))

    def start(self) -> None:
        if self.monitors:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            for monitor in self.monitors:
                monitor.check(now)
            await asyncio.sleep(CHECK_EVERY)

    async def stop(self) -> None:
        """No more starts; every instance stopped (SIGTERM, then SIGKILL after its grace)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await asyncio.gather(*(monitor.stop() for monitor in self.monitors))

    def view(self) -> list[dict[str, Any]]:
        return [monitor.view() for monitor in self.monitors]

    def stats(self) -> dict[str, int]:
        return {
            "activation_starts": sum(m.started for m in self.monitors),
            "activation_exits": sum(m.exited for m in self.monitors),
            "activation_start_failures": sum(m.start_failures for m in self.monitors),
        }


def _signal_group(process: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    """``sig`` to ``process``'s process group (it leads a session of its own), or to the
    process alone if its group is gone."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)


"""The words put before an instance's command so that it dies (SIGKILL) with the daemon
however the daemon ends (:mod:`brokerd.parent_death`): instances are started from the
event loop's thread, which lasts as long as the daemon. A daemon killed with SIGKILL
signals no instance, and its restart counts only those it starts itself. None where
``setpriv`` is missing (not Linux): there an instance outlives a daemon that is killed."""


def _group_alive(group: int) -> bool:
    """Whether any process of process group ``group`` is left, zombies aside: a member
    orphaned when its leader exited is reaped by init, or by nobody where init does not
    reap (a container's), and a group of zombies has ended."""
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        entries = list(os.scandir("/proc"))
    except OSError:  # no procfs: the signal's answer is all there is
        return True
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat"), "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(group).encode() and fields[0] != b"Z":
            return True
    return False


PYTHON_NAMES = frozenset(("python", "python3"))
"""A command's first word that names the daemon's own interpreter."""


def command_line(command: Sequence[str]) -> list[str]:
    """The command an activation runs: a first word ``python`` (or ``python3``) is the
    daemon's own interpreter (``sys.executable``), so that an activated program finds the
    SDK installed beside the daemon whatever ``PATH`` says (a plain Debian has no
    ``python`` at all)."""
    words = list(command)
    if words and words[0] in PYTHON_NAMES:
        words[0] = sys.executable
    return words
