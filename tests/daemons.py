"""Helpers for tests that run real daemons on 127.0.0.1:4022 and 127.0.0.2:4022."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from brokerd.config import load_config
from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.server.daemon import Broker
from brokerd.tools.faultproxy import FaultPlan, FaultProxy
from brokerd.tools.launcher import Deployment
from protocol.errors import BrokerStopping

FAST_RETRY = {"initial": 0.5, "maximum": 2.0, "ack_delay": 0.005, "delayed_retry": 0.5}
"""Retry settings that make retransmission tests quick."""


@contextlib.contextmanager
def running(d: Deployment, *names: str) -> Iterator[Deployment]:
    """Start ``names`` (every daemon declared, by default); stop them all at the end, also
    when one fails to start."""
    try:
        for name in names or list(d.daemons):
            d.start(name)
        yield d
    finally:
        d.stop_all()


@contextlib.asynccontextmanager
async def in_process(config_path: Path) -> AsyncIterator[Broker]:
    """A daemon run in the test's own process (``Broker``, as ``brokerd run`` builds it), so
    that the test can reach into its databases: started, and stopped at the end."""
    broker = Broker(load_config(config_path))
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


def solo_database(q2: str = "") -> str:
    """One database, ``Solo``, whose service ``//solo/S1`` (queue ``Q1``) talks to
    ``//solo/S2`` (queue ``Q2``): dialogs inside one database; ``q2``, more settings of
    queue ``Q2`` (its poison-message handling, say)."""
    return f"""
[[database]]
name = "Solo"
[[database.queue]]
name = "Q1"
[[database.queue]]
name = "Q2"
{q2}
[[database.service]]
name = "//solo/S1"
queue = "Q1"
contracts = ["DEFAULT"]
[[database.service]]
name = "//solo/S2"
queue = "Q2"
contracts = ["DEFAULT"]
"""


SOLO_DATABASE = solo_database()
"""The :func:`solo_database` with nothing more."""


@contextlib.asynccontextmanager
async def solo_daemon(
    root: Path,
    host: str,
    q2: str = "",
    extra: str = "",
    retry: dict[str, float] | None = None,
) -> AsyncIterator[tuple[Deployment, BrokerClient]]:
    """A daemon of ``solo_database(q2)`` in a process of its own on ``host``:4022 (its
    deployment under ``root / "deployment"``), and a client of it; both ended at the end."""
    deployment = Deployment(root / "deployment", retry)
    deployment.add("solo", host, solo_database(q2), extra=extra)
    deployment.start("solo")
    client = await deployment.daemons["solo"].client()
    try:
        yield deployment, client
    finally:
        await client.close()
        deployment.stop_all()


@contextlib.asynccontextmanager
async def solo_broker(root: Path, host: str, extra: str = "") -> AsyncIterator[Broker]:
    """A daemon of :data:`SOLO_DATABASE` on ``host``:4022, run in the test's process
    (:func:`in_process`); ``extra`` is top-level TOML (a ``[limits]`` table, say)."""
    daemon = Deployment(root).add("solo", host, SOLO_DATABASE, extra=extra)
    async with in_process(daemon.config_path) as broker:
        yield broker


async def client_of(broker: Broker) -> BrokerClient:
    """An application client of an in-process daemon, on its client port."""
    client = broker.config.client
    return await BrokerClient.connect(client.host, client.port, token_file=client.token_file)


PROXY_HOST = "127.0.0.3"
"""Where a fault proxy in front of beta (127.0.0.2:4022) listens; a deployment built with
``beta_route_host=PROXY_HOST`` sends alpha's messages through it."""


@contextlib.asynccontextmanager
async def proxied(d: Deployment, plan: FaultPlan | None = None) -> AsyncIterator[FaultProxy]:
    """A fault proxy 127.0.0.3:4022 -> 127.0.0.2:4022, then every daemon of ``d`` started;
    all stopped at the end."""
    proxy = FaultProxy(PROXY_HOST, 4022, "127.0.0.2", 4022, plan or FaultPlan())
    await proxy.start()
    try:
        with running(d):
            yield proxy
    finally:
        await proxy.stop()


async def wait_until(
    check: Callable[[], Awaitable[bool]], timeout: float = 30.0, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


async def drain(
    client: BrokerClient, queue: str, expected: int, timeout: float = 60.0
) -> list[ReceivedMessage]:
    """RECEIVE until ``expected`` messages arrived (fails after ``timeout``)."""
    out: list[ReceivedMessage] = []
    deadline = time.monotonic() + timeout
    while len(out) < expected:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"received {len(out)} of {expected} messages in {timeout} s")
        out += await client.receive(queue, top=500, timeout=min(1.0, left))
    return out


def assert_exactly_once_in_order(
    messages: list[ReceivedMessage], sent: dict[uuid.UUID, list[bytes]] | None = None
) -> dict[uuid.UUID, list[int]]:
    """Per conversation, sequence numbers 1..n each exactly once and in order (R-DLG-1)."""
    per: dict[uuid.UUID, list[int]] = {}
    bodies: dict[uuid.UUID, list[bytes]] = {}
    for m in messages:
        per.setdefault(m.conversation_handle, []).append(m.message_sequence_number)
        bodies.setdefault(m.conversation_handle, []).append(m.message_body)
    for handle, seqs in per.items():
        assert seqs == list(range(1, len(seqs) + 1)), f"conversation {handle}: {seqs}"
    if sent is not None:
        assert sorted(sorted(b) for b in bodies.values()) == sorted(
            sorted(b) for b in sent.values()
        )
        for received in bodies.values():
            origin = next(v for v in sent.values() if v and v[0] == received[0])
            assert received == origin
    return per


async def view(client: BrokerClient, name: str) -> list[dict[str, Any]]:
    return await client.view(name)


async def stats_with(client: BrokerClient, *prefixes: str) -> dict[str, Any]:
    """The daemon's ``stats`` view, only the counters whose names start with ``prefixes``."""
    (stats,) = await client.view("stats")
    return {k: v for k, v in stats.items() if k.startswith(prefixes)}


async def sends_through_a_stop(
    client: BrokerClient,
    handle: uuid.UUID,
    message_type: str,
    prefix: str,
    stop: Callable[[], object],
    *,
    after: int,
    burst: int,
    pause: float,
) -> tuple[list[bytes], list[object]]:
    """Pipeline SENDs (bodies ``"{prefix} {n}"``) on ``handle``, ``burst`` at a time every
    ``pause`` s, until the daemon says it is stopping (``BrokerStopping``); once ``after``
    were sent, ``stop`` runs in a thread (``Deployment.stop``, a SIGTERM). Returns the
    bodies sent and each one's outcome: its sequence number or its error."""
    sent: list[tuple[bytes, asyncio.Future[int]]] = []
    stopping: asyncio.Future[object] | None = None

    async def produce() -> None:
        nonlocal stopping
        n = 0
        while True:
            for _ in range(burst):
                body = f"{prefix} {n}".encode()
                try:
                    sent.append((body, client.send_nowait(handle, message_type, body)))
                except BrokerStopping:
                    return  # told the daemon is stopping: nothing more is sent
                n += 1
            if n == after:  # well under way: stop the daemon while SENDs are in flight
                stopping = asyncio.ensure_future(asyncio.to_thread(stop))
            await asyncio.sleep(pause)

    await asyncio.wait_for(produce(), 60)
    assert stopping is not None, "the daemon said it was stopping before it was stopped"
    await stopping
    outcomes = await asyncio.gather(*(f for _, f in sent), return_exceptions=True)
    return [body for body, _ in sent], list(outcomes)
