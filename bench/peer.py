"""The peer broker measured side by side: the reference RabbitMQ set-up of a directory
holding ``setup.sh``, ``bench.py`` and ``teardown.sh`` (two unclustered nodes on
loopback joined by a Shovel, ack-mode on-confirm; see that directory's RESULTS.md).

Nothing of it is copied here: ``setup.sh`` is run (idempotent: it installs the broker
and a virtual environment with pika, and starts the nodes), then its ``bench.py`` runs
one workload per call with the same messages, size, window and prefetch as the brokerd
run, and ``teardown.sh`` stops the nodes. The directory's ``env.sh`` reads
``PEER_BASE`` (the nodes' state) and ``PEER_VENV`` (the interpreter with pika) from
the environment, which is passed through.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.workloads import PEER_STANDS_IN

PEERS = ("rabbitmq",)
ENV_DIR = "BROKERD_PEER_DIR"
"""The environment variable naming the peer's directory when ``--peer-dir`` is not given."""
DEFAULT_VENV = "/tmp/peer-venv"
"""Where the peer's env.sh puts its interpreter unless ``PEER_VENV`` says otherwise."""


@dataclass(frozen=True)
class Peer:
    name: str
    directory: Path

    @property
    def python(self) -> str:
        return str(Path(os.environ.get("PEER_VENV", DEFAULT_VENV)) / "bin" / "python")

    def _script(self, *args: str, timeout: float) -> None:
        # Their output goes to stderr: stdout carries this command's result lines.
        subprocess.run(
            [str(self.directory / args[0]), *args[1:]],
            cwd=self.directory,
            check=True,
            stdout=sys.stderr,
            timeout=timeout,
        )

    def setup(self) -> None:
        self._script("setup.sh", timeout=1800)

    def teardown(self) -> None:
        self._script("teardown.sh", timeout=300)

    def run(
        self,
        workload: str,
        *,
        messages: int,
        size: int,
        window: int,
        prefetch: int,
        warmup: int,
        timeout: float,
    ) -> dict[str, Any]:
        """One run of W1-W4 by the peer's bench.py; its JSON line, labelled.

        W4 is run as the peer's W2 with W4's message count and size (see
        :data:`bench.workloads.PEER_STANDS_IN`); the line names W4, and ``peer_ran``
        what the peer ran, so that the ratio compares the same messages."""
        ran = PEER_STANDS_IN.get(workload, workload)
        command = [self.python, str(self.directory / "bench.py"), "run", "-w", ran]
        if workload == "W3":
            command += ["--large-n", str(messages), "--large-size", str(size)]
            warmup *= 100  # the peer's bench.py takes a hundredth of --warmup for W3
        else:
            command += ["-n", str(messages), "--size", str(size)]
        command += [
            "--window", str(window),
            "--prefetch", str(prefetch),
            "--warmup", str(warmup),
            "--timeout", str(timeout),
            "--runs", "1",
        ]  # fmt: skip
        done = subprocess.run(
            command,
            cwd=self.directory,
            stdout=subprocess.PIPE,
            stderr=sys.stderr,
            text=True,
            timeout=timeout * 2 + 120,
        )
        lines = [t for t in done.stdout.splitlines() if t.startswith("{")]
        if not lines:
            return {
                "workload": workload,
                "messages": messages,
                "size": size,
                "ok": False,
                "problems": [f"the peer's bench.py printed no result (exit {done.returncode})"],
                "broker": self.name,
            }
        line: dict[str, Any] = json.loads(lines[-1])
        line["broker"] = self.name
        # held to brokerd's standard: a message lost or received twice is not a pass
        wrong = [f"{k} {line[k]}" for k in ("lost", "dups", "bad") if line.get(k)]
        if wrong:
            line["ok"] = False
            line["problems"] = [*line.get("problems", []), *wrong]
        if ran != workload:
            line["workload"] = workload
            line["peer_ran"] = ran
        return line


def find(name: str, directory: Path | None) -> Peer:
    """The peer named ``name`` in ``directory`` (default: ``$BROKERD_PEER_DIR``)."""
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r} (known: {', '.join(PEERS)})")
    if directory is None:
        value = os.environ.get(ENV_DIR)
        if not value:
            raise ValueError(f"--peer {name} needs --peer-dir DIR or ${ENV_DIR}")
        directory = Path(value)
    for needed in ("setup.sh", "bench.py", "teardown.sh"):
        if not (directory / needed).is_file():
            raise ValueError(f"{directory} holds no {needed}: not a peer set-up")
    return Peer(name, directory.resolve())
