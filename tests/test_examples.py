"""The application guide's example (``docs/guide.md``) runs as a user would run it:
``python examples/order_processing.py`` starts its own shop and warehouse brokers on
127.0.0.1:4022 and 127.0.0.2:4022 and tells its story, checking each outcome itself
(request/reply with a 3 MiB attachment, a timer and an error ending, a poison message
quarantined and released, activation under load; SPEC §6)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_order_processing_example_tells_its_whole_story(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "order_processing.py"),
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line[:2] for line in lines if line[:1].isdigit()] == ["1.", "2.", "3.", "4."]
    out = done.stdout
    assert "two orders shipped" in out and "the shop's own hash" in out
    assert "timer fired" in out and "WITH ERROR 5001" in out
    assert "rolled back 3 times and its conversation quarantined" in out
    assert "answered ON HOLD" in out
    assert "300 orders shipped" in out
    assert "by up to 1 activated readers" not in out  # the readers grew
