"""Analytics benchmark: ``brokerd analyze`` over a large synthetic trace set.

Generates (once; kept in ``--dir``) a trace set of about ``--events`` events with
:mod:`brokerd.analytics.synthetic` (six instances, forwarding, load balancing, faults),
then runs every job in local mode exactly as ``brokerd analyze`` does and reports
the wall-clock time of each step, the whole run, the events per second, the
input size, and the Spark driver's peak resident memory (``VmHWM`` of the JVM).
The run fails (exit 1) unless the analysis finds exactly what the generator
wrote: events, messages, retransmissions, duplicates, and a passing audit.

Usage: python bench/bench_analyze.py [--events 5000000] [--dir /tmp/brokerd-traces-5m]
       [--master local[*]] [--memory 4g] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

from brokerd.analytics.report import analyze, print_summary
from brokerd.analytics.session import spark_session
from brokerd.analytics.synthetic import generate, plan_for_events


def _jvm_peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/brokerd-traces-5m"))
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--memory", default="4g", help="Spark driver memory (local mode)")
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    stamp = args.dir / "truth.json"
    if args.regenerate or not stamp.exists():
        shutil.rmtree(args.dir, ignore_errors=True)
        began = time.perf_counter()
        truth = generate(args.dir, plan_for_events(args.events))
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
    expected = json.loads(stamp.read_text())
    size = sum(p.stat().st_size for p in args.dir.rglob("*.jsonl"))

    spark = spark_session(args.master, driver_memory=args.memory)
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
    try:
        result = analyze([args.dir], master=args.master, spark=spark, progress=sys.stderr)
        peak = _jvm_peak_rss_mb(jvm_pid)
    finally:
        spark.stop()
    print_summary(result)
    events = result.inputs["events"]
    figures = {
        "events": events,
        "input_mb": round(size / 1e6, 1),
        "files": result.inputs["files"],
        "runtime_seconds": round(result.runtime_seconds, 1),
        "events_per_second": round(events / result.runtime_seconds),
        "jvm_peak_rss_mb": round(peak) if peak else None,
        "master": args.master,
        "driver_memory": args.memory,
        "cores": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    t = result.totals
    checks = {
        "events": (events, expected["events"]),
        "messages_sent": (t["messages_sent"], expected["messages_sent"]),
        "retransmissions": (t["retransmissions"], expected["retransmissions"]),
        "duplicates": (t["duplicates"], expected["duplicates"]),
        "audit violations": (result.audit.total, 0),
    }
    wrong = {k: v for k, v in checks.items() if v[0] != v[1]}
    for name, (got, want) in wrong.items():
        print(f"MISMATCH {name}: analysis {got}, generator {want}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
