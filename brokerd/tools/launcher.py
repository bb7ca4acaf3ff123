"""Run several brokerd daemons as real processes on loopback addresses.

Used by the example application (the README's main job), the integration
tests and the benchmarks: it creates a deployment CA and instance
certificates, writes each instance's TOML configuration into a working
directory, starts ``python -m brokerd run`` processes, waits until each listens,
and stops them by PID (SIGTERM, or SIGKILL to simulate a crash).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from brokerd.parent_death import DIES_WITH_PARENT
from brokerd.sdk.client import BrokerClient, Reconnect
from brokerd.tools import certs

STOP_WAIT = 30.0
"""Seconds :meth:`Deployment.stop` waits for a daemon's graceful stop before its SIGKILL: as
long as the compose file's ``stop_grace_period``, more than a stop may take with the
default ``stop_grace`` (activated commands up to their queue's ``stop_grace``,
application requests already read answered for up to 10 s and their replies written
for 2 s more, the traces compacted for 3 s)."""


@dataclass
class Daemon:
    name: str
    host: str
    directory: Path
    config_path: Path
    client_port: int
    client_host: str = ""
    """Where clients dial (default ``host``)."""
    tls_ca_file: Path | None = None
    """The CA that issued the client port's TLS certificate; None: plain TCP."""
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.directory / "brokerd.log"
        self.client_host = self.client_host or self.host

    @property
    def token_file(self) -> Path:
        return self.directory / "data" / "client.token"

    @property
    def address(self) -> str:
        return f"tcp://{self.host}:4022"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def client(
        self,
        user: str = "app",
        token_file: Path | None = None,
        *,
        reconnect: Reconnect | bool = True,
    ) -> BrokerClient:
        """A client logged in as ``user`` with ``token_file`` (default: the admin token);
        ``reconnect`` as ``BrokerClient.connect``'s."""
        return await BrokerClient.connect(
            self.client_host,
            self.client_port,
            user=user,
            token_file=token_file or self.token_file,
            tls_ca_file=self.tls_ca_file,
            reconnect=reconnect,
        )

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return ""


class Deployment:
    """A directory holding certificates, configurations and data of several daemons."""

    def __init__(
        self,
        root: Path,
        retry: dict[str, float] | None = None,
        reconnect: tuple[float, float] = (0.2, 2.0),
        *,
        dies_with_parent: bool = False,
    ) -> None:
        """``retry`` overrides the short test timings of ``[retry]``; ``reconnect`` is
        ``[endpoint]``'s (reconnect_initial, reconnect_max), short by default too.
        ``dies_with_parent``: every daemon gets SIGKILL when the thread that started it
        ends, with its process also by SIGKILL (:mod:`brokerd.parent_death`; not with
        ``detach``)."""
        self.root = root
        self.dies_with_parent = dies_with_parent
        self.root.mkdir(parents=True, exist_ok=True)
        self.cert_dir = root / "certs"
        self.daemons: dict[str, Daemon] = {}
        self.retry = retry or {}
        self.reconnect = reconnect
        self._ca: certs.Issued | None = None
        self._starting = threading.Lock()
        """Held while a daemon's process is checked and spawned (:meth:`start`)."""

    def _ensure_ca(self) -> certs.Issued:
        if self._ca is None:
            if (self.cert_dir / "ca.pem").exists():
                self._ca = certs.read_pair(self.cert_dir, "ca")
            else:
                self._ca = certs.create_ca("brokerd deployment CA")
                certs.write_pair(self.cert_dir, "ca", self._ca)
        return self._ca

    def issue_service(self, service: str) -> tuple[Path, Path]:
        """A service certificate and key for dialog security (R-DLG-14), issued once by the
        deployment CA; their paths (certificate, private key)."""
        ca = self._ensure_ca()
        stem = certs.service_stem(service)
        if not (self.cert_dir / f"{stem}.pem").exists():
            certs.write_pair(self.cert_dir, stem, certs.issue_service(ca, service))
        return self.cert_dir / f"{stem}.pem", self.cert_dir / f"{stem}.key"

    def add(
        self,
        name: str,
        host: str,
        databases_toml: str,
        *,
        client_port: int = 4023,
        endpoint_extra: str = "",
        extra: str = "",
        client_tls: bool = False,
        client_extra: str = "",
    ) -> Daemon:
        """Declare a daemon: certificate and configuration file (not started).

        ``client_tls`` makes the client port speak TLS with the instance certificate
        (issued for ``host``); ``client_extra`` adds lines to ``[client]``."""
        ca = self._ensure_ca()
        if not (self.cert_dir / f"{name}.pem").exists():
            issued = certs.issue_instance(ca, name, alt_names=[host])
            certs.write_pair(self.cert_dir, name, issued)
        directory = self.root / name
        directory.mkdir(parents=True, exist_ok=True)
        retry = {"initial": 1.0, "maximum": 8.0, "ack_delay": 0.01, "delayed_retry": 1.0}
        retry.update(self.retry)
        retry_toml = "\n".join(f"{k} = {v!r}" for k, v in retry.items())
        waits = {"reconnect_initial": self.reconnect[0], "reconnect_max": self.reconnect[1]}
        # The deployment's reconnect waits, unless endpoint_extra sets its own.
        reconnect_toml = "\n".join(
            f"{k} = {float(v)!r}" for k, v in waits.items() if f"{k} =" not in endpoint_extra
        )
        tls_toml = (
            f'tls_certificate = "{self.cert_dir / name}.pem"\n'
            f'tls_private_key = "{self.cert_dir / name}.key"'
            if client_tls
            else ""
        )
        config = f"""# written by brokerd.tools.launcher
data_dir = "data"
{extra}
[endpoint]
host = "{host}"
port = 4022
certificate = "{self.cert_dir / name}.pem"
private_key = "{self.cert_dir / name}.key"
ca_certificate = "{self.cert_dir / "ca.pem"}"
{reconnect_toml}
{endpoint_extra}
[retry]
{retry_toml}

[client]
host = "{host}"
port = {client_port}
{tls_toml}
{client_extra}

{databases_toml}
"""
        path = directory / "brokerd.toml"
        path.write_text(config)
        daemon = Daemon(
            name,
            host,
            directory,
            path,
            client_port,
            tls_ca_file=self.cert_dir / "ca.pem" if client_tls else None,
        )
        self.daemons[name] = daemon
        return daemon

    def start(self, name: str, timeout: float = 20.0, *, detach: bool = False) -> Daemon:
        """Start ``name`` and wait until it listens. ``detach``: in a session of its own, so
        that it outlives the command that started it and its terminal's signals.

        Safe from several threads (the soak starts daemons in threads, and heals one whose
        restart it cancelled while the thread still waits): one process at most per
        daemon, and a call finding it already running still waits until it listens."""
        daemon = self.daemons[name]
        ready = daemon.directory / "ready"
        with self._starting:
            if not daemon.running:
                ready.unlink(missing_ok=True)
                bound = self.dies_with_parent and not detach
                daemon.process = self._spawn(daemon, ready, detach, bound)
            process = daemon.process
        assert process is not None
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if process.poll() is not None:
                raise RuntimeError(
                    f"brokerd {name} exited with {process.returncode}:\n{daemon.log_tail()}"
                )
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise RuntimeError(f"brokerd {name} did not start in {timeout} s")
            time.sleep(0.02)
        return daemon

    @staticmethod
    def _spawn(daemon: Daemon, ready: Path, detach: bool, bound: bool) -> subprocess.Popen[bytes]:
        log = daemon.log_path.open("ab")
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        try:
            return subprocess.Popen(
                [
                    *(DIES_WITH_PARENT if bound else ()),
                    sys.executable,
                    "-m",
                    "brokerd",
                    "run",
                    "--config",
                    str(daemon.config_path),
                    "--ready-file",
                    str(ready),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=detach,
            )
        finally:
            log.close()

    def stop(self, name: str, timeout: float = STOP_WAIT) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not stop in time (:data:`STOP_WAIT`)."""
        daemon = self.daemons[name]
        process = daemon.process
        if process is None or process.poll() is not None:
            return process.returncode if process else None
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()

    def kill(self, name: str) -> None:
        """SIGKILL: the daemon dies without any chance to flush (a crash)."""
        daemon = self.daemons[name]
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()

    def stop_all(self) -> None:
        for name in list(self.daemons):
            self.stop(name)
