"""``python -m brokerd.tools.compose_docker [--cache DIR]``: the compose deployment
(R-OPS-6, :mod:`brokerd.tools.compose`) run for real in Docker, on one machine, without a
registry, a bridge or a firewall rule (docs/deployment.md).

1. The base image: ``debootstrap bookworm`` from the Debian mirror, with Python and Java 17
   in it, packed once as a tarball under ``--cache`` (outside the repository), imported
   with ``docker import``. The project's wheels (``pip wheel``) are cached beside it and
   copied to ``build/wheels`` for an offline image build.
2. The engine: a network namespace of its own with only its loopback up, and ``dockerd``
   started in it by ``nsenter --net`` (``--bridge=none --iptables=false``), its data root
   in the cache (so images are kept between runs) and its socket under ``/run``.
3. ``docker build`` of the ``broker`` and ``spark`` targets, then ``docker-compose`` with
   the host-network override (each service on its own 127.0.0.x) ``up -d``; wait until
   every broker's healthcheck (``/readyz``) says healthy.
4. :func:`drive` (run inside the namespace): orders from the shop through the hub to the
   load-balanced warehouses, both used and every order received once; a reply back through
   the hub; parts messages to the mirrored database, part received at the principal, the
   principal's container killed, the mirror promoted, the rest sent and received there:
   every message exactly once, in order.
5. ``docker-compose run --rm analyze``: ``brokerd analyze`` on the Spark cluster over the
   trace volumes, its audit passing.
6. ``docker-compose down -v``, dockerd stopped, the namespace deleted; then no process,
   mount or interface of the run is left.

May import anything (a tool); never imported by the daemon.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from brokerd.tools import compose
from brokerd.tools.topology import CONTRACT, ORDER, PARTS_SERVICE, SHOP_SERVICE, WAREHOUSE_SERVICE

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = Path("/var/cache/brokerd-compose")
NETNS = "brokerd-compose"
PROJECT = "brokerdcompose"
DOCKER = "/usr/bin/docker"
COMPOSE = "/usr/bin/docker-compose"
BASE_IMAGE = "brokerd-base:bookworm"
BASE_PACKAGES = "python3,python3-venv,openjdk-17-jre-headless,procps"
MIRROR = "http://deb.debian.org/debian"
RUN_DIR = Path("/run/brokerd-compose")
ORDERS = 16
PARTS_BEFORE = 20
PARTS_AFTER = 20

T = TypeVar("T")


def _run(
    args: list[str], *, env: dict[str, str] | None = None, timeout: float = 1800, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)} exited with {done.returncode}:\n{done.stdout[-4000:]}"
            f"\n{done.stderr[-4000:]}"
        )
    return done


@dataclass
class Steps:
    """Each step's name and duration in seconds, printed as it ends."""

    durations: list[tuple[str, float]] = field(default_factory=list)

    def run(self, name: str, step: Callable[[], T]) -> T:
        began = time.monotonic()
        print(f"{name} ...", flush=True)
        result = step()
        took = time.monotonic() - began
        self.durations.append((name, took))
        print(f"{name}: {took:.1f} s", flush=True)
        return result


def base_tarball(cache: Path) -> Path:
    """The debootstrapped bookworm root, packed once in ``cache``."""
    tarball = cache / "bookworm-base.tar"
    if tarball.exists():
        return tarball
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / "rootfs.tmp"
    shutil.rmtree(root, ignore_errors=True)
    _run(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm",
          str(root), MIRROR])  # fmt: skip
    shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
    partial = tarball.with_suffix(".tar.tmp")
    _run(["tar", "-C", str(root), "-cf", str(partial), "."])
    partial.rename(tarball)
    shutil.rmtree(root, ignore_errors=True)
    return tarball


def wheels(cache: Path) -> Path:
    """The project's wheels (and its build backend's), cached, copied to ``build/wheels``;
    made again when the dependencies change (``pyproject.toml`` or ``requirements.lock``)."""
    source = cache / "wheels"
    stamp = source / ".complete"
    wanted = hashlib.sha256(
        b"".join((ROOT / name).read_bytes() for name in ("pyproject.toml", "requirements.lock"))
    ).hexdigest()
    if not stamp.exists() or stamp.read_text().strip() != wanted:
        shutil.rmtree(source, ignore_errors=True)
        source.mkdir(parents=True)
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(source),
              ".[analytics]", "setuptools>=77", "wheel"])  # fmt: skip
        stamp.write_text(wanted)
    target = ROOT / "build" / "wheels"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for wheel in source.glob("*.whl"):
        if not wheel.name.startswith("brokerd-"):  # the image builds the project from source
            shutil.copy2(wheel, target / wheel.name)
    return target


class Engine:
    """dockerd in a network namespace of its own (only its loopback), started with
    ``nsenter --net`` (``ip netns exec`` would hide the cgroups it needs)."""

    def __init__(self, cache: Path, netns: str = NETNS) -> None:
        self.netns = netns
        self.data_root = cache / "docker"
        self.socket = RUN_DIR / "docker.sock"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = cache / "dockerd.log"

    @property
    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            DOCKER_HOST=f"unix://{self.socket}",
            DOCKER_BUILDKIT="0",
            COMPOSE_DOCKER_CLI_BUILD="0",
        )

    def start(self) -> None:
        subprocess.run(["ip", "netns", "add", self.netns], check=False, capture_output=True)
        _run(["ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up"])
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        self.data_root.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                ["nsenter", f"--net=/var/run/netns/{self.netns}", "dockerd",
                 "--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false",
                 "--data-root", str(self.data_root), "--exec-root", str(RUN_DIR / "exec"),
                 "--pidfile", str(RUN_DIR / "docker.pid"), "-H", f"unix://{self.socket}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while subprocess.run([DOCKER, "info"], env=self.env, capture_output=True).returncode:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start; see {self.log}")
            time.sleep(0.5)

    def docker(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        return _run([DOCKER, *args], env=self.env, timeout=timeout)

    def compose(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        files = ["-f", str(compose.COMPOSE_FILE), "-f", str(compose.HOST_OVERRIDE)]
        return _run([COMPOSE, "-p", PROJECT, *files, *args], env=self.env, timeout=timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        # dockerd leaves the bind mount of the host's network namespace behind
        for point in reversed(self._mounts()):
            subprocess.run(["umount", point], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], check=False, capture_output=True)

    def _mounts(self) -> list[str]:
        """Mount points under the engine's data and exec roots, in mount order."""
        roots = (str(self.data_root) + "/", str(RUN_DIR) + "/")
        points = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        return [p for p in points if p.startswith(roots)]

    def leftovers(self) -> list[str]:
        """What the run left behind: mounts under its directories, processes of its
        dockerd, its namespace."""
        out = [f"mount {point}" for point in self._mounts()]
        if self.process is not None and self.process.poll() is None:
            out.append(f"dockerd {self.process.pid}")
        for status in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                if str(self.data_root).encode() in status.read_bytes():
                    out.append(f"process {status.parent.name}")
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        if any(line.split()[0] == self.netns for line in names.splitlines() if line.strip()):
            out.append(f"netns {self.netns}")
        return out


def container(service: str) -> str:
    return f"{PROJECT}_{service}_1"


def wait_healthy(engine: Engine, services: list[str], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    pending = list(services)
    while pending:
        for service in list(pending):
            state = engine.docker(
                "inspect", "-f", "{{.State.Health.Status}}", container(service)
            ).stdout.strip()
            if state == "healthy":
                pending.remove(service)
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"not healthy after {timeout} s: {', '.join(pending)}")
        time.sleep(1)


async def _drive(tokens: Path, deployment: compose.ComposeDeployment) -> dict[str, Any]:
    """The application, run inside the namespace (module docstring, step 4)."""
    from brokerd.sdk.client import BrokerClient
    from brokerd.sdk.messages import ReceivedMessage

    hosts = deployment.hosts

    async def client(name: str) -> BrokerClient:
        return await BrokerClient.connect(
            hosts[name], compose.CLIENT_PORT, token_file=tokens / name
        )

    async def drain(c: BrokerClient, queue: str, n: int, timeout: float = 120) -> list[Any]:
        got: list[ReceivedMessage] = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            got += await c.receive(queue, top=100, timeout=1.0)
        return got

    shop = await client("shop")
    handles = [
        await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT, database="shop")
        for _ in range(ORDERS)
    ]
    for n, handle in enumerate(handles):
        await shop.send(handle, ORDER, f"order {n}".encode())
    warehouses = [await client(f"warehouse-{i}") for i in (1, 2)]
    per_warehouse: list[list[bytes]] = [[], []]
    deadline = time.monotonic() + 120
    while sum(map(len, per_warehouse)) < ORDERS and time.monotonic() < deadline:
        for i, w in enumerate(warehouses):
            got = await w.receive("OrderQueue", top=100, timeout=0.5)
            per_warehouse[i] += [m.message_body for m in got]
            if got and i == 0 and len(per_warehouse[0]) == len(got):
                await w.send(got[0].conversation_handle, ORDER, b"confirmed")
    replies = await drain(shop, "ClientQueue", 1)

    parts = await shop.begin_dialog(SHOP_SERVICE, PARTS_SERVICE, CONTRACT, database="shop")
    bodies = [f"part {i}".encode() for i in range(PARTS_BEFORE + PARTS_AFTER)]
    for body in bodies[:PARTS_BEFORE]:
        await shop.send(parts, ORDER, body)
    principal = await client("parts-principal")
    received = [m.message_body for m in await drain(principal, "PartsQueue", PARTS_BEFORE // 2)]
    await principal.close()
    killed = time.monotonic()
    _run([DOCKER, "kill", container("parts-principal")], env=dict(os.environ))
    mirror = await client("parts-mirror")
    await mirror.set_mirror_role("parts", "principal")
    promoted = time.monotonic() - killed
    for body in bodies[PARTS_BEFORE:]:
        await shop.send(parts, ORDER, body)
    received += [
        m.message_body for m in await drain(mirror, "PartsQueue", len(bodies) - len(received))
    ]
    extra = await mirror.receive("PartsQueue", timeout=1.0)
    for c in (shop, mirror, *warehouses):
        await c.close()
    return {
        "orders_per_warehouse": [len(p) for p in per_warehouse],
        "orders_received_once": sorted(per_warehouse[0] + per_warehouse[1])
        == sorted(f"order {n}".encode() for n in range(ORDERS)),
        "reply_through_hub": [m.message_body for m in replies] == [b"confirmed"],
        "parts_sent": len(bodies),
        "parts_received": len(received) + len(extra),
        "parts_exactly_once_in_order": received == bodies and not extra,
        "failover_seconds": round(promoted, 2),
    }


def fetch_tokens(engine: Engine, directory: Path) -> None:
    """Each broker's admin token (written by the daemon into its data volume)."""
    for broker in compose.ComposeDeployment().topology.brokers:
        token = engine.docker(
            "exec", container(broker.name), "cat", "/var/lib/brokerd/client.token"
        )
        path = directory / broker.name
        path.write_text(token.stdout)
        path.chmod(0o600)


def _audit_lines(report: str) -> list[str]:
    """The audit's verdict and violations from ``brokerd analyze``'s summary."""
    lines = report.splitlines()
    start = next((i for i, line in enumerate(lines) if "exactly-once-in-order audit" in line), None)
    if start is None:
        return []
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def run(cache: Path = DEFAULT_CACHE) -> dict[str, Any]:
    """The whole run (module docstring); what it found, with each step's duration."""
    steps = Steps()
    result: dict[str, Any] = {}
    engine = Engine(cache)
    tarball = steps.run("base image tarball (debootstrap, cached)", lambda: base_tarball(cache))
    steps.run("wheels (cached)", lambda: wheels(cache))
    try:
        steps.run("dockerd in its namespace", engine.start)

        def images() -> None:
            have = subprocess.run([DOCKER, "image", "inspect", BASE_IMAGE], env=engine.env,
                                  capture_output=True).returncode == 0  # fmt: skip
            if not have:
                engine.docker("import", str(tarball), BASE_IMAGE)
            options = "--no-index --find-links /src/build/wheels"
            for target, tag in (("broker", compose.IMAGE), ("spark", compose.SPARK_IMAGE)):
                engine.docker("build", "--network", "host", "--target", target, "-t", tag,
                              "--build-arg", f"BASE={BASE_IMAGE}",
                              "--build-arg", f"PIP_OPTIONS={options}", ".")  # fmt: skip

        steps.run("images built", images)
        brokers = [b.name for b in compose.ComposeDeployment().topology.brokers]

        def up() -> None:
            engine.compose("up", "-d", "--no-build")
            wait_healthy(engine, brokers)

        steps.run("compose up, every broker healthy", up)
        with tempfile.TemporaryDirectory() as tokens:
            fetch_tokens(engine, Path(tokens))
            driven = steps.run(
                "application through the hub, principal killed",
                lambda: _run(
                    ["ip", "netns", "exec", engine.netns, sys.executable, "-m",
                     "brokerd.tools.compose_docker", "drive", tokens],
                    env=engine.env, timeout=600,
                ),
            )  # fmt: skip
        result["drive"] = json.loads(driven.stdout.strip().splitlines()[-1])
        print(json.dumps(result["drive"]), flush=True)

        def analyze() -> subprocess.CompletedProcess[str]:
            # exit 1 is a failed audit: recorded, not raised
            return subprocess.run(
                [COMPOSE, "-p", PROJECT, "-f", str(compose.COMPOSE_FILE),
                 "-f", str(compose.HOST_OVERRIDE), "run", "--rm", "analyze"],
                env=engine.env, cwd=ROOT, capture_output=True, text=True, timeout=1200,
                check=False,
            )  # fmt: skip

        job = steps.run("Spark job over the trace volumes", analyze)
        (cache / "analyze.log").write_text(job.stdout + job.stderr)
        kept = cache / "traces"
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir()
        for broker in brokers:  # kept for a look after the volumes are gone
            engine.docker("cp", f"{container(broker)}:{compose.TRACE_DIR}", str(kept / broker))
        result["analyze_exit"] = job.returncode
        result["audit"] = _audit_lines(job.stdout)
        result["analyze_output"] = f"{cache / 'analyze.log'}: {job.stdout[-2000:]}"
    finally:
        with contextlib.suppress(Exception):
            steps.run("compose down -v", lambda: engine.compose("down", "-v", "--timeout", "20"))
        steps.run("dockerd stopped, namespace deleted", engine.stop)
    result["leftovers"] = engine.leftovers()
    result["steps"] = steps.durations
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brokerd.tools.compose_docker")
    parser.add_argument("action", nargs="?", choices=("run", "drive"), default="run")
    parser.add_argument("tokens", nargs="?", type=Path, help="drive: the tokens' directory")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    if args.action == "drive":
        found = asyncio.run(_drive(args.tokens, compose.ComposeDeployment()))
        print(json.dumps(found))
        return 0
    result = run(args.cache)
    print(json.dumps(result, indent=2))
    return 0 if result["drive"]["parts_exactly_once_in_order"] else 1


if __name__ == "__main__":
    sys.exit(main())
