"""A Spark standalone cluster for ``brokerd analyze --master spark://...``: one master, one worker.

``python -m brokerd.tools.spark_cluster start --dir D`` starts a master and a worker on
``--host`` (127.0.0.1) with PySpark's own launcher (``spark-class``), the way a compose
deployment starts its two services, waits until the worker has registered with the
master, prints the master's URL and returns; the processes keep running in their own
session. ``D`` holds their logs, the worker's work directory and ``cluster.json`` (the
URL, the ports and the pids). ``python -m brokerd.tools.spark_cluster stop --dir D`` stops
both (SIGTERM, SIGKILL after a grace period) and removes ``cluster.json``.

The ports are free ones unless given. Nothing here is imported by the daemon.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from brokerd.errors import AnalyticsError

STATE = "cluster.json"
START_TIMEOUT = 120.0
"""Seconds the master and the worker get to come up (two JVMs on a busy machine)."""
STOP_GRACE = 20.0


@dataclass(frozen=True)
class Cluster:
    """A running cluster, as ``cluster.json`` records it."""

    master_url: str
    host: str
    port: int
    webui_port: int
    master_pid: int
    worker_pid: int

    @classmethod
    def read(cls, directory: Path) -> Cluster:
        try:
            data: dict[str, Any] = json.loads((directory / STATE).read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError) as exc:
            raise AnalyticsError(f"{directory}: no cluster recorded ({exc})") from exc

    def write(self, directory: Path) -> None:
        (directory / STATE).write_text(json.dumps(asdict(self), indent=1) + "\n")


def spark_class() -> Path:
    """PySpark's ``bin/spark-class``: it execs the JVM, so its pid is the JVM's."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _alive_workers(host: str, webui_port: int) -> int:
    """Workers the master counts as alive (its web UI's JSON), 0 when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{host}:{webui_port}/json/", timeout=2) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except (OSError, ValueError, urllib.error.URLError):
        return 0


def _launch(directory: Path, name: str, args: list[str], env: dict[str, str]) -> int:
    with (directory / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(
            [str(spark_class()), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # outlives the command, like a compose service
        )
    return process.pid


def start(
    directory: Path,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    cores: int = 2,
    memory: str = "2g",
    timeout: float = START_TIMEOUT,
) -> Cluster:
    """Start a master and one worker (``cores``, ``memory``); returns once the worker has
    registered. Stops what it started if that does not happen within ``timeout``."""
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / STATE).exists():
        raise AnalyticsError(f"{directory}: a cluster is recorded already (stop it first)")
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": host,
        "SPARK_LOG_DIR": str(directory),
        "SPARK_WORKER_DIR": str(directory / "work"),
    }
    port = port or free_port(host)
    webui = free_port(host)
    url = f"spark://{host}:{port}"
    master = _launch(
        directory,
        "master",
        ["org.apache.spark.deploy.master.Master", "--host", host, "--port", str(port),
         "--webui-port", str(webui)],
        env,
    )  # fmt: skip
    worker = _launch(
        directory,
        "worker",
        ["org.apache.spark.deploy.worker.Worker", url, "--host", host, "--cores", str(cores),
         "--memory", memory, "--webui-port", str(free_port(host)),
         "--work-dir", str(directory / "work")],
        env,
    )  # fmt: skip
    cluster = Cluster(url, host, port, webui, master, worker)
    cluster.write(directory)
    deadline = time.monotonic() + timeout
    while _alive_workers(host, webui) < 1:
        if time.monotonic() > deadline:
            stop(directory)
            raise AnalyticsError(
                f"no worker registered with {url} after {timeout:.0f} s "
                f"(see {directory}/master.log and worker.log)"
            )
        time.sleep(0.5)
    return cluster


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # not our child: nothing to reap
        os.waitpid(pid, os.WNOHANG)


def stop(directory: Path, grace: float = STOP_GRACE) -> None:
    """Stop the cluster recorded in ``directory``: the worker, then the master."""
    cluster = Cluster.read(directory)
    for pid in (cluster.worker_pid, cluster.master_pid):
        if not _running(pid):
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while True:
            _reap(pid)
            if not _running(pid):
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                time.sleep(0.2)
                _reap(pid)
                break
            time.sleep(0.1)
    (directory / STATE).unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m brokerd.tools.spark_cluster", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("start", help="start a master and a worker; print the master URL")
    up.add_argument("--dir", type=Path, required=True, help="logs, work directory, cluster.json")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, help="the master's port (default: a free one)")
    up.add_argument("--cores", type=int, default=2, help="the worker's cores")
    up.add_argument("--memory", default="2g", help="the worker's memory")
    down = commands.add_parser("stop", help="stop the cluster recorded in --dir")
    down.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            cluster = start(
                args.dir, host=args.host, port=args.port, cores=args.cores, memory=args.memory
            )
            print(cluster.master_url)
        else:
            stop(args.dir)
    except AnalyticsError as exc:
        print(f"spark_cluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
