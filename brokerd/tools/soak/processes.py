"""The soak's processes: its daemons and its consumer applications, started, killed,
stopped and resumed.

A daemon started again gets a fragment size drawn from ``topology.FRAGMENT_SIZES``
first (from a generator of its own, so the faults a seed draws stay what they were),
and is retried a few times if it does not come up. A consumer is a
``python -m brokerd.tools.soak consume`` process writing its ledger
(``received-<name>.log``); B's follows B's principal. Daemons and consumers die with
the soak however it ends (``setpriv --pdeathsig``, :mod:`brokerd.parent_death`): the
consumers are started from the event loop's thread, the daemons from the default
executor's workers, both kept until the run is over. :class:`Processes` knows which
daemons are down and which consumers stalled; the fault schedule (:mod:`.faults`)
decides when, the driver (:mod:`.driver`) starts everything, heals and stops.

May import: ``brokerd.parent_death``, ``brokerd.tools.launcher``, :mod:`.topology`.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from brokerd.parent_death import DIES_WITH_PARENT
from brokerd.tools.launcher import Deployment
from brokerd.tools.soak import topology

CONSUMERS = {
    "a": ("a", topology.QUEUE_A, topology.DATABASE_A),
    "b": ("b", topology.QUEUE_B, topology.DATABASE_B),
}
"""Consumer name: (daemon, queue, database); its ledger is ``received-<name>.log``."""
LOCAL_CONSUMERS = {
    "l1": ("a", topology.QUEUE_L1, topology.DATABASE_LOCAL),
    "l2": ("a", topology.QUEUE_L2, topology.DATABASE_LOCAL),
}
"""The local stream's consumers: ``l2`` receives its requests, ``l1`` the replies."""


class Processes:
    """The daemons of ``deployment`` and the consumers, as the soak runs them."""

    def __init__(
        self,
        deployment: Deployment,
        workdir: Path,
        ledgers: Path,
        *,
        mirror: bool,
        local: bool,
        seed: int,
        reply_every: int,
        event: Callable[[str], None],
        error: Callable[[str], None],
    ) -> None:
        self.deployment = deployment
        self.workdir = workdir
        """Where the consumers' logs go, and what an error message points to."""
        self.daemons = topology.daemons(mirror)
        self.consumer_specs = dict(CONSUMERS)
        if local:
            self.consumer_specs.update(LOCAL_CONSUMERS)
        self.consumers: dict[str, subprocess.Popen[bytes]] = {}
        self.started: set[str] = set()
        self.down: set[str] = set()
        """Daemons killed and not started again yet."""
        self.stalled: set[str] = set()
        """Consumers stopped (SIGSTOP) and not resumed yet."""
        self._ledgers = ledgers
        self._mirror = mirror
        self._seed = seed
        self._reply_every = reply_every
        self._event = event
        self._error = error
        self._cut_rng = random.Random(f"{seed} fragment sizes")
        """Draws restarts' fragment sizes, apart from the faults' generator so the faults
        a seed draws stay what they were."""

    # -- daemons ---------------------------------------------------------------------

    async def start_daemon(self, name: str) -> None:
        """Start a daemon; a restart gives it a fragment size picked at random first
        (:data:`topology.FRAGMENT_SIZES`)."""
        if name in self.started:
            size = self._cut_rng.choice(topology.FRAGMENT_SIZES)
            topology.set_fragment_size(self.deployment.daemons[name].config_path, size)
            self._event(f"{name} starts again with fragment_size {size}")
        for attempt in range(5):
            try:
                await asyncio.to_thread(self.deployment.start, name)
                self.down.discard(name)
                self.started.add(name)
                return
            except RuntimeError as exc:
                self._error(f"restart of {name} failed (attempt {attempt + 1}): {exc}")
                await asyncio.sleep(1.0)
        raise RuntimeError(f"daemon {name} does not start again; see {self.workdir}")

    def kill_daemon(self, name: str) -> None:
        """SIGKILL a daemon; it is down until started again."""
        self.deployment.kill(name)
        self.down.add(name)

    # -- consumers -------------------------------------------------------------------

    def start_consumer(self, name: str) -> None:
        daemon_name, queue, database = self.consumer_specs[name]
        daemon = self.deployment.daemons[daemon_name]
        partner = []
        if name == "b" and self._mirror:
            b2 = self.deployment.daemons["b2"]
            partner = ["--partner-host", b2.host, "--partner-token-file", str(b2.token_file)]
        log = (self.workdir / f"consumer-{name}.log").open("ab")
        self.consumers[name] = subprocess.Popen(
            [
                *DIES_WITH_PARENT,  # dies with the soak, also when the soak is SIGKILLed
                sys.executable,
                "-m",
                "brokerd.tools.soak",
                "consume",
                "--host",
                daemon.host,
                "--port",
                str(daemon.client_port),
                "--token-file",
                str(daemon.token_file),
                "--queue",
                queue,
                "--database",
                database,
                "--ledger",
                str(self._ledgers / f"received-{name}.log"),
                "--reply-every",
                str(self._reply_every),
                "--seed",
                str(self._seed),
                *partner,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def kill_consumer(self, name: str) -> None:
        """SIGKILL a consumer and reap it."""
        process = self.consumers[name]
        process.kill()
        process.wait()

    def stall_consumer(self, name: str) -> None:
        """SIGSTOP a consumer: a receiver that hangs while holding its transaction."""
        self.consumers[name].send_signal(signal.SIGSTOP)
        self.stalled.add(name)

    def resume(self, name: str) -> None:
        self.stalled.discard(name)
        process = self.consumers[name]
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)

    # -- the end ---------------------------------------------------------------------

    async def heal(self) -> None:
        """Resume the stalled consumers, start again whatever is down."""
        for name in list(self.stalled):
            self.resume(name)
        for name in self.daemons:
            if not self.deployment.daemons[name].running:
                await self.start_daemon(name)
        for name, process in self.consumers.items():
            if process.poll() is not None:
                self.start_consumer(name)

    async def stop(self) -> None:
        """Terminate the consumers (a stalled one is resumed first), stop the daemons."""
        for name, process in self.consumers.items():
            if process.poll() is None:
                if name in self.stalled:
                    process.send_signal(signal.SIGCONT)
                process.terminate()
                try:
                    await asyncio.to_thread(process.wait, 10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        await asyncio.to_thread(self.deployment.stop_all)
