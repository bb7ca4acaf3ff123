"""``brokerd demo``: everything a newcomer should see, with no configuration.

1. ``brokerd cluster up`` (:mod:`brokerd.tools.cluster`) brings up, in ``./demo`` (an
   earlier run's files there are removed first), the local topology
   (:func:`brokerd.tools.topology.local`) with the application guide's message types and
   contract, and poison-message quarantine after three rollbacks.
2. The application guide's story (``examples/order_processing.py``, reused, not copied:
   :func:`examples.order_processing.tell`) runs against it: the shop's orders go through
   the forwarding hub to the two load-balanced warehouses, both serving the one handler
   with activated readers; a 3 MiB attachment, a timer and an error ending, a poison
   message quarantined and released, activation under load.
3. A mirror failover with nothing lost (R-ROUTE-16): the shop SENDs parts orders, each
   with an idempotency key, to the mirrored ``parts`` database; half-way the principal is
   killed (SIGKILL) and the mirror promoted (``set_mirror_role``); the new principal
   receives every order exactly once, in order.
4. The cluster is stopped (no process is left), and the PySpark analytics
   (:mod:`brokerd.analytics.report`) read every broker's traces and write
   ``demo/report/report.html``;
   the demo prints its path and headline figures: delivered, p50/p99 latency, the audit.

A ``rich`` status line shows the part running; each part prints its outcome. The
example lives in the repository (``examples/``), not in the installed package: run the
demo from a checkout (``./dev demo`` runs ``python -m brokerd demo`` there).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from brokerd.errors import ClusterError
from brokerd.sdk.client import BrokerClient
from brokerd.tools import cluster, cluster_tables
from brokerd.tools.cluster import Member
from brokerd.tools.topology import (
    PARTS_SERVICE,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    Topology,
    local,
)
from examples import order_processing as example

PARTS_ORDERS = 40
"""Parts orders sent across the failover: half before the principal dies, half after."""


@dataclass(frozen=True)
class Headline:
    """The report's figures the demo prints."""

    report: Path
    delivered: int
    p50_ms: float | None
    p99_ms: float | None
    audit: str


DEFAULT_WORKDIR = Path("demo")
"""Where the demo keeps the cluster's files and the report (in the checkout; ignored by git)."""


def run(
    workdir: Path = DEFAULT_WORKDIR,
    *,
    first_address: str = "127.0.0.1",
    orders: int = 300,
    analytics: bool = True,
    console: Console | None = None,
) -> Headline | None:
    """The whole demo; the report's headline, or None with ``analytics`` off. Raises
    (after stopping the cluster) if any part did not behave as it should."""
    out = console or Console(highlight=False)
    example.quiet_logging()
    root = _fresh(workdir)
    topology = _topology(first_address)
    with _phase(out, "bringing up the local cluster (six brokers)"):
        members = cluster.up(root / "cluster", topology)
    try:
        cluster_tables.print_up(members)
        asyncio.run(_story(root / "cluster", members, orders, out))
    finally:
        with _phase(out, "stopping the cluster"):
            stopped = cluster.down(root / "cluster")
        left = _still_running([m.pid for m, _ in stopped])
        out.print(f"cluster stopped: {len(stopped)} brokers, {len(left)} process(es) left")
    if not analytics:
        return None
    with _phase(out, "PySpark: the analytics over every broker's traces"):
        headline = _analyze(root / "cluster", root / "report")
    out.print(
        f"report: {headline.report}\n"
        f"  delivered {headline.delivered:,} messages; latency SEND->delivered "
        f"p50 {headline.p50_ms} ms, p99 {headline.p99_ms} ms\n"
        f"  exactly-once-in-order audit: {headline.audit}"
    )
    return headline


@contextlib.contextmanager
def _phase(out: Console, title: str) -> Iterator[None]:
    """A live status line while the phase runs, then its duration."""
    began = time.monotonic()
    with out.status(title):
        yield
    out.print(f"   [dim]({title}: {time.monotonic() - began:.1f} s)[/dim]")


def _fresh(workdir: Path) -> Path:
    """``workdir`` made ready for a new run: the cluster and report of an earlier run are
    removed (``cluster up`` refuses if that cluster still runs). A recorded pid counts as
    that cluster's only while it is still its broker (:func:`cluster.alive`): after a
    reboot, or once pids wrap, another program may have it."""
    root = workdir.absolute()
    root.mkdir(parents=True, exist_ok=True)
    if not [m for m in cluster.read_members(root / "cluster") if cluster.alive(m)]:
        for part in ("cluster", "report"):
            shutil.rmtree(root / part, ignore_errors=True)
    return root


def _topology(first_address: str) -> Topology:
    """The local cluster, carrying the example's message types and contract."""
    return local(
        first_address,
        message_types=(example.ORDER, example.ATTACHMENT, example.SHIPPED, example.ON_HOLD),
        contract=example.CONTRACT,
        poison_rollbacks=3,
    )


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _still_running(pids: list[int], timeout: float = 10) -> list[int]:
    """The pids still running after ``timeout``: a stopped daemon's exit takes a moment
    after its command line is gone (what ``cluster down`` watches)."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


async def _client(directory: Path, member: Member) -> BrokerClient:
    token = directory / member.name / "data" / "client.token"
    return await BrokerClient.connect(member.host, member.client_port, token_file=token)


async def _story(directory: Path, members: list[Member], orders: int, out: Console) -> None:
    by_name = {m.name: m for m in members}

    @contextlib.asynccontextmanager
    async def step(title: str) -> AsyncIterator[None]:
        with _phase(out, title):
            yield

    shop_client = await _client(directory, by_name["shop"])
    warehouses = [await _client(directory, by_name[n]) for n in ("warehouse-1", "warehouse-2")]
    try:
        shop = example.Shop(shop_client, SHOP_SERVICE, WAREHOUSE_SERVICE, "ClientQueue")
        await example.tell(shop, warehouses, orders=orders, step=step)
        served = [await _received(w) for w in warehouses]
        example.say(
            f"   through the hub: warehouse-1's application received {served[0]} messages, "
            f"warehouse-2's {served[1]} (load balanced by conversation, R-ROUTE-5)"
        )
        if not all(served):
            raise ClusterError(f"one warehouse received nothing ({served}): no load balancing")
        async with step("a mirror failover: the parts database's principal is killed"):
            await _failover(directory, by_name, shop_client)
    finally:
        for client in (shop_client, *warehouses):
            await client.close()


async def _received(client: BrokerClient) -> int:
    """Messages the broker's applications received (its ``stats`` view)."""
    (row,) = await client.view("stats")
    return int(row["received_by_application"])


async def _failover(directory: Path, by_name: dict[str, Member], shop: BrokerClient) -> None:
    """R-ROUTE-16, R-ROUTE-10, R-DLG-1: keyed SENDs across a killed principal and a
    promoted mirror land exactly once, in order."""
    principal, mirror = by_name["parts-principal"], by_name["parts-mirror"]
    await _wait_attached(directory, principal)
    dialog = await shop.begin_dialog(SHOP_SERVICE, PARTS_SERVICE, example.CONTRACT)
    bodies = [f"<part order='P-{n}'/>".encode() for n in range(1, PARTS_ORDERS + 1)]
    half = PARTS_ORDERS // 2
    for n, body in enumerate(bodies[:half], 1):
        await dialog.send(example.ORDER, body, key=f"P-{n}")
    started = time.monotonic()
    _kill(principal.pid)
    new_principal = await _client(directory, mirror)
    try:
        await new_principal.set_mirror_role("parts", "principal")
        for n, body in enumerate(bodies[half:], half + 1):
            await dialog.send(example.ORDER, body, key=f"P-{n}")
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < PARTS_ORDERS and time.monotonic() < deadline:
            for m in await new_principal.receive("PartsQueue", database="parts", timeout=1):
                if not (m.is_end_dialog or m.is_error or m.is_timer):
                    got.append(m.message_body)
        if got != bodies:
            raise ClusterError(
                f"the failover lost or repeated parts orders: {len(got)} of {PARTS_ORDERS} "
                "received, or out of order"
            )
    finally:
        await new_principal.close()
    example.say(
        f"5. the parts principal was killed after {half} of {PARTS_ORDERS} keyed SENDs and "
        f"the mirror promoted: it received all {PARTS_ORDERS}, each once, in order "
        f"({time.monotonic() - started:.1f} s)"
    )


def _kill(pid: int) -> None:
    """SIGKILL: the principal dies without any chance to flush (a crash)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


async def _wait_attached(directory: Path, principal: Member, timeout: float = 30) -> None:
    client = await _client(directory, principal)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            (row,) = await client.view("mirroring")
            if row["mirror_attached"]:
                return
            await asyncio.sleep(0.1)
    finally:
        await client.close()
    raise ClusterError(f"the parts mirror did not attach to its principal in {timeout} s")


def _analyze(directory: Path, out_dir: Path) -> Headline:
    from pyspark.sql import SparkSession

    from brokerd.analytics.report import analyze, write_report

    try:
        analysis = analyze([directory], progress=None)
    finally:
        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
    _, html = write_report(analysis, out_dir)
    t, a = analysis.totals, analysis.audit
    verdict = "PASSED" if a.passed else f"FAILED: {a.total} violation(s)"
    return Headline(
        html, int(t["messages_delivered"]), t["latency_p50_ms"], t["latency_p99_ms"], verdict
    )
