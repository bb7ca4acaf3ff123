"""``brokerctl trace`` (R-REPORT-2) prints what the trace files hold, and some of it came
from the network: a broker that refuses a connection during the handshake sends a Close
whose reason is any UTF-8 text (``protocol.frames``: up to 1,024 bytes), and the dialling
daemon traces it as its ``connection_refused`` reason (``closed by ADDRESS: CODE
REASON``), which ``trace`` names as the reason of the wait it explains. Like a view's cell
(``brokerd.admin.tables.one_line``), a step is one line whose control characters are
shown as escapes: a hostile peer's escape sequence never reaches the operator's terminal."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from brokerd.admin.ctl import main
from tests.admin.test_trace import write_segment

HOSTILE = "\x1b]0;owned\x07\x1b[2J\x1b[1;31mall is well\x1b[0m\rnext\x9b31m"
"""A window title set, the screen cleared, colours, a carriage return and a C1 CSI."""


def test_a_peers_close_reason_is_printed_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cid = str(uuid.uuid4())

    m: dict[str, object] = {"initiator": True, "seq": 1}
    refused = f"closed by tcp://b:4022: PROTOCOL_ERROR {HOSTILE} (attempt 1); next attempt in 1 s"
    write_segment(
        tmp_path,
        cid,
        "a",
        [
            (0.0, "message_sent", m),
            (0.001, "enqueued", m),
            (0.5, "connection_refused", {"peer": "tcp://b:4022", "reason": refused}),
            (2.0, "fragment_sent", {**m, "attempt": 1, "peer": "tcp://b:4022"}),
            (2.1, "ack_received", {"initiator": True, "through": 1, "seqs": "1"}),
        ],
    )
    write_segment(
        tmp_path,
        cid,
        "b",
        [
            (2.01, "fragment_received", {**m, "peer": "a@h:1"}),
            (2.02, "delivered", {**m, "queue": "Q"}),
        ],
    )
    status = main(["trace", cid, "1", "--traces", str(tmp_path)])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "1 connection(s) refused" in out  # the refusal is the wait's reason
    for char in ("\x1b", "\x07", "\r", "\x9b"):
        assert char not in out, repr(out)
    assert "\\x1b]0;owned\\x07\\x1b[2J" in out  # shown, as escapes
    for line in out.splitlines()[1:-1]:  # one line a step
        assert line.startswith("  "), repr(line)
