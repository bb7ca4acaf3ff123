"""``brokerd analyze --master spark://...`` on a real Spark standalone cluster (marker: soak).

Starts a Spark master and one worker on 127.0.0.1 with PySpark's own ``spark-class``,
then runs the analysis of a synthetic trace set on them: the driver is the command,
the jobs run in the worker's executor. Slow (a minute or more), so not in the
default run: ``pytest -m soak tests/analytics/test_cluster.py``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from brokerd.analytics.synthetic import Plan, generate

pytestmark = pytest.mark.soak
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(tmp_path)}
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    logs = tmp_path / "cluster.log"
    with logs.open("w") as log:
        master = subprocess.Popen(
            [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(free_port())],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        worker = None
        try:
            wait_for_port(port)
            worker = subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", master_url,
                 "--cores", "2", "--memory", "2g", "--webui-port", str(free_port()),
                 "--work-dir", str(tmp_path / "work")],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
            yield master_url
        finally:
            for process in (worker, master):
                if process is not None:
                    process.terminate()
                    try:
                        process.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        process.kill()


def test_analyze_runs_on_a_standalone_cluster(tmp_path: Path, cluster: str) -> None:
    generate(tmp_path / "traces", Plan(conversations=80, violations=True))
    done = subprocess.run(
        [sys.executable, "-m", "brokerd", "analyze", str(tmp_path / "traces"),
         "--out", str(tmp_path / "report"), "--master", cluster],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert f"starting Spark ({cluster})" in done.stderr
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["master"] == cluster
    assert summary["audit"]["violations"] == 4
