"""The soak's verdict (brokerd/tools/soak/driver.py, ``python -m brokerd.tools.soak
check``), on ledgers written here: a run is clean only when the checker finds no
violation of exactly once in order (SPEC R-DLG-1), the queues drained, both streams
carried traffic and nothing unexpected happened (an error: a SEND refused, a producer
stuck on a SEND, a daemon that does not start again, the run interrupted); and what a
command prints as its verdict is what its exit status says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from brokerd.tools.soak import checker, driver

REPLY_EVERY = 0


def write_ledgers(ledgers: Path, *, lose: bool = False) -> Path:
    """One remote and one local dialog of two messages each, every one received once
    (``lose``: the local dialog's second message never is)."""
    ledgers.mkdir(parents=True)
    (ledgers / "sent-ab0.log").write_text("T ab0.1 0\nC ab0.1 0\nT ab0.1 1\nC ab0.1 1\n")
    (ledgers / "sent-ll0.log").write_text("T ll0.1 0\nC ll0.1 0\nT ll0.1 1\nC ll0.1 1\n")
    (ledgers / "received-b.log").write_text("R 1.1 ab0.1 0 1\nR 1.1 ab0.1 1 1\nK 1.1\n")
    local = "R 2.1 ll0.1 0 1\n" + ("" if lose else "R 2.1 ll0.1 1 1\n") + "K 2.1\n"
    (ledgers / "received-l2.log").write_text(local)
    return ledgers


def test_an_error_makes_a_run_unclean_even_without_violation(tmp_path: Path) -> None:
    verdict = checker.check(write_ledgers(tmp_path / "ledgers"), REPLY_EVERY)
    assert verdict.clean and verdict.streams["local"]["received"] == 2
    assert driver.is_clean(verdict, drained=True, errors=[])
    refused = ["ab0: ConversationEnded: the conversation is closed"]
    assert not driver.is_clean(verdict, drained=True, errors=refused)
    assert not driver.is_clean(verdict, drained=False, errors=[])


def _check(workdir: Path) -> tuple[dict[str, object], int]:
    command = ["check", "--workdir", str(workdir), "--reply-every", str(REPLY_EVERY)]
    result = subprocess.run(
        [sys.executable, "-m", "brokerd.tools.soak", *command],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return json.loads(result.stdout), result.returncode


def test_check_prints_the_verdict_its_exit_status_gives(tmp_path: Path) -> None:
    write_ledgers(tmp_path / "clean" / "ledgers")
    printed, status = _check(tmp_path / "clean")
    assert (printed["clean"], status) == (True, 0)
    write_ledgers(tmp_path / "lossy" / "ledgers", lose=True)
    printed, status = _check(tmp_path / "lossy")
    assert (printed["clean"], status) == (False, 1)
    assert printed["violations"] == {
        "loss": 1, "duplicate": 0, "reorder": 0, "corrupt": 0, "phantom": 0,
        "dialog_error": 0, "misdelivered": 0,
    }  # fmt: skip
