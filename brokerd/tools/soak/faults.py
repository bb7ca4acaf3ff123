"""The soak's fault schedule: which fault, when, and its undoing.

Faults are chosen at random intervals (``fault_interval``) by the seeded generator,
weighted by :data:`WEIGHTS`, and every kind is counted:

* ``kill_daemon``: SIGKILL A, F or B (B's principal, when B is a mirrored pair),
  restarted 0.5-4 s later. Every restart gives the daemon a fragment size drawn from
  ``topology.FRAGMENT_SIZES``, and B's mirror runs with another than its principal, so
  large messages are cut again by a restarted sender or a promoted mirror
  (:mod:`.processes`);
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

Once half the time has passed, a kind not yet injected is due before any other (a
failover among them, with a mirrored B): drawn by weight alone, about half the short runs
missed some kind. The generator is the soak's, whose draws the producers share for their
bodies' sizes (:mod:`.producers`). What a fault does to a process is :mod:`.processes`'.

May import: ``brokerd.sdk``, ``brokerd.tools.faultproxy``, ``protocol.errors``,
:mod:`.topology`, :mod:`.clients`, :mod:`.processes`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from brokerd.tools.faultproxy import FaultPlan, FaultProxy
from brokerd.tools.soak import topology
from brokerd.tools.soak.clients import direct
from brokerd.tools.soak.processes import Processes
from protocol.errors import ClientError, RemoteError

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


class FaultSettings(Protocol):
    """What the schedule reads of the soak's ``Settings``."""

    @property
    def mirror(self) -> bool: ...

    @property
    def fault_interval(self) -> tuple[float, float]: ...

    def active_kinds(self) -> tuple[str, ...]: ...


class FaultSchedule:
    """Draws and injects the faults, undoes the timed ones, and runs B's failovers."""

    def __init__(
        self,
        settings: FaultSettings,
        rng: random.Random,
        processes: Processes,
        proxies: dict[str, FaultProxy],
        event: Callable[[str], None],
        error: Callable[[str], None],
    ) -> None:
        self.counts: Counter[str] = Counter()
        """Faults injected, by kind (and ``failover_skipped``)."""
        self.principal, self.mirror = topology.PARTNERS
        """B's partners as the soak made them (it alone changes their roles)."""
        self.failing_over: asyncio.Task[None] | None = None
        self._settings = settings
        self._rng = rng
        self._processes = processes
        self._proxies = proxies
        """Every hop's proxy, by hop (filled by the driver before the faults start)."""
        self._event = event
        self._error = error
        self._pending: set[asyncio.Task[None]] = set()
        """Restarts and undoings that wait for their time."""

    async def run(self, until: float) -> None:
        """Faults drawn by weight until ``until``. Once half the time has passed, the
        kinds not injected yet are drawn first, so a short run nearly always has every
        kind: drawn by weight alone, about half the short runs (some forty draws) missed
        some kind, and one in twelve a kind its test asserts. A kind drawn first that
        cannot be injected now (a kill of the mirror during a failover, a timed fault on a
        busy hop) gives way to a draw among all kinds in the same turn; a failover that is
        skipped (its mirror not synchronized) stays due."""
        kinds = list(self._settings.active_kinds())
        halfway = time.monotonic() + (until - time.monotonic()) / 2
        while time.monotonic() < until:
            await asyncio.sleep(self._rng.uniform(*self._settings.fault_interval))
            due = self._not_yet(kinds) if time.monotonic() > halfway else []
            if not self._draw(due or kinds) and due:
                self._draw(kinds)

    def _draw(self, pool: list[str]) -> bool:
        """Inject a fault of a kind drawn by weight from ``pool`` (or begin a failover):
        whether it was."""
        kind = self._rng.choices(pool, [WEIGHTS[k] for k in pool])[0]
        if kind == "kill_daemon" and len(self._processes.down) >= 2:
            return False
        if not self._inject(kind):
            return False
        if kind != "failover":  # a failover counts itself once it happened
            self.counts[kind] += 1
        return True

    async def stop(self) -> None:
        """No fault from now on: let a failover finish, drop the restarts and undoings
        still waiting (the driver heals what is down), clear every proxy's plan."""
        if self.failing_over is not None:
            (outcome,) = await asyncio.gather(self.failing_over, return_exceptions=True)
            if isinstance(outcome, BaseException):
                self._error(f"failover: {type(outcome).__name__}: {outcome}")
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        for proxy in self._proxies.values():
            proxy.plan = FaultPlan()

    async def cancel(self) -> None:
        """At shutdown: cancel a failover under way and whatever waits for its time."""
        if self.failing_over is not None and not self.failing_over.done():
            self.failing_over.cancel()
            await asyncio.gather(self.failing_over, return_exceptions=True)
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)

    def _later(self, delay: float, action: Callable[[], Any]) -> None:
        async def run() -> None:
            await asyncio.sleep(delay)
            result = action()
            if asyncio.iscoroutine(result):
                await result

        task = asyncio.create_task(run())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _inject(self, kind: str) -> bool:
        rng = self._rng
        processes = self._processes
        if kind == "failover":
            pair_busy = self.failing_over is not None and not self.failing_over.done()
            if pair_busy or {self.principal, self.mirror} & processes.down:
                return False
            delay = rng.uniform(0.5, 4.0)
            self.failing_over = asyncio.create_task(self._failover(delay))
            return True  # begun: counted once it happened (:meth:`_failover`)
        if kind in ("kill_daemon", "kill_mirror"):
            pair_busy = self.failing_over is not None and not self.failing_over.done()
            if kind == "kill_mirror":
                if pair_busy or self.mirror in processes.down:
                    return False
                name = self.mirror
            else:
                # B's mirror is kill_mirror's; the pair is left alone during a failover.
                names = [
                    n for n in processes.daemons if n not in processes.down and n != self.mirror
                ]
                names = [n for n in names if not (pair_busy and n in topology.PARTNERS)]
                if not names:
                    return False
                name = rng.choice(names)
            processes.kill_daemon(name)
            delay = rng.uniform(0.5, 4.0)
            role = ""
            if self._settings.mirror and name in topology.PARTNERS:
                role = " (principal)" if name == self.principal else " (mirror)"
            self._event(f"SIGKILL daemon {name}{role}, restart in {delay:.1f} s")
            self._later(delay, lambda: processes.start_daemon(name))
            return True
        if kind in ("kill_consumer", "stall_consumer"):
            name = rng.choice(sorted(processes.consumer_specs))
            process = processes.consumers[name]
            if name in processes.stalled or process.poll() is not None:
                return False
            if kind == "kill_consumer":
                processes.kill_consumer(name)
                delay = rng.uniform(0.2, 2.0)
                self._event(f"SIGKILL consumer {name}, restart in {delay:.1f} s")
                self._later(delay, lambda: processes.start_consumer(name))
            else:
                processes.stall_consumer(name)
                delay = rng.uniform(1.0, 8.0)
                self._event(f"SIGSTOP consumer {name} for {delay:.1f} s")
                self._later(delay, lambda: processes.resume(name))
            return True
        hop = rng.choice(topology.hops(self._settings.mirror))
        proxy = self._proxies[hop]
        plan = proxy.plan
        if kind in ("corrupt", "drop"):
            base = proxy.stats.fragments_seen
            chosen = {base + rng.randint(1, 20) for _ in range(rng.randint(1, 3))}
            (plan.corrupt_fragments if kind == "corrupt" else plan.drop_fragments).update(chosen)
            self._event(f"{kind} fragments {sorted(chosen)} on {hop}")
            return True
        if kind == "drop_ack":
            base = proxy.stats.acks_seen
            chosen = {base + rng.randint(1, 10) for _ in range(rng.randint(1, 3))}
            plan.drop_acks.update(chosen)
            self._event(f"drop acks {sorted(chosen)} on {hop}")
            return True
        if kind == "cut":
            proxy.cut()
            self._event(f"cut {hop}")
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
        self._event(f"{kind} {hop} for {duration:.1f} s")
        self._later(duration, lambda: _clear_timed(plan))
        return True

    def _not_yet(self, kinds: list[str]) -> list[str]:
        """The kinds never injected so far; a failover under way is not among them."""
        idle = self.failing_over is None or self.failing_over.done()
        return [k for k in kinds if not self.counts[k] and (k != "failover" or idle)]

    async def _failover(self, delay: float) -> None:
        """Manual failover of B (R-ROUTE-15, R-ROUTE-16), as an operator does it: only
        while the mirror holds everything the principal revealed; SIGKILL the principal,
        promote the mirror, restart the old principal ``delay`` seconds later and demote
        it at once. No other fault touches the pair meanwhile."""
        old, new = self.principal, self.mirror
        if not await self._synchronized(old, new):
            self.counts["failover_skipped"] += 1
            self._event(f"failover skipped: mirror {new} not synchronized with {old}")
            return
        self._processes.kill_daemon(old)
        began = time.monotonic()
        await self._set_role(new, "principal")
        self.principal, self.mirror = new, old
        self.counts["failover"] += 1
        self._event(
            f"failover {self.counts['failover']}: SIGKILL principal {old}, {new} promoted in "
            f"{time.monotonic() - began:.1f} s; {old} back as mirror in {delay:.1f} s"
        )
        await asyncio.sleep(delay)
        await self._processes.start_daemon(old)
        await self._set_role(old, "mirror")
        self._event(f"{old} restarted and demoted to mirror")

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
        client = await direct(self._processes.deployment, name)
        try:
            (row,) = await asyncio.wait_for(client.view("mirroring"), 10)
            return row
        finally:
            await client.close()

    async def _set_role(self, name: str, role: str) -> None:
        for attempt in range(20):
            try:
                client = await direct(self._processes.deployment, name)
                try:
                    await asyncio.wait_for(client.set_mirror_role(topology.DATABASE_B, role), 60)
                    return
                finally:
                    await client.close()
            except (ClientError, RemoteError, OSError, TimeoutError) as exc:
                self._error(f"set_mirror_role {role} on {name} (try {attempt + 1}): {exc}")
                await asyncio.sleep(0.5)
        raise RuntimeError(f"{name} does not take the {role} role; see {self._processes.workdir}")


def _clear_timed(plan: FaultPlan) -> None:
    plan.delay = 0.0
    plan.stall = False
    plan.blackhole = False
