"""Process tools and the soak's ledgers, with real processes and real files: a recorded
pid that another program has since taken is not that program's broker, and two lives of
a soak consumer never share a batch name (SPEC R-OPS-5, R-DLG-1)."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from brokerd.tools import cluster_demo
from brokerd.tools.cluster import STATE_FILE
from brokerd.tools.soak import checker, consumer
from brokerd.tools.soak.records import make_body
from tests.daemons import solo_daemon

HOST = "127.0.0.202"


@contextmanager
def sleeper(*args: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process that is not a broker, with ``args`` on its command line."""
    code = "import time; time.sleep(120)"
    process = subprocess.Popen([sys.executable, "-c", code, *args])
    cmdline = Path(f"/proc/{process.pid}/cmdline")
    deadline = time.monotonic() + 10
    while code.encode() not in cmdline.read_bytes().split(b"\0"):  # exec'd
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def record(directory: Path, pid: int) -> str:
    """``directory/cluster.json`` naming one broker with ``pid``; its configuration path."""
    directory.mkdir(parents=True)
    config = str(directory / "shop" / "brokerd.toml")
    member = {
        "name": "shop",
        "role": "shop",
        "host": HOST,
        "pid": pid,
        "client_port": 4023,
        "admin_url": f"http://{HOST}:8022",
        "config": config,
        "log": str(directory / "shop" / "brokerd.log"),
    }
    (directory / STATE_FILE).write_text(json.dumps({"members": [member]}))
    return config


def test_the_demo_clears_an_earlier_run_whose_pid_another_program_took(tmp_path: Path) -> None:
    """R-OPS-5: an earlier run's files are removed when its cluster is not running. A pid
    recorded in cluster.json and now another program's (after a reboot, or once pids
    wrap) does not make that cluster running: its old databases would be used again."""
    root = tmp_path / "demo"
    (root / "report").mkdir(parents=True)
    (root / "report" / "report.html").write_text("an earlier run's report")
    with sleeper() as other:
        record(root / "cluster", other.pid)
        cluster_demo._fresh(root)
        assert other.poll() is None
    assert not (root / "cluster").exists()
    assert not (root / "report").exists()


def test_the_demo_keeps_an_earlier_run_whose_broker_still_runs(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    (root / "report").mkdir(parents=True)
    config = str(root / "cluster" / "shop" / "brokerd.toml")
    with sleeper("--config", config) as broker:
        record(root / "cluster", broker.pid)
        cluster_demo._fresh(root)
    assert (root / "cluster" / STATE_FILE).exists()
    assert (root / "report").exists()


async def test_two_lives_of_a_consumer_with_one_pid_name_their_batches_apart(
    tmp_path: Path,
) -> None:
    """The checker tells a consumer's batches apart by name only. A consumer killed and
    started again may get the pid of an earlier life (pids wrap, at 32768 by default; a
    container starts them again at 1): their batches must still have names of their own,
    or the checker merges a committed batch with a rolled-back one and counts both as
    whichever outcome came last, hiding a duplicate or reporting a false loss (R-DLG-1).
    Two lives in this one process stand for two with the same pid."""
    ledger = tmp_path / "ledgers" / "received-b.log"
    async with solo_daemon(tmp_path, HOST) as (deployment, client):
        daemon = deployment.daemons["solo"]
        args = argparse.ArgumentParser()
        consumer.add_arguments(args)
        options = args.parse_args(
            [
                *("--host", daemon.client_host, "--port", str(daemon.client_port)),
                *("--token-file", str(daemon.token_file), "--queue", "Q2"),
                *("--database", "Solo", "--ledger", str(ledger), "--rollback-rate", "0"),
            ]
        )
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        rng = random.Random(1)
        for life in range(2):
            await dialog.send("DEFAULT", make_body("ab0.1", life, 16, rng))
            one = consumer.Consumer(options)
            running = asyncio.create_task(one.run())
            deadline = time.monotonic() + 30
            while ledger.read_text().count("\nK ") + ledger.read_text().startswith("K ") <= life:
                assert time.monotonic() < deadline, ledger.read_text()
                await asyncio.sleep(0.05)
            one.stop.set()
            await asyncio.wait_for(running, 30)
            one.ledger.close()
    batches = checker._batches(ledger)
    assert [(b.state, [(k, i) for k, i, _, _ in b.records]) for b in batches] == [
        ("committed", [("ab0.1", 0)]),
        ("committed", [("ab0.1", 1)]),
    ], ledger.read_text()
    # Each batch: its records, then P (the COMMIT is asked for), then K (it returned).
    assert [line.split(" ")[0] for line in ledger.read_text().splitlines()] == ["R", "P", "K"] * 2


def received_again(tmp_path: Path, received: str) -> dict[str, list[str]]:
    """The checker's violations when ``k`` 0-2 were committed by their producer and the
    consumers wrote ``received``."""
    (tmp_path / "sent-ab0.log").write_text("".join(f"T k {i}\nC k {i}\n" for i in range(3)))
    (tmp_path / "received-b.log").write_text(received)
    return {k: v for k, v in checker.check(tmp_path, 0).violations.items() if v}


def test_messages_of_a_batch_that_never_asked_for_its_commit_must_come_again(
    tmp_path: Path,
) -> None:
    """A consumer killed (or cut from its daemon) after writing its records and before
    asking for the COMMIT leaves a transaction the daemon must roll back: its messages
    must be received again. A daemon that loses them instead (R-DLG-1) is a loss, not a
    batch that "committed before the consumer died"."""
    died = "R 1.1 k 0 1\nP 1.1\nK 1.1\nR 2.1 k 1 1\nR 2.1 k 2 1\n"
    assert received_again(tmp_path, died) == {"loss": ["k #1", "k #2"]}
    again = died + "R 3.1 k 1 1\nR 3.1 k 2 1\nP 3.1\nK 3.1\n"
    assert received_again(tmp_path, again) == {}
    # Asked for, outcome unknown, not received again: the COMMIT took effect.
    asked = "R 1.1 k 0 1\nP 1.1\nK 1.1\nR 2.1 k 1 1\nR 2.1 k 2 1\nP 2.1\n"
    assert received_again(tmp_path, asked) == {}
