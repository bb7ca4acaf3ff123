"""``brokerd cluster up|down|status [DIR]``: the local cluster of
:mod:`brokerd.tools.topology` as real processes, one per loopback address, port 4022.

``up`` makes the deployment CA and certificates (:mod:`brokerd.tools.certs`), writes each
broker's configuration from the topology (:class:`~brokerd.tools.launcher.Deployment`),
starts each daemon in a session of its own, waits until its admin port's ``/readyz``
answers 200, records the members in ``DIR/cluster.json`` and returns them. ``down`` sends
SIGTERM to each recorded pid that is still that broker's process (its command line names
the configuration), waits, and sends SIGKILL after ``timeout``. ``status`` reads each
live member's admin port (``/readyz`` and ``/console.json``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from brokerd.config import load_config
from brokerd.errors import ClusterError
from brokerd.tools.launcher import Deployment
from brokerd.tools.topology import LOCAL, Topology

STATE_FILE = "cluster.json"
READY_TIMEOUT = 30.0
"""Seconds a broker has to become ready once started."""


@dataclass(frozen=True)
class Member:
    """One broker of a cluster that is up, as ``cluster.json`` records it."""

    name: str
    role: str
    host: str
    pid: int
    client_port: int
    admin_url: str
    config: str
    log: str

    @property
    def address(self) -> str:
        return f"tcp://{self.host}:4022"


@dataclass(frozen=True)
class MemberStatus:
    member: Member
    alive: bool
    ready: bool
    queues: list[tuple[str, int]]
    """(database.queue, messages ready)"""
    unacknowledged: int
    connections: int
    """Broker connections open."""


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return int(reply.status), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, ValueError):
        return 0, b""


def _wait_ready(admin_url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _get(f"{admin_url}/readyz")[0] == 200:
            return True
        time.sleep(0.05)
    return False


def alive(member: Member) -> bool:
    """Whether ``member.pid`` runs and is still this broker's daemon (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{member.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return member.config.encode() in cmdline


def read_members(directory: Path) -> list[Member]:
    """The members ``DIR/cluster.json`` records; none if there is no such file."""
    path = directory / STATE_FILE
    if not path.exists():
        return []
    try:
        rows = json.loads(path.read_text())
        return [Member(**row) for row in rows["members"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ClusterError(f"{path} is not a cluster state file: {exc}") from exc


def up(directory: Path, topology: Topology = LOCAL, timeout: float = READY_TIMEOUT) -> list[Member]:
    """Bring the topology up in ``directory``; its members, in the topology's order."""
    directory = directory.absolute()
    running = [m.name for m in read_members(directory) if alive(m)]
    if running:
        raise ClusterError(
            f"the cluster in {directory} is already up ({', '.join(running)}); "
            f"'brokerd cluster down {directory}' first"
        )
    deployment = Deployment(directory)
    for broker in topology.brokers:
        deployment.add(
            broker.name,
            topology.hosts[broker.name],
            topology.databases_toml(broker, topology.hosts.__getitem__),
            endpoint_extra="message_forwarding = true\n" if broker.forwarding else "",
        )
    members: list[Member] = []
    try:
        for broker in topology.brokers:
            try:
                daemon = deployment.start(broker.name, timeout, detach=True)
            except RuntimeError as exc:
                raise ClusterError(str(exc)) from exc
            assert daemon.process is not None
            admin = load_config(daemon.config_path).admin
            if not _wait_ready(admin.url, timeout):
                raise ClusterError(
                    f"{broker.name}: {admin.url}/readyz did not answer 200 in {timeout} s:\n"
                    f"{daemon.log_tail()}"
                )
            members.append(
                Member(
                    broker.name,
                    broker.role,
                    daemon.host,
                    daemon.process.pid,
                    daemon.client_port,
                    admin.url,
                    str(daemon.config_path),
                    str(daemon.log_path),
                )
            )
            _record(directory, members)
    except BaseException:
        deployment.stop_all()
        (directory / STATE_FILE).unlink(missing_ok=True)
        raise
    return members


def _record(directory: Path, members: list[Member]) -> None:
    path = directory / STATE_FILE
    path.write_text(json.dumps({"members": [asdict(m) for m in members]}, indent=2) + "\n")


def down(directory: Path, timeout: float = 20.0) -> list[tuple[Member, str]]:
    """Stop every recorded member (SIGTERM, SIGKILL after ``timeout``); each member with
    what happened: ``stopped``, ``killed`` or ``not running``."""
    directory = directory.absolute()
    members = read_members(directory)
    live = [m for m in members if alive(m)]
    for member in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member.pid, signal.SIGTERM)
    outcome = {m.name: "not running" for m in members}
    deadline = time.monotonic() + timeout
    for member in live:
        while alive(member) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(member):
            with contextlib.suppress(ProcessLookupError):
                os.kill(member.pid, signal.SIGKILL)
            outcome[member.name] = "killed"
        else:
            outcome[member.name] = "stopped"
    for member in live:  # a SIGKILLed one is gone once the kernel says so
        end = time.monotonic() + 5.0
        while alive(member) and time.monotonic() < end:
            time.sleep(0.05)
        if alive(member):
            raise ClusterError(f"{member.name} (pid {member.pid}) did not stop")
    (directory / STATE_FILE).unlink(missing_ok=True)
    return [(m, outcome[m.name]) for m in members]


def status(directory: Path) -> list[MemberStatus]:
    """Each recorded member, read live from its admin port."""
    out = []
    for member in read_members(directory.absolute()):
        running = alive(member)
        ready = running and _get(f"{member.admin_url}/readyz")[0] == 200
        data: dict[str, Any] = {}
        if running:
            code, body = _get(f"{member.admin_url}/console.json")
            if code == 200:
                data = json.loads(body)
        out.append(
            MemberStatus(
                member,
                running,
                ready,
                [
                    (f"{q['database']}.{q['queue']}", int(q["ready_messages"]))
                    for q in data.get("queues", [])
                ],
                int(data.get("transmission_queue_total", 0)),
                sum(1 for c in data.get("connections", []) if c.get("state") == "open"),
            )
        )
    return out
