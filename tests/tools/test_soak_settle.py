"""The soak's producers settle the SENDs whose outcome is unknown (the connection broke
before the answer: here A is SIGKILLed while the local stream's producers SEND): each
is sent again under its idempotency key until it is committed or refused (SPEC §6, the
decision on outcomes), so the checker requires every one of them. Only the SENDs of a
client transaction whose COMMIT was in flight stay unknown (no key in a transaction);
one that lost its connection before is rolled back. The queue holds each committed
message exactly once, and nothing refused or rolled back (R-DLG-1).

A real daemon A of the soak's deployment on 127.0.12.1, its local stream only."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from pathlib import Path

from brokerd.tools.soak import checker, topology
from brokerd.tools.soak.clients import Clients, direct
from brokerd.tools.soak.driver import Settings
from brokerd.tools.soak.producers import Producers, stop_producers
from brokerd.tools.soak.records import parse_body

HOSTS = topology.Hosts(prefix="127.0.12", base=0)
KILLS = 3


def outcomes(ledgers: Path) -> dict[tuple[str, int], str]:
    """Each SEND's last ledger line: ``C`` committed, ``F`` refused or rolled back, ``T``
    unknown."""
    found = {}
    for path in ledgers.glob("sent-*.log"):
        for line in path.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) == 3:
                found[(parts[1], int(parts[2]))] = parts[0]
    return found


def committed(ledgers: Path) -> set[tuple[str, int]]:
    return {key for key, outcome in outcomes(ledgers).items() if outcome == "C"}


async def more_committed(ledgers: Path, more: int, timeout: float = 30) -> None:
    target = len(committed(ledgers)) + more
    deadline = time.monotonic() + timeout
    while len(committed(ledgers)) < target:
        assert time.monotonic() < deadline, "the producers do not commit"
        await asyncio.sleep(0.05)


async def test_sends_of_unknown_outcome_are_sent_again_under_their_keys(tmp_path: Path) -> None:
    deployment = topology.build(tmp_path / "deployment", HOSTS, mirror=False)
    settings = Settings(
        seconds=0, seed=7, workdir=tmp_path, hosts=HOSTS, dialogs=0, local_dialogs=3,
        large_fraction=0.0, max_backlog=10**9,
    )  # fmt: skip
    ledgers = tmp_path / "ledgers"
    errors: list[str] = []
    load = Producers(settings, ledgers, random.Random(7), errors.append)
    await asyncio.to_thread(deployment.start, "a")
    clients = Clients(deployment, mirror=False)
    try:
        producers = load.start(clients)
        for _ in range(KILLS):  # SIGKILLs with SENDs in flight
            await more_committed(ledgers, 150)
            deployment.kill("a")
            await asyncio.to_thread(deployment.start, "a")
        await more_committed(ledgers, 50)
        load.stop_producing.set()
        assert await stop_producers(producers, timeout=30) == 0
        verdict = checker.check(ledgers, reply_every=0)
        # Unknown still: only the SENDs of a transaction whose COMMIT was in flight.
        assert verdict.uncertain_sends == load.commits_unknown, verdict.summary()
        assert errors == [] and load.settled > 0  # some SENDs were settled by a retry
        client = await direct(deployment, "a")
        try:
            received: Counter[tuple[str, int]] = Counter()
            while batch := await client.receive(
                topology.QUEUE_L2, database=topology.DATABASE_LOCAL, top=1000
            ):
                for m in batch:
                    parsed = parse_body(m.message_body)
                    if parsed is not None:  # not an EndDialog: the dialogs are never ended
                        received[(parsed.key, parsed.index)] += 1
        finally:
            await client.close()
        assert [key for key, n in received.items() if n > 1] == []
        unknown = {key for key, outcome in outcomes(ledgers).items() if outcome == "T"}
        assert committed(ledgers) <= set(received) <= committed(ledgers) | unknown
    finally:
        await clients.close()
        await asyncio.to_thread(deployment.stop_all)
