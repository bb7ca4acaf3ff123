"""The soak itself: daemons, proxies, consumers, producers, the fault scheduler and
the drain, then the checker's verdict as one JSON-ready summary.

Faults (chosen at random intervals by a seeded generator, every kind counted):

* ``kill_daemon``: SIGKILL A, F or B (B's principal, when B is a mirrored pair),
  restarted 0.5-4 s later. Every restart gives the daemon a fragment size drawn from
  ``topology.FRAGMENT_SIZES``, and B's mirror runs with another than its principal, so
  large messages are cut again by a restarted sender or a promoted mirror;
* ``failover`` (mirrored B): SIGKILL B's principal once its mirror is attached and
  holds every unit the principal had revealed, promote the mirror
  (``set_mirror_role(..., "principal")``), restart the old principal 0.5-4 s later
  and demote it (``set_mirror_role(..., "mirror")``) before anything else is done to
  the pair; ``kill_mirror``: SIGKILL B's mirror, restarted 0.5-4 s later (it catches
  up when it attaches again);
* ``kill_consumer``: SIGKILL a consumer process (at any point, including between
  RECEIVE and COMMIT), restarted 0.2-2 s later; ``stall_consumer``: SIGSTOP it for
  1-8 s (a receiver that hangs while holding its transaction);
* on one hop's proxy: ``corrupt`` or ``drop`` 1-3 of the next FRAGMENT frames,
  ``drop_ack`` 1-3 of the next ACK frames, ``delay`` every chunk for 1-5 s,
  ``stall`` the sending side for 1-6 s, ``blackhole`` new and live connections for
  1-6 s (the live ones stay silent: heartbeats and redial must find them), ``cut``
  every connection (TCP reset).

Producers send over long-lived dialogs in both directions (A to B and B to A,
through F): single SENDs, ``send_many`` batches and client transactions of several
SENDs, a few bodies of 100-300 KiB (several fragments). They pause while too many
committed messages wait to be received, so the drain stays bounded. The producers
from B and B's consumer follow B's principal (:mod:`.follow`). When the faults stop,
each producer finishes the SENDs it has in flight; one still waiting after
``drain_timeout`` (a SEND that never returns) is cancelled and reported
(``stuck_producers``, an error, and the run is not clean), so a broker that hangs
still gets a verdict (:func:`stop_producers`).

The local stream (``local_dialogs``, 0: none): dialogs between two services of one
database of A (``//soak/L1`` to ``//soak/L2`` in ``SoakLocal``, :mod:`.topology`).
Its producers SEND mostly outside transactions, one at a time or pipelined
(``send_nowait``, several in flight on a dialog), so after a dialog's first message
they go straight into the target queue (direct delivery, R-DLG-13); a few
``send_many`` batches and client transactions take the transmission queue between
them. A producer moves to a new dialog now and then, so dialogs' first messages keep
coming. Consumers of both local queues (``l2``, and ``l1`` for the replies, which
the consumer sends in its transaction, through the transmission queue) are killed
and stalled like the others, and A is killed like every daemon. The checker judges
the local stream with the others; the summary gives its counts apart (``local``),
with how many of its messages A's traces show delivered directly (:mod:`.delivery`).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brokerd.sdk.client import BrokerClient
from brokerd.tools.faultproxy import FaultPlan, FaultProxy
from brokerd.tools.launcher import Deployment
from brokerd.tools.soak import checker, delivery, topology
from brokerd.tools.soak.follow import Follower
from brokerd.tools.soak.records import LOCAL_STREAM, Ledger, make_body
from protocol.errors import ClientError, NotPrincipal, RemoteError

DIRECTIONS = {
    "ab": ("a", topology.SERVICE_A, topology.SERVICE_B),
    "ba": ("b", topology.SERVICE_B, topology.SERVICE_A),
}
"""Producer direction: (sending daemon, from service, to service)."""
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


@dataclass(frozen=True)
class Settings:
    seconds: float
    seed: int
    workdir: Path
    hosts: topology.Hosts = field(default_factory=topology.Hosts)
    dialogs: int = 6
    """Dialogs per direction at once."""
    local_dialogs: int = 3
    """Dialogs of the local stream at once (inside one database of A); 0: no local stream."""
    large_fraction: float = 0.03
    reply_every: int = 5
    max_backlog: int = 2000
    fault_interval: tuple[float, float] = (0.4, 2.0)
    drain_timeout: float = 180.0
    """Seconds the drain may go without progress."""
    mirror: bool = True
    """B is a mirrored pair (``b`` and ``b2``) with failovers among the faults."""
    kinds: tuple[str, ...] = (
        "kill_daemon",
        "kill_consumer",
        "stall_consumer",
        "corrupt",
        "drop",
        "drop_ack",
        "delay",
        "stall",
        "blackhole",
        "cut",
        "failover",
        "kill_mirror",
    )
    """The fault kinds; ``failover`` and ``kill_mirror`` only with ``mirror``."""

    def active_kinds(self) -> tuple[str, ...]:
        mirror_only = ("failover", "kill_mirror")
        return tuple(k for k in self.kinds if self.mirror or k not in mirror_only)


WEIGHTS = {
    "kill_daemon": 2,
    "kill_consumer": 2,
    "stall_consumer": 1,
    "corrupt": 2,
    "drop": 2,
    "drop_ack": 2,
    "delay": 1,
    "stall": 1,
    "blackhole": 1,
    "cut": 2,
    "failover": 1,
    "kill_mirror": 1,
}


class _Clients:
    """One SDK connection per daemon, dialled again after it breaks. With a mirrored B,
    the connection named ``b`` goes to B's principal, whichever partner that is: it
    moves to the other partner when the connection breaks or a verb answers
    ``not_principal`` (:mod:`.follow`)."""

    def __init__(self, deployment: Deployment, mirror: bool) -> None:
        self._deployment = deployment
        self._clients: dict[str, BrokerClient] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        names = topology.PARTNERS if mirror else topology.PARTNERS[:1]
        partners = [deployment.daemons[n] for n in names]
        self._followers = {
            "b": Follower(
                [(d.host, d.client_port, d.token_file) for d in partners], topology.DATABASE_B
            )
        }

    async def get(self, name: str) -> BrokerClient:
        async with self._locks.setdefault(name, asyncio.Lock()):
            client = self._clients.get(name)
            if client is not None:
                return client
            follower = self._followers.get(name)
            if follower is not None:
                client = await follower.connect(timeout=3)
            else:
                client = await direct(self._deployment, name)
            self._clients[name] = client
            return client

    async def drop(self, name: str, client: BrokerClient, *, moved: bool = False) -> None:
        """Forget a broken connection; ``moved``: it failed as the principal's would not
        (connection lost, ``not_principal``), so the next one tries the other partner."""
        if self._clients.get(name) is client:
            del self._clients[name]
            follower = self._followers.get(name)
            if moved and follower is not None and follower.mirrored:
                follower.switch()
        await client.close()

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()


async def direct(deployment: Deployment, name: str) -> BrokerClient:
    daemon = deployment.daemons[name]
    return await BrokerClient.connect(
        daemon.host, daemon.client_port, token_file=daemon.token_file, timeout=3
    )


class Soak:
    def __init__(self, settings: Settings, log: Callable[[str], None] | None = None) -> None:
        self.s = settings
        self.rng = random.Random(settings.seed)
        self.cut_rng = random.Random(f"{settings.seed} fragment sizes")
        """Draws restarts' fragment sizes, apart from :attr:`rng` so the faults a seed
        draws stay what they were."""
        self.started: set[str] = set()
        self.root = settings.workdir
        self.ledgers = self.root / "ledgers"
        self.deployment = topology.build(
            self.root / "deployment", settings.hosts, mirror=settings.mirror
        )
        self.daemons = topology.daemons(settings.mirror)
        self.principal, self.mirror = topology.PARTNERS
        """B's partners as the soak made them (it alone changes their roles)."""
        self.failing_over: asyncio.Task[None] | None = None
        self.proxies: dict[str, FaultProxy] = {}
        self.consumers: dict[str, subprocess.Popen[bytes]] = {}
        self.consumer_specs = dict(CONSUMERS)
        if settings.local_dialogs > 0:
            self.consumer_specs.update(LOCAL_CONSUMERS)
        self.stalled: set[str] = set()
        self.down: set[str] = set()
        self.faults: Counter[str] = Counter()
        self.errors: list[str] = []
        self.stuck_producers = 0
        """Producers cancelled because a SEND never returned after the faults stopped."""
        self.stop_producing = asyncio.Event()
        self.received = 0
        self.committed = 0
        self.large = 0
        self._offsets: dict[Path, int] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self._events = (self.root / "events.log").open("a", encoding="utf-8")
        self._log = log or (lambda _: None)
        self._t0 = time.monotonic()

    def event(self, text: str) -> None:
        line = f"{time.monotonic() - self._t0:8.2f} {text}"
        self._events.write(line + "\n")
        self._events.flush()
        self._log(line)

    # -- processes -----------------------------------------------------------------

    def _start_consumer(self, name: str) -> None:
        daemon_name, queue, database = self.consumer_specs[name]
        daemon = self.deployment.daemons[daemon_name]
        partner = []
        if name == "b" and self.s.mirror:
            b2 = self.deployment.daemons["b2"]
            partner = ["--partner-host", b2.host, "--partner-token-file", str(b2.token_file)]
        log = (self.root / f"consumer-{name}.log").open("ab")
        self.consumers[name] = subprocess.Popen(
            [
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
                str(self.ledgers / f"received-{name}.log"),
                "--reply-every",
                str(self.s.reply_every),
                "--seed",
                str(self.s.seed),
                *partner,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    async def _start_daemon(self, name: str) -> None:
        """Start a daemon; a restart gives it a fragment size picked at random first
        (:data:`topology.FRAGMENT_SIZES`)."""
        if name in self.started:
            size = self.cut_rng.choice(topology.FRAGMENT_SIZES)
            topology.set_fragment_size(self.deployment.daemons[name].config_path, size)
            self.event(f"{name} starts again with fragment_size {size}")
        for attempt in range(5):
            try:
                await asyncio.to_thread(self.deployment.start, name)
                self.down.discard(name)
                self.started.add(name)
                return
            except RuntimeError as exc:
                self.errors.append(f"restart of {name} failed (attempt {attempt + 1}): {exc}")
                await asyncio.sleep(1.0)
        raise RuntimeError(f"daemon {name} does not start again; see {self.root}")

    def _later(self, delay: float, action: Callable[[], Any]) -> None:
        async def run() -> None:
            await asyncio.sleep(delay)
            result = action()
            if asyncio.iscoroutine(result):
                await result

        task = asyncio.create_task(run())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    # -- faults ------------------------------------------------------------------------

    def _inject(self, kind: str) -> bool:
        rng = self.rng
        if kind == "failover":
            pair_busy = self.failing_over is not None and not self.failing_over.done()
            if pair_busy or {self.principal, self.mirror} & self.down:
                return False
            delay = rng.uniform(0.5, 4.0)
            self.failing_over = asyncio.create_task(self._failover(delay))
            return False  # counted once it happened
        if kind in ("kill_daemon", "kill_mirror"):
            pair_busy = self.failing_over is not None and not self.failing_over.done()
            if kind == "kill_mirror":
                if pair_busy or self.mirror in self.down:
                    return False
                name = self.mirror
            else:
                # B's mirror is kill_mirror's; the pair is left alone during a failover.
                names = [n for n in self.daemons if n not in self.down and n != self.mirror]
                names = [n for n in names if not (pair_busy and n in topology.PARTNERS)]
                if not names:
                    return False
                name = rng.choice(names)
            self.deployment.kill(name)
            self.down.add(name)
            delay = rng.uniform(0.5, 4.0)
            role = ""
            if self.s.mirror and name in topology.PARTNERS:
                role = " (principal)" if name == self.principal else " (mirror)"
            self.event(f"SIGKILL daemon {name}{role}, restart in {delay:.1f} s")
            self._later(delay, lambda: self._start_daemon(name))
            return True
        if kind in ("kill_consumer", "stall_consumer"):
            name = rng.choice(sorted(self.consumer_specs))
            process = self.consumers[name]
            if name in self.stalled or process.poll() is not None:
                return False
            if kind == "kill_consumer":
                process.kill()
                process.wait()
                delay = rng.uniform(0.2, 2.0)
                self.event(f"SIGKILL consumer {name}, restart in {delay:.1f} s")
                self._later(delay, lambda: self._start_consumer(name))
            else:
                process.send_signal(signal.SIGSTOP)
                self.stalled.add(name)
                delay = rng.uniform(1.0, 8.0)
                self.event(f"SIGSTOP consumer {name} for {delay:.1f} s")
                self._later(delay, lambda: self._resume(name))
            return True
        hop = rng.choice(topology.hops(self.s.mirror))
        proxy = self.proxies[hop]
        plan = proxy.plan
        if kind in ("corrupt", "drop"):
            base = proxy.stats.fragments_seen
            chosen = {base + rng.randint(1, 20) for _ in range(rng.randint(1, 3))}
            (plan.corrupt_fragments if kind == "corrupt" else plan.drop_fragments).update(chosen)
            self.event(f"{kind} fragments {sorted(chosen)} on {hop}")
            return True
        if kind == "drop_ack":
            base = proxy.stats.acks_seen
            chosen = {base + rng.randint(1, 10) for _ in range(rng.randint(1, 3))}
            plan.drop_acks.update(chosen)
            self.event(f"drop acks {sorted(chosen)} on {hop}")
            return True
        if kind == "cut":
            proxy.cut()
            self.event(f"cut {hop}")
            return True
        if plan.delay or plan.stall or plan.blackhole:
            return False  # one timed fault per hop at a time
        duration = rng.uniform(1.0, 6.0)
        if kind == "delay":
            plan.delay = rng.uniform(0.01, 0.2)
        elif kind == "stall":
            plan.stall = True
        else:
            plan.blackhole = True
        self.event(f"{kind} {hop} for {duration:.1f} s")
        self._later(duration, lambda: self._clear_timed(plan))
        return True

    def _failover_due(self) -> bool:
        """No failover happened yet, and none is under way."""
        idle = self.failing_over is None or self.failing_over.done()
        return not self.faults["failover"] and idle

    async def _failover(self, delay: float) -> None:
        """Manual failover of B (R-ROUTE-15, R-ROUTE-16), as an operator does it: only
        while the mirror holds everything the principal revealed; SIGKILL the principal,
        promote the mirror, restart the old principal ``delay`` seconds later and demote
        it at once. No other fault touches the pair meanwhile."""
        old, new = self.principal, self.mirror
        if not await self._synchronized(old, new):
            self.faults["failover_skipped"] += 1
            self.event(f"failover skipped: mirror {new} not synchronized with {old}")
            return
        self.deployment.kill(old)
        self.down.add(old)
        began = time.monotonic()
        await self._set_role(new, "principal")
        self.principal, self.mirror = new, old
        self.faults["failover"] += 1
        self.event(
            f"failover {self.faults['failover']}: SIGKILL principal {old}, {new} promoted in "
            f"{time.monotonic() - began:.1f} s; {old} back as mirror in {delay:.1f} s"
        )
        await asyncio.sleep(delay)
        await self._start_daemon(old)
        await self._set_role(old, "mirror")
        self.event(f"{old} restarted and demoted to mirror")

    async def _synchronized(self, principal: str, mirror: str) -> bool:
        """The mirror is attached and has confirmed every unit the principal had written
        when it was first seen attached (R-ROUTE-16: while attached, nothing is revealed
        before the mirror confirms it; before, in exposed mode, commits were revealed
        alone, and the mirror catches up on them after it attaches)."""
        deadline = time.monotonic() + 10.0
        lsn: int | None = None
        while time.monotonic() < deadline:
            try:
                row = await self._mirroring(principal)
                mine = await self._mirroring(mirror)
            except (ClientError, RemoteError, OSError):
                return False
            if not (row["mirror_attached"] and mine["attached_to_principal"]):
                lsn = None
            elif lsn is None:
                lsn = int(row["lsn"])
            elif int(row["confirmed"]) >= lsn:
                return True
            await asyncio.sleep(0.2)
        return False

    async def _mirroring(self, name: str) -> dict[str, Any]:
        client = await direct(self.deployment, name)
        try:
            (row,) = await asyncio.wait_for(client.view("mirroring"), 10)
            return row
        finally:
            await client.close()

    async def _set_role(self, name: str, role: str) -> None:
        for attempt in range(20):
            try:
                client = await direct(self.deployment, name)
                try:
                    await asyncio.wait_for(client.set_mirror_role(topology.DATABASE_B, role), 60)
                    return
                finally:
                    await client.close()
            except (ClientError, RemoteError, OSError, TimeoutError) as exc:
                self.errors.append(f"set_mirror_role {role} on {name} (try {attempt + 1}): {exc}")
                await asyncio.sleep(0.5)
        raise RuntimeError(f"{name} does not take the {role} role; see {self.root}")

    @staticmethod
    def _clear_timed(plan: FaultPlan) -> None:
        plan.delay = 0.0
        plan.stall = False
        plan.blackhole = False

    def _resume(self, name: str) -> None:
        self.stalled.discard(name)
        process = self.consumers[name]
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)

    async def _faults(self, until: float) -> None:
        """Faults drawn by weight until ``until``. With a mirrored B, a failover is due
        once half the time has passed without one: drawn by weight alone, every draw can
        find a partner down (about one short run in fifty had none)."""
        kinds = list(self.s.active_kinds())
        weights = [WEIGHTS[k] for k in kinds]
        halfway = time.monotonic() + (until - time.monotonic()) / 2
        while time.monotonic() < until:
            await asyncio.sleep(self.rng.uniform(*self.s.fault_interval))
            kind = self.rng.choices(kinds, weights)[0]
            if "failover" in kinds and time.monotonic() > halfway and self._failover_due():
                kind = "failover"
            if kind == "kill_daemon" and len(self.down) >= 2:
                continue
            if self._inject(kind):
                self.faults[kind] += 1

    # -- producers ---------------------------------------------------------------------

    def _tail(self) -> None:
        """Count the R lines the consumers appended since the last look (for back-pressure)."""
        for path in self.ledgers.glob("received-*.log"):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read()
            end = data.rfind(b"\n") + 1
            self._offsets[path] = offset + end
            self.received += data[:end].count(b"\nR ") + int(data.startswith(b"R "))

    def _size(self, rng: random.Random) -> int:
        """A body size: mostly up to 2,000 bytes, ``large_fraction`` of 100-300 KiB."""
        if rng.random() < self.s.large_fraction:
            self.large += 1
            return rng.randint(100 * 1024, 300 * 1024)
        return rng.randint(0, 2000)

    async def _send(
        self,
        client: BrokerClient,
        handle: uuid.UUID,
        mode: str,
        batch: list[tuple[str, int]],
        bodies: list[bytes],
        ledger: Ledger,
    ) -> None:
        """SEND ``bodies`` on one dialog as ``mode`` says (``send``: one SEND, ``many``:
        one ``send_many``, ``tx``: a client transaction, ``pipelined``: see
        :meth:`_pipelined`), and write down the outcome: committed (``C``) or refused
        (``F``, the error raised); a broken connection leaves the outcome unknown."""
        if mode == "pipelined":
            await self._pipelined(client, handle, batch, bodies, ledger)
            return
        try:
            if mode == "send":
                await client.send(handle, "DEFAULT", bodies[0])
            elif mode == "many":
                await client.send_many([(handle, "DEFAULT", b) for b in bodies])
            else:
                async with client.transaction() as tx:
                    for body in bodies:
                        await tx.send(handle, "DEFAULT", body)
        except RemoteError:
            ledger.write([f"F {k} {i}" for k, i in batch])
            raise
        ledger.write([f"C {k} {i}" for k, i in batch])
        self.committed += len(batch)

    async def _producer(self, direction: str, slot: int, clients: _Clients) -> None:
        daemon, from_service, to_service = DIRECTIONS[direction]
        ledger = Ledger(self.ledgers / f"sent-{direction}{slot}.log", sync=False)
        rng = random.Random(f"{self.s.seed}/{direction}/{slot}")
        generation = 0
        handle = None
        index = 0
        key = ""
        try:
            while not self.stop_producing.is_set():
                client = await self._producer_client(clients, daemon)
                if client is None:
                    continue
                try:
                    if handle is None:
                        handle = await client.begin_dialog(from_service, to_service, database=None)
                        generation += 1
                        key, index = f"{direction}{slot}.{generation}", 0
                    count = 1 if rng.random() < 0.6 else rng.randint(2, 5)
                    mode = "send" if count == 1 else rng.choice(("many", "tx"))
                    first, index = index, index + count  # never reused, even if it fails
                    await self._send_batch(
                        client, handle, mode, key, first, count, self.rng, rng, ledger
                    )
                except ClientError:
                    await clients.drop(daemon, client, moved=True)
                    await asyncio.sleep(0.1)
                except NotPrincipal:
                    # R-ROUTE-10: this partner is the mirror now; the dialog lives on at
                    # the principal (R-ROUTE-16), so keep it and move there.
                    await clients.drop(daemon, client, moved=True)
                    await asyncio.sleep(0.1)
                except RemoteError as exc:
                    self.errors.append(f"{direction}{slot}: {type(exc).__name__}: {exc}")
                    handle = None  # start a new dialog
                await asyncio.sleep(rng.uniform(0, 0.01))
        finally:
            ledger.close()

    async def _producer_client(self, clients: _Clients, daemon: str) -> BrokerClient | None:
        """The client a producer sends with next, or None after a pause: the backlog is
        over ``max_backlog``, or ``daemon`` cannot be reached now."""
        if self.committed - self.received > self.s.max_backlog:
            await asyncio.sleep(0.2)
            return None
        try:
            return await clients.get(daemon)
        except (ClientError, RemoteError, OSError):
            await asyncio.sleep(0.3)
            return None

    async def _send_batch(
        self,
        client: BrokerClient,
        handle: uuid.UUID,
        mode: str,
        key: str,
        index: int,
        count: int,
        sizes: random.Random,
        rng: random.Random,
        ledger: Ledger,
    ) -> None:
        """Messages ``index .. index + count - 1`` of dialog ``key``: written down as tried
        (``T``), then sent as ``mode`` says (:meth:`_send`). ``sizes`` draws their sizes,
        ``rng`` their bodies."""
        batch = [(key, index + n) for n in range(count)]
        bodies = [make_body(k, i, self._size(sizes), rng) for k, i in batch]
        ledger.write([f"T {k} {i}" for k, i in batch])
        await self._send(client, handle, mode, batch, bodies, ledger)

    async def _local_producer(self, slot: int, clients: _Clients) -> None:
        """The local stream's producer ``slot``: dialogs from ``//soak/L1`` to ``//soak/L2``
        in A's ``SoakLocal``, mostly SENDs outside transactions (direct delivery after a
        dialog's first message, R-DLG-13), some pipelined, a few batched or transacted."""
        stream = f"{LOCAL_STREAM}{slot}"
        ledger = Ledger(self.ledgers / f"sent-{stream}.log", sync=False)
        rng = random.Random(f"{self.s.seed}/{LOCAL_STREAM}/{slot}")
        generation = 0
        handle = None
        index = left = 0
        key = ""
        try:
            while not self.stop_producing.is_set():
                client = await self._producer_client(clients, "a")
                if client is None:
                    continue
                try:
                    if handle is None or left <= 0:
                        handle = await client.begin_dialog(
                            topology.SERVICE_L1,
                            topology.SERVICE_L2,
                            database=topology.DATABASE_LOCAL,
                        )
                        generation += 1
                        key, index = f"{stream}.{generation}", 0
                        left = rng.randint(20, 400)  # then a new dialog: a first message again
                    roll = rng.random()
                    mode = "send" if roll < 0.35 else "pipelined" if roll < 0.85 else "many"
                    count = 1 if mode == "send" else rng.randint(2, 8)
                    if mode == "many" and rng.random() < 0.5:
                        mode = "tx"
                    left -= count
                    first, index = index, index + count  # never reused, even if it fails
                    await self._send_batch(
                        client, handle, mode, key, first, count, rng, rng, ledger
                    )
                except ClientError:
                    await clients.drop("a", client)
                    await asyncio.sleep(0.1)
                except RemoteError as exc:
                    self.errors.append(f"{stream}: {type(exc).__name__}: {exc}")
                    handle = None  # start a new dialog
                await asyncio.sleep(rng.uniform(0, 0.01))
        finally:
            ledger.close()

    async def _pipelined(
        self,
        client: BrokerClient,
        handle: uuid.UUID,
        batch: list[tuple[str, int]],
        bodies: list[bytes],
        ledger: Ledger,
    ) -> None:
        """SEND ``bodies`` on one dialog without waiting between them (``send_nowait``), and
        write down each one's outcome: committed (``C``), refused (``F``), or unknown (the
        connection broke: no line). Raises the first error after all are answered."""
        futures: list[asyncio.Future[int]] = []
        first: BaseException | None = None
        try:
            for body in bodies:
                futures.append(client.send_nowait(handle, "DEFAULT", body))
        except ClientError as exc:
            first = exc  # the rest were never sent
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        lines: list[str] = []
        for (k, i), outcome in zip(batch, outcomes, strict=False):
            if isinstance(outcome, int):
                lines.append(f"C {k} {i}")
                self.committed += 1
            elif isinstance(outcome, RemoteError):
                lines.append(f"F {k} {i}")
            if isinstance(outcome, BaseException) and first is None:
                first = outcome
        ledger.write(lines)
        if first is not None:
            raise first

    # -- the run ----------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        self.ledgers.mkdir(parents=True, exist_ok=True)
        for hop in topology.hops(self.s.mirror):
            proxy = FaultProxy(
                self.s.hosts.proxy(hop), 4022, topology.proxy_target(self.s.hosts, hop), 4022
            )
            await proxy.start()
            self.proxies[hop] = proxy
        clients = _Clients(self.deployment, self.s.mirror)
        started = time.monotonic()
        try:
            for name in self.daemons:
                await self._start_daemon(name)
            for name in self.consumer_specs:
                self._start_consumer(name)
            self.event(f"started; seed {self.s.seed}, {self.s.seconds:.0f} s of faults")
            producers = [
                asyncio.create_task(self._producer(direction, slot, clients))
                for direction in DIRECTIONS
                for slot in range(self.s.dialogs)
            ]
            producers += [
                asyncio.create_task(self._local_producer(slot, clients))
                for slot in range(self.s.local_dialogs)
            ]
            until = time.monotonic() + self.s.seconds
            faults = asyncio.create_task(self._faults(until))
            while time.monotonic() < until:
                await asyncio.sleep(1.0)
                self._tail()
            await faults
            self.event(f"faults stop; {self.committed} committed, {self.received} received")
            self.stop_producing.set()
            stuck = await stop_producers(producers, self.s.drain_timeout)
            if stuck:
                self.stuck_producers = stuck
                self.errors.append(
                    f"{stuck} producers still waited on a SEND {self.s.drain_timeout:g} s after "
                    "the faults stopped (a SEND that never returns): cancelled"
                )
                self.event(f"{stuck} producers stuck on a SEND: cancelled")
            await self._heal()
            drained = await self._drain()
            self.event(f"drain {'complete' if drained else 'timed out'}")
            leftover = await self._leftover(clients)
        finally:
            await clients.close()
            await self._shutdown()
        verdict = checker.check(self.ledgers, self.s.reply_every)
        local: dict[str, Any] = dict(verdict.streams["local"])
        if self.s.local_dialogs > 0:
            traces = self.deployment.daemons["a"].directory / "data" / "traces"
            local["paths"] = delivery.local_paths(traces, topology.DATABASE_LOCAL)
        proxy_totals: Counter[str] = Counter()
        for proxy in self.proxies.values():
            proxy_totals["fragments_corrupted"] += proxy.stats.fragments_corrupted
            proxy_totals["fragments_dropped"] += proxy.stats.fragments_dropped
            proxy_totals["acks_dropped"] += proxy.stats.acks_dropped
            proxy_totals["fragments_seen"] += proxy.stats.fragments_seen
        summary = {
            "seed": self.s.seed,
            "seconds": self.s.seconds,
            "elapsed": round(time.monotonic() - started, 1),
            "workdir": str(self.root),
            "messages": {
                "committed_sends": verdict.committed_sends,
                "uncertain_sends": verdict.uncertain_sends,
                "refused_sends": verdict.refused_sends,
                "replies_expected": verdict.replies_expected,
                "received": verdict.received,
                "large_bodies": self.large,
                "cut_again": delivery.cut_again(
                    [d.directory / "data" / "traces" for d in self.deployment.daemons.values()]
                ),
            },
            "local": local,
            "remote": verdict.streams["remote"],
            "kills": {k: self.faults[k] for k in ("kill_daemon", "kill_mirror", "kill_consumer")},
            "failovers": self.faults["failover"],
            "mirror": self.s.mirror,
            "faults": {
                **{k: self.faults[k] for k in self.s.active_kinds()},
                "failover_skipped": self.faults["failover_skipped"],
                **proxy_totals,
            },
            "drained": drained,
            "leftover": leftover,
            "consumer_batches": verdict.batches,
            "errors": self.errors[:20],
            **{k: v for k, v in verdict.summary().items() if k in ("violations", "examples")},
            "stuck_producers": self.stuck_producers,
            "clean": verdict.clean and drained and not self.stuck_producers,
        }
        (self.root / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    async def _heal(self) -> None:
        """Stop every fault: let a failover finish, clear the plans, resume and restart
        whatever is down."""
        if self.failing_over is not None:
            (outcome,) = await asyncio.gather(self.failing_over, return_exceptions=True)
            if isinstance(outcome, BaseException):
                self.errors.append(f"failover: {type(outcome).__name__}: {outcome}")
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        for proxy in self.proxies.values():
            proxy.plan = FaultPlan()
        for name in list(self.stalled):
            self._resume(name)
        for name in self.daemons:
            if not self.deployment.daemons[name].running:
                await self._start_daemon(name)
        for name, process in self.consumers.items():
            if process.poll() is not None:
                self._start_consumer(name)
        self.event("healed: no faults from now on")

    async def _drain(self) -> bool:
        """Wait until the checker finds nothing missing: give up after ``drain_timeout``
        seconds without progress, or four times that in all."""
        start = last_progress = time.monotonic()
        missing: int | None = None
        while True:
            await asyncio.sleep(5.0)
            verdict = checker.check(self.ledgers, self.s.reply_every)
            now = time.monotonic()
            left = len(verdict.violations["loss"])
            if not left:
                await asyncio.sleep(2.0)  # let late duplicates show, if any
                return True
            if missing is None or left < missing:
                missing, last_progress = left, now
                self.event(f"draining: {left} not received yet")
            if now - last_progress > self.s.drain_timeout or now - start > 4 * self.s.drain_timeout:
                return False

    async def _leftover(self, clients: _Clients) -> dict[str, int]:
        """Rows still in each daemon's transmission queue after the drain (0 expected
        once every acknowledgement arrived; a few may still be in flight)."""
        out: dict[str, int] = {}
        for name in self.daemons:
            try:
                client = await direct(self.deployment, name)
                try:
                    for _ in range(20):
                        rows = await client.transmission_queue()
                        if not rows:
                            break
                        await asyncio.sleep(0.5)
                    out[name] = len(rows)
                finally:
                    await client.close()
            except (ClientError, RemoteError) as exc:
                self.errors.append(f"transmission_queue of {name}: {exc}")
        return out

    async def _shutdown(self) -> None:
        if self.failing_over is not None and not self.failing_over.done():
            self.failing_over.cancel()
            await asyncio.gather(self.failing_over, return_exceptions=True)
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
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
        for proxy in self.proxies.values():
            await proxy.stop()
        self._events.close()


def run(settings: Settings, verbose: bool = False) -> dict[str, Any]:
    settings.workdir.mkdir(parents=True, exist_ok=True)
    log = (lambda line: print(line, file=sys.stderr, flush=True)) if verbose else None
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return asyncio.run(Soak(settings, log).run())


async def stop_producers(producers: list[asyncio.Task[None]], timeout: float) -> int:
    """Wait for the producers to end once told to stop (each finishes the SENDs it has in
    flight); cancel those still waiting after ``timeout`` seconds. A SEND that never
    returns is a fault of the broker (a commit held for ever, for instance): the run
    reports it and goes on to its drain and verdict instead of hanging. Returns how many
    were cancelled; a producer's own failure is raised, as before."""
    if not producers:
        return 0
    done, pending = await asyncio.wait(producers, timeout=timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        task.result()
    return len(pending)
