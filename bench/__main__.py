"""The benchmark suite: ``python -m bench run`` and ``python -m bench summarize``.

    python -m bench run --workload W2 --messages 50000 --size 200 --json
    python -m bench run --workload W1,W2,W3 --runs 3 --peer rabbitmq --peer-dir DIR --json
    python -m bench summarize results.jsonl
    python -m bench floor --json

``run`` starts its own daemons on loopback for every run, with a producer and a
consumer in separate processes, and prints one JSON line per run (``--json``) or a
table. Workloads: W1 local, W2 remote, W3 large remote (1 MiB), W4 many dialogs,
W5 via a forwarder, W6 recovery. docs/performance.md describes the method and every
figure. ``floor`` measures what the work each W3 message requires costs on this
machine, and the ceiling on W3 that follows (:mod:`bench.floor`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import floor, report
from bench import peer as peers
from bench.messages import HEADER
from bench.workloads import PEER_WORKLOADS, WORKLOADS, Options, default_warmup
from bench.workloads import run as run_workload
from brokerd.config.instance import MAX_PAGE_CACHE_MB


def _on_off(value: str) -> bool:
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError("on or off")
    return value == "on"


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def _page_cache_mb(value: str) -> int:
    n = int(value)
    if not 1 <= n <= MAX_PAGE_CACHE_MB:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_PAGE_CACHE_MB}")
    return n


def _positive_float(value: str) -> float:
    x = float(value)
    if not x > 0:
        raise argparse.ArgumentTypeError("must be above 0")
    return x


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    commands = top.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run workloads against brokerd (and a peer)")
    names = ", ".join(f"{w.name} {w.what}" for w in WORKLOADS.values())
    run.add_argument("--workload", "-w", default="W2", help=f"one or a comma list: {names}")
    run.add_argument(
        "--messages",
        type=_positive,
        help="messages per run (W1/W2/W5 50,000; W3 500; W4 10 per dialog; "
        "W6 the backlog, 1,000,000)",
    )
    run.add_argument("--size", type=_positive, help="body bytes (default 200; W3 1 MiB)")
    run.add_argument(
        "--dialogs", type=_positive, help="dialogs the messages share (1; W4 10,000; W6 100)"
    )
    run.add_argument(
        "--window", type=_positive, default=1000, help="SENDs awaiting their commit (1000)"
    )
    run.add_argument(
        "--batch",
        type=_positive,
        default=1,
        help="SENDs per request: 1 (default) pipelines single SENDs; more sends them in "
        "batches with send_many, one commit each (a transaction's worth), as many batches "
        "in flight as the window holds",
    )
    run.add_argument("--top", type=_positive, default=1000, help="RECEIVE TOP (n) (1000)")
    run.add_argument(
        "--groups",
        type=_positive,
        help="conversation groups one RECEIVE may return (1; W4 1,024)",
    )
    run.add_argument(
        "--receivers", type=_positive, help="concurrent RECEIVE loops (1; W4: 8, one group each)"
    )
    run.add_argument(
        "--databases",
        type=int,
        choices=(1, 2),
        default=2,
        help="W1's databases: 2 (default), the shop and the warehouse, delivering through "
        "the local link; 1, both services in one database (SEND straight into the queue)",
    )
    run.add_argument("--encryption", type=_on_off, default=True, help="on (default) or off")
    run.add_argument("--trace", type=_on_off, default=True, help="delivery traces: on or off")
    run.add_argument(
        "--warmup", type=int, help="unrecorded messages before each run (a tenth, 10-5,000)"
    )
    run.add_argument("--runs", type=_positive, default=1, help="runs per workload (1)")
    run.add_argument(
        "--timeout",
        type=float,
        help="seconds per phase of a run (300, or 2 ms per message when that is more)",
    )
    run.add_argument("--json", action="store_true", help="print one JSON line per run")
    run.add_argument("--jsonl", type=Path, help="also append the JSON lines to this file")
    run.add_argument("--workdir", type=Path, help="where the deployments go (default: temp)")
    run.add_argument("--keep", action="store_true", help="keep each run's data and logs")
    run.add_argument(
        "--peer",
        choices=peers.PEERS,
        help="also run the peer broker (W1-W4; for W4 its W2 with the same messages)",
    )
    run.add_argument("--peer-dir", type=Path, help=f"the peer's set-up (default ${peers.ENV_DIR})")
    run.add_argument(
        "--peer-keep", action="store_true", help="leave the peer's nodes running afterwards"
    )
    summarize = commands.add_parser("summarize", help="markdown table of medians")
    summarize.add_argument("files", nargs="+", type=Path)
    bottom = commands.add_parser("floor", help="the CPU the work of a W3 message requires")
    bottom.add_argument("--iterations", type=_positive, default=100, help="per measurement")
    bottom.add_argument(
        "--peer-mb-s", type=_positive_float, help="the peer's W3 MB/s, for the ratio"
    )
    bottom.add_argument(
        "--page-cache-mb",
        type=_page_cache_mb,
        default=floor.PAGE_CACHE_MB,
        help=f"SQLite's page cache (limits.page_cache_mb; default {floor.PAGE_CACHE_MB})",
    )
    bottom.add_argument("--json", action="store_true", help="print one JSON line")
    return top


def options_for(name: str, args: argparse.Namespace) -> Options:
    workload = WORKLOADS[name]
    dialogs = args.dialogs or workload.dialogs
    if args.messages:
        messages = args.messages
    elif name == "W4" and args.dialogs:
        messages = 10 * dialogs
    else:
        messages = workload.messages
    return Options(
        workload=name,
        messages=messages,
        size=args.size or workload.size,
        dialogs=min(dialogs, messages),
        window=args.window,
        batch=min(args.batch, args.window),
        top=args.top,
        receivers=args.receivers or workload.receivers,
        groups=args.groups or workload.groups,
        encryption=args.encryption,
        trace=args.trace,
        warmup=default_warmup(workload, messages) if args.warmup is None else args.warmup,
        timeout=args.timeout or max(300.0, messages / 500),
        workdir=args.workdir.resolve() if args.workdir is not None else None,
        keep=args.keep,
        databases=args.databases if workload.topology == "local" else 2,
    )


def _describe(line: dict[str, Any]) -> str:
    figures = ", ".join(
        f"{k} {line.get(k)}" for k in ("seconds", "msgs_per_s", "mb_per_s", "p50_ms", "p99_ms")
    )
    mode = f" [{line['mode']}]" if line.get("mode") else ""
    verdict = "ok" if line.get("ok") else f"NOT OK: {line.get('problems') or line.get('errors')}"
    return f"{line.get('broker')} {line.get('workload')}{mode}: {figures}; {verdict}"


def _peer_run(peer: peers.Peer | None, name: str, options: Options) -> dict[str, Any]:
    """The peer's run of the same work as ``options``' (its prefetch is RECEIVE TOP's)."""
    assert peer is not None
    return peer.run(
        name,
        messages=options.messages,
        size=options.size,
        window=options.window,
        prefetch=options.receive_top,
        warmup=options.warmup,
        timeout=options.timeout,
    )


def _sitting() -> str:
    """This sitting's name, written in every result line: its start (UTC) and the commit
    measured (``git describe``), so that result files appended to over several sittings
    are summed up one sitting at a time."""
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        rev = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return f"{started} {rev}".strip()


def command_run(args: argparse.Namespace) -> int:
    names = [w.strip().upper() for w in args.workload.split(",") if w.strip()]
    for name in names:
        if name not in WORKLOADS:
            raise SystemExit(f"unknown workload {name!r} (known: {', '.join(WORKLOADS)})")
    if args.size is not None and args.size < HEADER.size:
        raise SystemExit(f"--size must be at least {HEADER.size} (the index and send time)")
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    peer = None
    if args.peer:
        try:
            peer = peers.find(args.peer, args.peer_dir)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        others = [n for n in names if n not in PEER_WORKLOADS]
        if others:
            raise SystemExit(f"the peer runs {', '.join(PEER_WORKLOADS)} only, not {others}")
    lines: list[dict[str, Any]] = []
    out = args.jsonl.open("a") if args.jsonl else None
    sitting = _sitting()

    def emit(line: dict[str, Any]) -> None:
        line["sitting"] = sitting  # medians and ratios are taken within one sitting
        lines.append(line)
        text = json.dumps(line)
        if args.json:
            print(text, flush=True)
        print(_describe(line) if not line.get("summary") else text, file=sys.stderr, flush=True)
        if out is not None:
            out.write(text + "\n")
            out.flush()

    try:
        if peer is not None:
            peer.setup()
        for number in range(1, args.runs + 1):
            for name in names:
                options = options_for(name, args)

                # Beside a peer, which goes first alternates from round to round, so that
                # neither always meets the other's after-work (page cache, files deleted).
                peer_first = peer is not None and number % 2 == 0
                if peer_first:
                    theirs = _peer_run(peer, name, options)
                line = run_workload(options)
                line["run"] = number
                if peer is not None:
                    if not peer_first:
                        theirs = _peer_run(peer, name, options)
                    theirs["run"] = number
                    report.add_ratios(line, theirs)
                    emit(line)
                    emit(theirs)
                else:
                    emit(line)
        if peer is not None or args.runs > 1:
            runs = [r for r in lines if not r.get("summary")]
            for name in names:
                mine = [r for r in runs if r["workload"] == name and r["broker"] == report.BROKERD]
                peer_runs = [
                    r for r in runs if r["workload"] == name and r["broker"] != report.BROKERD
                ]
                emit(report.summary_line(name, mine, peer_runs))
    finally:
        if out is not None:
            out.close()
        if peer is not None and not args.peer_keep:
            peer.teardown()
    if not args.json:
        print(report.markdown(lines))
    return 0 if all(r.get("ok") for r in lines) else 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "summarize":
        print(report.markdown(report.read_lines(args.files)))
        return 0
    if args.command == "floor":
        line = floor.measure(
            args.iterations, peer_mb_s=args.peer_mb_s, page_cache_mb=args.page_cache_mb
        )
        print(json.dumps(line) if args.json else floor.describe(line))
        return 0
    return command_run(args)


if __name__ == "__main__":
    sys.exit(main())
