"""Analytics benchmark: ``brokerd analyze`` end to end over synthetic trace sets of several sizes.

For each case (``--events``, a comma-separated list of sizes) it generates (once; kept in
``--dir/<events>``) a trace set of about that many events with
:mod:`brokerd.analytics.synthetic` (six instances, forwarding, load balancing, faults),
then runs ``python -m brokerd analyze`` on it as a user does, in a process of its own, and
times the whole command: Python's start, the JVM's start, every job and the report. It
prints one JSON line per case: events, input size, wall-clock seconds, events per second,
the CPU seconds of the command's processes by program (Python's, the JVM's), the steps'
times as the command reported them, and the machine's 1-minute load average before and
after (the figures mean little above about 1.5 on this machine's 2 cores;
``--calm`` waits for a calmer machine first). A case fails (exit 1) unless the analysis
finds exactly what the generator wrote: events, messages, retransmissions, duplicates,
and a passing audit.

``--master spark://...`` runs the cases on a cluster; ``--cluster`` starts the project's
own (:mod:`brokerd.tools.spark_cluster`) for the run and stops it after. ``--analyzer``
starts a running analyzer (``brokerd analyzer``, :mod:`brokerd.analytics.service`) first,
reports its start (the JVM and the warm-up) once, and times ``brokerd analyze --server``
for each case: the command a user waits for once the analyzer runs, with the analyzer's
CPU during the case counted under ``analyzer``.

Usage: python -m bench.bench_analyze [--events 66,100000,5000000] [--dir /tmp/brokerd-traces]
       [--master URL | --cluster | --analyzer] [--calm 1.5] [--runs 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.system import TreeCpu
from brokerd.analytics.synthetic import generate, plan_for_events
from brokerd.tools import spark_cluster
from brokerd.traces.writer import segment_files

STEP = re.compile(r"^\[\d+/\d+\] (?P<name>.+): (?P<seconds>[\d.]+) s \(total")
CALM_WAIT = 900.0
"""Seconds ``--calm`` waits at most for the load average to drop."""
START_WAIT = 600.0
"""Seconds ``--analyzer`` waits at most for the analyzer to start and warm up."""


def load_average() -> float:
    return os.getloadavg()[0]


def wait_for_calm(limit: float) -> None:
    deadline = time.monotonic() + CALM_WAIT
    while load_average() >= limit and time.monotonic() < deadline:
        time.sleep(10)


def trace_set(root: Path, events: int, regenerate: bool) -> dict[str, Any]:
    """The trace set of about ``events`` events under ``root`` (generated once) and its truth."""
    directory = root / str(events)
    stamp = directory / "truth.json"
    if not regenerate and not stamp.exists() and any(segment_files([directory])):
        # a set made some other way (by hand, with brokerd.analytics.synthetic): what it
        # should find is not known, and replacing it unasked would lose it
        raise SystemExit(
            f"bench_analyze: {directory} holds trace segments but no truth.json (not "
            "generated here); move them away, or pass --regenerate to replace them"
        )
    if regenerate or not stamp.exists():
        shutil.rmtree(directory, ignore_errors=True)
        began = time.perf_counter()
        truth = generate(directory / "traces", plan_for_events(events))
        print(
            f"generated {truth.events:,} events in {time.perf_counter() - began:.1f} s",
            file=sys.stderr,
        )
        stamp.write_text(
            json.dumps(
                {
                    "events": truth.events,
                    "messages_sent": truth.messages_sent,
                    "retransmissions": truth.retransmissions,
                    "duplicates": truth.duplicates,
                }
            )
        )
    expected: dict[str, Any] = json.loads(stamp.read_text())
    return expected


def tree_seconds(pid: int) -> float:
    """The CPU seconds a process and those below it have used so far."""
    with TreeCpu(pid) as cpu:
        pass
    return sum(cpu.by_program().values())


def run_case(
    root: Path,
    events: int,
    master: str | None,
    expected: dict[str, Any],
    analyzer: Analyzer | None = None,
) -> dict[str, Any]:
    """``brokerd analyze`` over one trace set, timed from the command's start to its exit."""
    traces = root / str(events) / "traces"
    out = root / str(events) / "report"
    size = sum(p.stat().st_size for p in segment_files([traces]))
    command = [sys.executable, "-m", "brokerd", "analyze", str(traces), "--out", str(out)]
    if master:
        command += ["--master", master]
    if analyzer is not None:
        command += ["--server", str(analyzer.socket)]
        analyzer_before = tree_seconds(analyzer.process.pid)
    shutil.rmtree(out, ignore_errors=True)  # a failed run must not leave the last summary
    load_before = load_average()
    began = time.perf_counter()
    with (
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as process,
        TreeCpu(process.pid) as cpu,
    ):
        stdout, stderr = process.communicate()
    wall = time.perf_counter() - began
    spent = cpu.by_program()
    if analyzer is not None:
        spent["analyzer"] = tree_seconds(analyzer.process.pid) - analyzer_before
    done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    if done.returncode not in (0, 1) or not (out / "summary.json").exists():
        raise SystemExit(f"brokerd analyze failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    found = summary["inputs"]["events"]
    steps = {
        m["name"]: float(m["seconds"])
        for line in done.stderr.splitlines()
        if (m := STEP.match(line))
    }
    t = summary["totals"]
    checks = {
        "events": (found, expected["events"]),
        "messages_sent": (t["messages_sent"], expected["messages_sent"]),
        "retransmissions": (t["retransmissions"], expected["retransmissions"]),
        "duplicates": (t["duplicates"], expected["duplicates"]),
        "audit violations": (summary["audit"]["violations"], 0),
    }
    wrong = {k: v for k, v in checks.items() if v[0] != v[1]}
    for name, (got, want) in wrong.items():
        print(f"MISMATCH {name}: analysis {got}, generator {want}", file=sys.stderr)
    return {
        "events": found,
        "input_mb": round(size / 1e6, 1),
        "files": summary["inputs"]["files"],
        "wall_seconds": round(wall, 1),
        "events_per_second": round(found / wall),
        "steps": steps,
        # what the run cost, whatever else the machine ran: the figure that compares
        # across a loaded machine's runs (the wall clock moves with the load)
        "cpu_seconds": {name: round(s, 1) for name, s in spent.items()},
        "master": summary["master"],
        "load_before": round(load_before, 2),
        "load_after": round(load_average(), 2),
        "cores": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "ok": not wrong,
    }


class Analyzer:
    """A running analyzer the cases ask (``--analyzer``)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.socket = directory / "analyzer.sock"
        self.log = directory / "analyzer.log"
        began = time.perf_counter()
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "brokerd", "analyzer", str(self.socket)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        while "listening at" not in self.log.read_text():
            if self.process.poll() is not None or time.perf_counter() - began > START_WAIT:
                self.stop()
                raise SystemExit(f"brokerd analyzer failed:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        self.start_seconds = time.perf_counter() - began

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--events",
        default="66,100000,5000000",
        type=lambda s: [int(n) for n in s.split(",")],
        help="comma-separated sizes, one case each",
    )
    parser.add_argument("--dir", type=Path, default=Path("/tmp/brokerd-traces"))
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--master", help="Spark master (default: local mode)")
    where.add_argument("--cluster", action="store_true", help="start a standalone cluster")
    where.add_argument(
        "--analyzer", action="store_true", help="start a running analyzer and ask it"
    )
    parser.add_argument("--runs", type=int, default=1, help="runs per case")
    parser.add_argument("--calm", type=float, help="wait for a 1-minute load below this first")
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--json", type=Path, help="also append the lines here")
    args = parser.parse_args(argv)

    expected = {n: trace_set(args.dir, n, args.regenerate) for n in args.events}
    master = args.master
    cluster_dir = args.dir / "cluster"
    if args.cluster:
        master = spark_cluster.start(cluster_dir).master_url
    analyzer = None
    if args.analyzer:
        analyzer = Analyzer(args.dir / "analyzer")
        started = {"analyzer_start_seconds": round(analyzer.start_seconds, 1)}
        print(json.dumps(started), flush=True)
    ok = True
    try:
        for n in args.events:
            for _ in range(args.runs):
                if args.calm:
                    wait_for_calm(args.calm)
                line = run_case(args.dir, n, master, expected[n], analyzer)
                ok = ok and line["ok"]
                print(json.dumps(line), flush=True)
                if args.json:
                    with args.json.open("a") as out:
                        out.write(json.dumps(line) + "\n")
    finally:
        if args.cluster:
            spark_cluster.stop(cluster_dir)
        if analyzer is not None:
            analyzer.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
