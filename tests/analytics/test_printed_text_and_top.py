"""``brokerd analyze --top`` (R-REPORT-3): the rows kept per table are the ones the
running analyzer takes, 1 to ``MAX_TOP``, whether the command runs the analysis itself or
asks the analyzer (``--server``): the same command line gets the same answer either way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brokerd.analytics.service import MAX_TOP
from brokerd.analytics.synthetic import Plan, generate
from tests.commands import brokerd


@pytest.mark.parametrize("top", ["-1", "0", str(MAX_TOP + 1), "ten"])
def test_a_top_out_of_range_is_refused_before_spark_starts(tmp_path: Path, top: str) -> None:
    """A ``--top`` the analyzer refuses (``top: an integer from 1 to 1,000,000``) is one
    error line and status 2 when the command runs the analysis itself too: never a
    Java stack and status 1, which says that the audit found a violation (``-1``), nor
    tables of no rows (``0``)."""
    generate(tmp_path / "traces", Plan(conversations=5))
    for server in ([], ["--server", str(tmp_path / "none.sock")]):
        done = brokerd(
            "analyze",
            str(tmp_path / "traces"),
            "--top",
            top,
            "--master",
            "local[1]",
            "--out",
            str(tmp_path / "report"),
            *server,
            timeout=240,
        )
        assert done.returncode == 2, (server, done.returncode, done.stderr[-2000:])
        assert "--top" in done.stderr and "from 1 to 1,000,000" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "at java." not in done.stderr
        assert not (tmp_path / "report").exists()


HOSTILE = "\x1b]0;owned\x07\x1b[2J\x1b[1;31mall is well\x1b[0m\rnext\x9b31m"
"""A window title set, the screen cleared, colours, a carriage return and a C1 CSI."""


def test_a_peers_text_in_the_printed_tables_is_escaped(tmp_path: Path) -> None:
    """The tables ``brokerd analyze`` prints (and ``--server`` prints from the analyzer's
    ``text``) hold what the traces say, and some of it came from the network: a broker that
    refuses a connection during the handshake sends a Close whose reason is any UTF-8 text,
    and the dialling daemon traces it as its ``connection_refused`` reason, one row of
    "Why messages waited". Its control characters are shown as escapes, as ``brokerctl``
    shows a view's cells: a hostile peer's escape sequence never drives the terminal."""
    traces = tmp_path / "traces"
    generate(traces, Plan(conversations=10, compact=False, torn_line=False))
    segment = sorted((traces / "client-1").glob("*.jsonl"))[-1]
    last = json.loads(segment.read_text().splitlines()[-1])
    reason = f"closed by tcp://x:4022: PROTOCOL_ERROR {HOSTILE} (attempt 1); next attempt in 1 s"
    with segment.open("a") as out:
        for n in range(1, 201):  # the most frequent reason: the first row printed
            event = {"v": 1, "instance": last["instance"], "n": last["n"] + n, "ts": last["ts"]}
            event |= {"event": "connection_refused", "peer": "tcp://x:4022", "reason": reason}
            out.write(json.dumps(event) + "\n")
    done = brokerd(
        "analyze",
        str(traces),
        "--master",
        "local[1]",
        "--out",
        str(tmp_path / "report"),
        "--quiet",
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # the row is printed, its reason the refusals' cause (docs/analytics.md, wait_reasons)
    assert "closed by <address>: PROTOCOL_ERROR" in done.stdout
    for char in ("\x1b", "\x07", "\r", "\x9b"):
        assert char not in done.stdout, repr(done.stdout)
    assert "\\x1b]0;owned\\x07\\x1b[2J" in done.stdout  # shown, as escapes
