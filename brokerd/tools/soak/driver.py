"""The soak itself: daemons, proxies, consumers, producers, the fault scheduler and
the drain, then the checker's verdict as one JSON-ready summary.

A run starts a fault proxy in front of every hop, the daemons and the consumers
(:mod:`.processes`), then the producers (:mod:`.producers`) and the fault schedule
(:mod:`.faults`). When ``seconds`` are up the faults stop, each producer finishes
the SENDs it has in flight (one stuck on a SEND is cancelled and reported), whatever
is down or stalled is healed, and the queues drain until the checker finds nothing
missing, or until ``drain_timeout`` passes without progress. The checker
(:mod:`.checker`) then reads the ledgers; the summary adds what the faults, the
proxies and the daemons' traces (:mod:`.delivery`) counted, with the local stream's
counts apart (``local``), and is written to ``summary.json``. A SIGTERM or SIGINT
ends the run early as a run ends (everything stopped, a summary that is not clean),
and the daemons and consumers die with the soak if it is killed (:mod:`.processes`).

May import: ``brokerd.tools.faultproxy``, ``protocol.errors`` and the soak's other
modules but :mod:`.consumer`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brokerd.tools.faultproxy import FaultProxy
from brokerd.tools.soak import checker, delivery, topology
from brokerd.tools.soak.clients import Clients, direct
from brokerd.tools.soak.faults import FaultSchedule
from brokerd.tools.soak.processes import Processes
from brokerd.tools.soak.producers import Producers, stop_producers
from protocol.errors import ClientError, RemoteError


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


class Soak:
    def __init__(self, settings: Settings, log: Callable[[str], None] | None = None) -> None:
        self.s = settings
        self.rng = random.Random(settings.seed)
        """Draws the faults and the remote producers' body sizes."""
        self.root = settings.workdir
        self.ledgers = self.root / "ledgers"
        self.deployment = topology.build(
            self.root / "deployment", settings.hosts, mirror=settings.mirror
        )
        self.proxies: dict[str, FaultProxy] = {}
        self.errors: list[str] = []
        self.stuck_producers = 0
        """Producers cancelled because a SEND never returned after the faults stopped."""
        self.interrupted: str | None = None
        """The signal that ended the run early (SIGTERM, SIGINT), if one did."""
        self._ending = False
        self._tasks: list[asyncio.Task[None]] = []
        """The producers and the fault schedule, cancelled at the end if still running."""
        self._events = (self.root / "events.log").open("a", encoding="utf-8")
        self._log = log or (lambda _: None)
        self._t0 = time.monotonic()
        self.processes = Processes(
            self.deployment,
            self.root,
            self.ledgers,
            mirror=settings.mirror,
            local=settings.local_dialogs > 0,
            seed=settings.seed,
            reply_every=settings.reply_every,
            event=self.event,
            error=self.errors.append,
        )
        self.fault_schedule = FaultSchedule(
            settings, self.rng, self.processes, self.proxies, self.event, self.errors.append
        )
        self.load = Producers(settings, self.ledgers, self.rng, self.errors.append)

    def event(self, text: str) -> None:
        line = f"{time.monotonic() - self._t0:8.2f} {text}"
        self._events.write(line + "\n")
        self._events.flush()
        self._log(line)

    # -- the run ----------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        """The run, its end and its summary. SIGTERM or SIGINT ends it early as a run
        ends: producers and faults stop, consumers and daemons are stopped, and the
        summary (not clean: the interruption is an error) is written and returned."""
        loop = asyncio.get_running_loop()
        main = asyncio.current_task()
        assert main is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._interrupt, sig, main)
        clients = Clients(self.deployment, self.s.mirror)
        started = time.monotonic()
        drained, leftover = False, dict[str, int]()
        try:
            drained, leftover = await self._phases(clients)
        except asyncio.CancelledError:
            if self.interrupted is None:
                raise
            main.uncancel()
            self.errors.append(f"interrupted by {self.interrupted}: the run ended early")
            self.event(f"interrupted by {self.interrupted}: stopping")
        finally:
            self._ending = True  # a signal from now on changes nothing: the end is under way
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await clients.close()
            await self._shutdown()
        verdict = checker.check(self.ledgers, self.s.reply_every)
        local: dict[str, Any] = dict(verdict.streams["local"])
        if self.s.local_dialogs > 0:
            traces = self.deployment.daemons["a"].directory / "data" / "traces"
            local["paths"] = delivery.local_paths(traces, topology.DATABASE_LOCAL)
        counts = self.fault_schedule.counts
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
                "large_bodies": self.load.large,
                "settled_sends": self.load.settled,
                "commits_unknown": self.load.commits_unknown,
                "cut_again": delivery.cut_again(
                    [d.directory / "data" / "traces" for d in self.deployment.daemons.values()]
                ),
            },
            "local": local,
            "remote": verdict.streams["remote"],
            "kills": {k: counts[k] for k in ("kill_daemon", "kill_mirror", "kill_consumer")},
            "failovers": counts["failover"],
            "mirror": self.s.mirror,
            "faults": {
                **{k: counts[k] for k in self.s.active_kinds()},
                "failover_skipped": counts["failover_skipped"],
                **proxy_totals,
            },
            "drained": drained,
            "leftover": leftover,
            "consumer_batches": verdict.batches,
            "errors": self.errors[:20],
            **{k: v for k, v in verdict.summary().items() if k in ("violations", "examples")},
            "stuck_producers": self.stuck_producers,
            "interrupted": self.interrupted,
            "error_count": len(self.errors),
            "clean": is_clean(verdict, drained=drained, errors=self.errors),
        }
        (self.root / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def _interrupt(self, sig: signal.Signals, main: asyncio.Task[Any]) -> None:
        if self.interrupted is None and not self._ending:
            self.interrupted = sig.name
            main.cancel()

    async def _phases(self, clients: Clients) -> tuple[bool, dict[str, int]]:
        """Start everything, run the faults, stop the producers, heal and drain: whether
        the queues drained, and what is left in each transmission queue."""
        self.ledgers.mkdir(parents=True, exist_ok=True)
        for hop in topology.hops(self.s.mirror):
            proxy = FaultProxy(
                self.s.hosts.proxy(hop), 4022, topology.proxy_target(self.s.hosts, hop), 4022
            )
            await proxy.start()
            self.proxies[hop] = proxy
        processes, load = self.processes, self.load
        for name in processes.daemons:
            await processes.start_daemon(name)
        for name in processes.consumer_specs:
            processes.start_consumer(name)
        self.event(f"started; seed {self.s.seed}, {self.s.seconds:.0f} s of faults")
        producers = load.start(clients)
        until = time.monotonic() + self.s.seconds
        faults = asyncio.create_task(self.fault_schedule.run(until))
        self._tasks = [*producers, faults]
        while time.monotonic() < until:
            await asyncio.sleep(1.0)
            load.tail()
        await faults
        self.event(f"faults stop; {load.committed} committed, {load.received} received")
        load.stop_producing.set()
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
        return drained, await self._leftover(clients)

    async def _heal(self) -> None:
        """Stop every fault: let a failover finish, clear the plans, resume and restart
        whatever is down."""
        await self.fault_schedule.stop()
        await self.processes.heal()
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

    async def _leftover(self, clients: Clients) -> dict[str, int]:
        """Rows still in each daemon's transmission queue after the drain (0 expected
        once every acknowledgement arrived; a few may still be in flight)."""
        out: dict[str, int] = {}
        for name in self.processes.daemons:
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
        await self.fault_schedule.cancel()
        await self.processes.stop()
        for proxy in self.proxies.values():
            await proxy.stop()
        self._events.close()


def is_clean(verdict: checker.Verdict, *, drained: bool, errors: Sequence[str]) -> bool:
    """A run's verdict: clean only if the checker found no violation, the queues drained,
    nothing unexpected happened (``errors``: a SEND refused, a producer stuck on a SEND,
    a daemon that did not start again, the run interrupted ...) and both streams carried
    traffic (a run that carried nothing proves nothing)."""
    carried = all(verdict.streams[s]["received"] > 0 for s in ("local", "remote"))
    return verdict.clean and drained and not errors and carried


def run(settings: Settings, verbose: bool = False) -> dict[str, Any]:
    settings.workdir.mkdir(parents=True, exist_ok=True)
    log = (lambda line: print(line, file=sys.stderr, flush=True)) if verbose else None
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return asyncio.run(Soak(settings, log).run())
