"""``brokerd analyze --master spark://...`` on a real Spark standalone cluster (R-REPORT-3).

The cluster is the project's own (``python -m brokerd.tools.spark_cluster start|stop
--dir D``: a master and one worker on 127.0.0.1, started as separate processes, the way a
compose deployment starts them), started once for the module and stopped after. The
analysis of a small synthetic trace set runs its jobs in the worker's executor (the
driver is the command) and must find what local mode finds: the same events, totals and
audit findings (R-TRACE-2).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brokerd.analytics.synthetic import Plan, generate
from brokerd.errors import AnalyticsError
from brokerd.tools import spark_cluster
from tests.commands import brokerd, module

CLUSTER_TOOL = "brokerd.tools.spark_cluster"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("spark-cluster")
    done = module(
        CLUSTER_TOOL, "start", "--dir", str(directory), "--cores", "2", "--memory", "1g",
        timeout=spark_cluster.START_TIMEOUT + 30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    url = done.stdout.strip()
    try:
        yield url
    finally:
        stopped = module(CLUSTER_TOOL, "stop", "--dir", str(directory), timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert not (directory / spark_cluster.STATE).exists()


def analyze(
    traces: Path, out: Path, *master: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    done = brokerd("analyze", str(traces), "--out", str(out), *master, timeout=600)
    return done, json.loads((out / "summary.json").read_text())


def test_analyze_on_a_standalone_cluster_finds_what_local_mode_finds(
    tmp_path: Path, cluster: str
) -> None:
    assert cluster.startswith("spark://127.0.0.1:")
    traces = tmp_path / "traces"
    truth = generate(traces, Plan(conversations=20, violations=True))
    done, remote = analyze(traces, tmp_path / "cluster", "--master", cluster)
    assert done.returncode == 1, done.stderr[-3000:]  # the injected violations
    assert f"starting Spark ({cluster})" in done.stderr
    assert remote["master"] == cluster
    assert remote["inputs"]["events"] == truth.events
    _, local = analyze(traces, tmp_path / "local")
    assert local["master"] == "local[*]"
    assert remote["totals"] == local["totals"]
    assert remote["audit"] == local["audit"]
    found = {
        (v["kind"], v["conversation_id"], v["initiator"], v["seq"])
        for v in remote["audit"]["listed"]
    }
    assert found == truth.violations
    for name, table in local["tables"].items():
        assert remote["tables"][name] == table, name


def test_the_cluster_tool_refuses_a_directory_without_a_cluster(tmp_path: Path) -> None:
    with pytest.raises(AnalyticsError, match="no cluster recorded"):
        spark_cluster.stop(tmp_path)
    done = module(CLUSTER_TOOL, "stop", "--dir", str(tmp_path), timeout=60)
    assert done.returncode == 1
    assert "no cluster recorded" in done.stderr
