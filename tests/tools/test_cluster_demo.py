"""``brokerd demo`` as a newcomer runs it, a process of its own, without the Spark part
(``--no-analytics``: Spark's start and jobs take minutes on a small machine; the report
has tests of its own in tests/analytics/).

The local cluster comes up (R-OPS-4), the application guide's story runs through the
forwarding hub (R-ROUTE-6/7) to both load-balanced warehouses (R-ROUTE-5): a 3 MiB
attachment, a timer and an error ending (R-DLG-11), a poison message quarantined and
released (§6), activation under load; the parts database's principal is killed and its
mirror promoted, and every keyed SEND lands exactly once, in order (R-ROUTE-16, R-DLG-1);
the cluster stops and leaves no process behind.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.tools.test_cluster import running

ROOT = Path(__file__).resolve().parents[2]
FIRST = "127.0.0.181"


def test_the_demo_tells_the_whole_story_on_the_local_cluster(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "brokerd",
            "demo",
            "--no-analytics",
            "--orders",
            "60",
            "--workdir",
            str(tmp_path),
            "--first-address",
            FIRST,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ, COLUMNS="200"),
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert [line[:2] for line in out.splitlines() if line[:1].isdigit()] == [
        "1.",
        "2.",
        "3.",
        "4.",
        "5.",
    ]
    assert "the shop's own hash" in out
    assert "WITH ERROR 5001" in out
    assert "rolled back 3 times and its conversation quarantined" in out
    assert "answered ON HOLD" in out
    assert "60 orders shipped" in out
    hub = re.search(r"warehouse-1's application received (\d+) messages, warehouse-2's (\d+)", out)
    assert hub is not None and int(hub[1]) > 0 and int(hub[2]) > 0, out
    assert "it received all 40, each once, in order" in out
    assert "cluster stopped: 6 brokers, 0 process(es) left" in out
    pids = [int(p) for p in re.findall(r"[│|]\s*(\d+)\s*[│|]", out)]
    assert len(pids) == 6, out
    assert not [pid for pid in pids if running(pid)]
