"""End-to-end dialog benchmark: real daemons, real sockets, durable commits.

Starts ``python -m brokerd run`` processes with the example deployment's
databases (SQLite WAL, ``synchronous=FULL``: the daemon's default, so every
acknowledged SEND and every RECEIVE is fsynced) and measures two configurations:

* ``cross``: ``alpha`` (database shop, service //shop/Client) on host A and
  ``beta`` (database warehouse, service //warehouse/Orders, queue OrderQueue)
  on host B; messages cross the adjacent-broker TCP connection A:4022 -> B:4022;
* ``local``: one daemon holding both databases and no configured routes, so
  the ``AutoCreatedLocal`` route applies and the engine delivers in-process.

For each: ``--dialogs`` dialogs //shop/Client -> //warehouse/Orders on contract
//shop/OrderContract (plus one warm-up message per dialog, not counted, which
opens the broker connection and creates the target endpoints), then
``--messages`` //shop/Order messages of ``--size`` bytes, spread round-robin
over the dialogs, sent by ``--senders`` SDK connections. SEND returns after
the commit; with ``--window W`` each connection keeps W SENDs in flight
(pipelined, as a RabbitMQ publisher keeps unconfirmed messages in flight),
otherwise each SEND waits for the previous one. ``--receivers`` connections (two) on the target
side loop on ``RECEIVE TOP (100) FROM OrderQueue`` (of up to ``--groups`` conversation
groups each, 1 by default).

Each body starts with the send-start ``time.perf_counter_ns()`` (8 bytes, the
same machine so the clocks agree) and a (dialog, index) marker, padded to
``--size``. Reported: end-to-end messages/s (first SEND start to last RECEIVE
return), SEND-start-to-RECEIVE latency percentiles, SEND-call latency (the
durable commit on the initiator's side), the SEND-only rate, the mean
RECEIVE batch size, the CPU seconds each process used, and a wall-clock
breakdown of the latency: SEND start to ``message_enqueue_time`` (accepted into
the target queue), then enqueued to RECEIVE returned.

Verified: exactly once (every marker once, count == M, nothing more arrives
after), the sequence number received for each marker is the one its SEND
returned, per conversation handle the sequence numbers each receiver connection
got strictly increase, and (with traces on) the receiving broker's ``received``
events, in commit order, have increasing sequence numbers per conversation. Two
receivers' replies may reach the benchmark in either order: an autocommit
RECEIVE releases its conversation group at its commit, before its reply is read.
Any violation makes the exit status 1.

Usage: python -m bench.bench_dialogs [--messages 5000] [--dialogs 20] [--senders 8] [--window 1]
       [--receivers 2] [--groups 1] [--size 200] [--hosts 127.0.0.1,127.0.0.2] [--only cross|local]
       [--workdir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import shutil
import struct
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from bench.checks import broker_order_problems
from bench.deployments import commits_so_far, local_databases_toml
from bench.report import percentile
from bench.system import cpu_seconds, machine
from brokerd.config import RetryConfig
from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.server.daemon import install_uvloop
from brokerd.tools import example
from brokerd.tools.launcher import Daemon, Deployment

MARKER = struct.Struct("<qIIB")
"""Send-start perf_counter_ns, dialog number, index within the run, phase."""
WARMUP, MEASURED = 0, 1
QUEUE = "OrderQueue"
TOP = 100
POLL = 0.5
"""RECEIVE's WAITFOR, seconds: how long a receiver may linger after the last message."""
SCENARIOS = ("cross", "local")


# -- deployments ---------------------------------------------------------------------


def build(
    kind: str,
    root: Path,
    hosts: tuple[str, str],
    trace: bool = True,
    retry: dict[str, float] | None = None,
) -> tuple[Deployment, str, str]:
    """The deployment of one scenario and the names of the sending and receiving daemons.

    Retransmission and acknowledgement timings are the daemon's defaults (as a user
    runs it), not the launcher's short test timings, unless ``retry`` overrides them.
    """
    extra = "" if trace else "[trace]\nenabled = false\n"
    timings = {f.name: getattr(RetryConfig(), f.name) for f in fields(RetryConfig)}
    timings.update(retry or {})
    if kind == "cross":
        deployment = example.shop_and_warehouse(root, retry=timings, hosts=hosts, extra=extra)
        return deployment, "alpha", "beta"
    deployment = Deployment(root, timings)
    deployment.add("solo", hosts[0], local_databases_toml(), extra=extra)
    return deployment, "solo", "solo"


# -- measurement ---------------------------------------------------------------------


@dataclass
class Received:
    recv_ns: int
    recv_wall: float
    enqueued_wall: float
    order: int
    handle: uuid.UUID
    seq: int
    message_type: str
    length: int
    sent_ns: int
    dialog: int
    index: int
    phase: int
    receiver: int
    """Which receiver connection got it."""


@dataclass
class RunState:
    messages: int
    measured: int = 0
    order: itertools.count[int] = field(default_factory=itertools.count)
    rows: list[Received] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self, now: int, batch: list[ReceivedMessage], receiver: int = 0) -> None:
        if not batch:
            return
        wall = time.time()
        self.batches.append(len(batch))
        for m in batch:
            body = m.message_body
            if len(body) >= MARKER.size:
                sent_ns, dialog, index, phase = MARKER.unpack_from(body)
            else:
                sent_ns, dialog, index, phase = 0, -1, -1, -1
            self.rows.append(
                Received(
                    now,
                    wall,
                    m.message_enqueue_time,
                    next(self.order),
                    m.conversation_handle,
                    m.message_sequence_number,
                    m.message_type_name,
                    len(body),
                    sent_ns,
                    dialog,
                    index,
                    phase,
                    receiver,
                )
            )
            if phase == MEASURED:
                self.measured += 1
        if self.measured >= self.messages:
            self.done.set()


def make_body(size: int, dialog: int, index: int, phase: int) -> bytes:
    head = MARKER.pack(time.perf_counter_ns(), dialog, index, phase)
    return head + b"." * (size - len(head))


async def _receive_until(
    client: BrokerClient, state: RunState, deadline: float, receiver: int, groups: int
) -> None:
    while not state.done.is_set():
        if time.monotonic() > deadline:
            return
        batch = await client.receive(QUEUE, top=TOP, timeout=POLL, groups=groups)
        state.record(time.perf_counter_ns(), batch, receiver)


async def measure(
    sender: Daemon,
    receiver: Daemon,
    *,
    messages: int,
    dialogs: int,
    senders: int,
    receivers_count: int,
    size: int,
    timeout: float,
    window: int = 1,
    groups: int = 1,
) -> dict[str, Any]:
    problems: list[str] = []
    control = await sender.client()
    receivers = [await receiver.client() for _ in range(receivers_count)]
    send_clients = [await sender.client() for _ in range(senders)]
    clients = [control, *receivers, *send_clients]
    try:
        handles = [
            (
                await control.begin_dialog(
                    example.SHOP_SERVICE, example.WAREHOUSE_SERVICE, example.CONTRACT
                )
            ).handle
            for _ in range(dialogs)
        ]

        # Warm-up: one message per dialog opens the link and creates the target endpoints.
        warm = RunState(messages=0)
        t0 = time.perf_counter()
        warm_seq = await asyncio.gather(
            *(
                control.send(h, example.ORDER, make_body(size, d, 0, WARMUP))
                for d, h in enumerate(handles)
            )
        )
        while len(warm.rows) < dialogs and time.perf_counter() - t0 < timeout:
            warm.record(
                time.perf_counter_ns(), await receivers[0].receive(QUEUE, top=TOP, timeout=POLL)
            )
        warmup_s = time.perf_counter() - t0
        if len(warm.rows) != dialogs:
            raise RuntimeError(f"warm-up: received {len(warm.rows)} of {dialogs} messages")

        # The measured run.
        state = RunState(messages=messages)
        send_start = [0] * messages
        send_end = [0] * messages
        send_seq = [0] * messages
        send_wall = [0.0] * messages
        next_k = itertools.count()

        async def send_loop(client: BrokerClient) -> None:
            while (k := next(next_k)) < messages:
                dialog, index = k % dialogs, k // dialogs
                body = make_body(size, dialog, index, MEASURED)
                send_start[k] = MARKER.unpack_from(body)[0]
                send_wall[k] = time.time()
                send_seq[k] = await client.send(handles[dialog], example.ORDER, body)
                send_end[k] = time.perf_counter_ns()

        pids = {d.name: d.process.pid if d.process else None for d in (sender, receiver)}
        commit_views = {sender.name: control, receiver.name: receivers[0]}
        commits_before = {name: await commits_so_far(c) for name, c in commit_views.items()}
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        bench_cpu_before = time.process_time()
        deadline = time.monotonic() + timeout
        receive_tasks = [
            asyncio.create_task(_receive_until(c, state, deadline, n, groups))
            for n, c in enumerate(receivers)
        ]
        await asyncio.sleep(0.05)  # the receivers are waiting before the first SEND
        tasks = receive_tasks + [
            asyncio.create_task(send_loop(c)) for c in send_clients for _ in range(window)
        ]
        try:
            await asyncio.gather(*tasks)  # the first failure (a daemon died...) ends the run
        finally:
            for task in tasks:
                task.cancel()
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        cpu["benchmark"] = time.process_time() - bench_cpu_before
        commits = {
            name: await commits_so_far(c) - commits_before[name] for name, c in commit_views.items()
        }
        if not state.done.is_set():
            problems.append(
                f"timed out after {timeout:g} s: received {state.measured} of {messages}"
            )
        # Anything arriving now is a duplicate or a stray.
        extra = RunState(messages=0)
        extra.record(
            time.perf_counter_ns(), await receivers[0].receive(QUEUE, top=TOP, timeout=1.0)
        )
        rows = state.rows + extra.rows

        # Everything acknowledged back to the initiator?
        unacked = -1
        ack_deadline = time.monotonic() + 10.0
        while time.monotonic() < ack_deadline:
            unacked = len(await control.transmission_queue())
            if unacked == 0:
                break
            await asyncio.sleep(0.05)
        sender_stats = (await control.view("stats"))[0]
        receiver_stats = (await receivers[0].view("stats"))[0] if receiver is not sender else {}
    finally:
        for c in clients:
            await c.close()

    # -- verification ------------------------------------------------------------------
    problems += verify(
        rows, warm.rows, handles, warm_seq, send_seq, messages=messages, dialogs=dialogs, size=size
    )
    await asyncio.sleep(0.5)  # the receiving broker flushes its traces every 0.2 s
    problems += broker_order_problems(receiver.directory / "data" / "traces")
    if unacked:
        problems.append(f"{unacked} message(s) still unacknowledged on the sender after 10 s")

    # -- figures -----------------------------------------------------------------------
    measured = [
        r
        for r in state.rows
        if r.phase == MEASURED
        and 0 <= r.dialog < dialogs
        and r.index * dialogs + r.dialog < messages
    ]
    latencies = sorted((r.recv_ns - r.sent_ns) / 1e6 for r in measured)
    # Breakdown on the wall clock (same machine): SEND start -> accepted into the target
    # queue (message_enqueue_time), then waiting in the queue until RECEIVE returned.
    to_queue = sorted(
        (r.enqueued_wall - send_wall[r.index * dialogs + r.dialog]) * 1e3 for r in measured
    )
    in_queue = sorted((r.recv_wall - r.enqueued_wall) * 1e3 for r in measured)
    send_ms = sorted((e - s) / 1e6 for s, e in zip(send_start, send_end, strict=True) if e)
    first = min(send_start) if messages else 0
    last_recv = max((r.recv_ns for r in measured), default=first)
    last_send = max(send_end, default=first)
    elapsed = (last_recv - first) / 1e9
    return {
        "messages": messages,
        "dialogs": dialogs,
        "senders": senders,
        "window": window,
        "receivers": receivers_count,
        "groups": groups,
        "size": size,
        "warmup_s": round(warmup_s, 3),
        "elapsed_s": round(elapsed, 3),
        "messages_per_s": round(len(measured) / elapsed) if elapsed > 0 else 0,
        "send_only_messages_per_s": round(messages / ((last_send - first) / 1e9))
        if last_send > first
        else 0,
        "latency_ms": {
            "p50": round(percentile(latencies, 50), 2),
            "p90": round(percentile(latencies, 90), 2),
            "p99": round(percentile(latencies, 99), 2),
            "max": round(latencies[-1], 2) if latencies else math.nan,
        },
        "send_call_ms": {
            "p50": round(percentile(send_ms, 50), 2),
            "p99": round(percentile(send_ms, 99), 2),
            "max": round(send_ms[-1], 2) if send_ms else math.nan,
        },
        "send_to_enqueue_ms": {
            "p50": round(percentile(to_queue, 50), 2),
            "p99": round(percentile(to_queue, 99), 2),
        },
        "enqueue_to_receive_ms": {
            "p50": round(percentile(in_queue, 50), 2),
            "p99": round(percentile(in_queue, 99), 2),
        },
        "cpu_s": {name: round(v, 2) for name, v in cpu.items()},
        "commits": commits,
        "receive_calls": len(state.batches),
        "mean_receive_batch": round(sum(state.batches) / len(state.batches), 1)
        if state.batches
        else 0,
        "sender_stats": sender_stats,
        "receiver_stats": receiver_stats,
        "problems": problems,
        "ok": not problems,
    }


def verify(
    rows: list[Received],
    warm_rows: list[Received],
    handles: list[uuid.UUID],
    warm_seq: list[int],
    send_seq: list[int],
    *,
    messages: int,
    dialogs: int,
    size: int,
) -> list[str]:
    """Exactly once, the SEND's sequence number, per-conversation order (R-DLG-1)."""
    problems: list[str] = []

    def complain(text: str) -> None:
        if len(problems) < 20:
            problems.append(text)

    target_of: dict[int, uuid.UUID] = {}
    dialog_of: dict[uuid.UUID, int] = {}
    last_seq: dict[tuple[int, uuid.UUID], int] = {}
    seen: set[tuple[int, int, int]] = set()
    measured = 0
    for r in sorted(warm_rows, key=lambda r: r.order) + sorted(rows, key=lambda r: r.order):
        marker = (r.phase, r.dialog, r.index)
        if r.message_type != example.ORDER or r.length != size or r.phase not in (0, 1):
            complain(f"unexpected message {r.message_type} ({r.length} bytes) on {r.handle}")
            continue
        if not 0 <= r.dialog < dialogs:
            complain(f"marker {marker}: no such dialog")
            continue
        if marker in seen:
            complain(f"duplicate: marker {marker} (seq {r.seq} on {r.handle}) received twice")
            continue
        seen.add(marker)
        known = target_of.setdefault(r.dialog, r.handle)
        if known != r.handle or dialog_of.setdefault(r.handle, r.dialog) != r.dialog:
            complain(f"dialog {r.dialog} arrived on two conversation handles or vice versa")
        if r.phase == WARMUP:
            expected = warm_seq[r.dialog]
        else:
            k = r.index * dialogs + r.dialog
            if not 0 <= k < messages:
                complain(f"marker {marker}: index beyond the run")
                continue
            expected = send_seq[k]
            measured += 1
        if r.seq != expected:
            complain(f"marker {marker}: received as seq {r.seq}, SEND returned {expected}")
        # Two receivers' replies may reach this process in either order: an autocommit
        # RECEIVE releases the group's lock at its commit, before its reply is read. The
        # order the broker received them in is checked from its traces.
        previous = last_seq.get((r.receiver, r.handle), 0)
        if r.seq <= previous:
            complain(
                f"order: receiver {r.receiver} got seq {r.seq} of conversation {r.handle} "
                f"after {previous}"
            )
        last_seq[(r.receiver, r.handle)] = max(previous, r.seq)
    if measured != messages:
        complain(f"count: {measured} distinct messages received, {messages} sent")
    if len(target_of) != len(handles):
        complain(f"{len(target_of)} of {len(handles)} dialogs reached the target")
    return problems


# -- running -------------------------------------------------------------------------


def run_scenario(kind: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    deployment, sender_name, receiver_name = build(
        kind,
        root,
        args.hosts,
        args.trace == "on",
        retry=None if args.ack_delay is None else {"ack_delay": args.ack_delay},
    )
    result: dict[str, Any]
    try:
        for name in deployment.daemons:
            deployment.start(name)
        result = asyncio.run(
            asyncio.wait_for(
                measure(
                    deployment.daemons[sender_name],
                    deployment.daemons[receiver_name],
                    messages=args.messages,
                    dialogs=args.dialogs,
                    senders=args.senders,
                    receivers_count=args.receivers,
                    size=args.size,
                    timeout=args.timeout,
                    window=args.window,
                    groups=args.groups,
                ),
                args.timeout + 60,
            )
        )
        for name, daemon in deployment.daemons.items():
            if not daemon.running:
                code = daemon.process.returncode if daemon.process else None
                result["problems"].append(f"daemon {name} exited during the run ({code})")
                result["ok"] = False
    except BaseException:
        for name, daemon in deployment.daemons.items():
            deployment.kill(name)
            print(f"--- {name} log ({daemon.log_path}) ---\n{daemon.log_tail()}", file=sys.stderr)
        raise
    finally:
        deployment.stop_all()
    result["scenario"] = kind
    result["daemons"] = {n: d.host for n, d in deployment.daemons.items()}
    return result


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'scenario':>8} {'msgs':>7} {'msg/s':>7} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
        f"{'max ms':>8} {'send p50':>9} {'send p99':>9} {'send/s':>7} {'rcv batch':>9} {'ok':>3}"
    )
    for r in rows:
        lat, snd = r["latency_ms"], r["send_call_ms"]
        print(
            f"{r['scenario']:>8} {r['messages']:>7} {r['messages_per_s']:>7,} "
            f"{lat['p50']:>8.2f} {lat['p90']:>8.2f} {lat['p99']:>8.2f} {lat['max']:>8.2f} "
            f"{snd['p50']:>9.2f} {snd['p99']:>9.2f} {r['send_only_messages_per_s']:>7,} "
            f"{r['mean_receive_batch']:>9} {'yes' if r['ok'] else 'NO':>3}"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    doc = __doc__ or "brokerd end-to-end dialog benchmark"
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000, help="messages measured (M)")
    parser.add_argument("--dialogs", type=int, default=20, help="dialogs the messages share")
    parser.add_argument("--senders", type=int, default=8, help="concurrent SEND connections")
    parser.add_argument(
        "--window",
        type=int,
        default=1,
        help="SENDs each sender keeps in flight on its connection (pipelined; default 1: "
        "each SEND waits for the previous one's commit)",
    )
    parser.add_argument("--receivers", type=int, default=2, help="RECEIVE connections")
    parser.add_argument(
        "--groups",
        type=int,
        default=1,
        help="conversation groups one RECEIVE may return (SPEC §6; default 1)",
    )
    parser.add_argument("--size", type=int, default=200, help=f"body bytes (>= {MARKER.size})")
    parser.add_argument(
        "--hosts",
        default="127.0.0.1,127.0.0.2",
        help="A,B: loopback addresses of the two daemons (local uses A)",
    )
    parser.add_argument("--only", choices=SCENARIOS, help="run one scenario only")
    parser.add_argument(
        "--trace", choices=("on", "off"), default="on", help="delivery traces (default on)"
    )
    parser.add_argument(
        "--ack-delay",
        type=float,
        help="retry.ack_delay of both daemons in seconds (default: the daemon's default)",
    )
    parser.add_argument(
        "--workdir", type=Path, help="keep certificates, data and logs here (default: temp)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per scenario")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    hosts = tuple(h.strip() for h in args.hosts.split(","))
    if len(hosts) != 2 or not all(hosts):
        parser.error("--hosts takes two addresses: A,B")
    args.hosts = hosts
    if args.size < MARKER.size:
        parser.error(f"--size must be at least {MARKER.size}")
    if min(args.messages, args.dialogs, args.senders, args.receivers, args.window, args.groups) < 1:
        parser.error("--messages, --dialogs, --senders, --receivers and --window must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_uvloop()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="run-", dir=args.workdir.resolve()))
        remove = False
    else:
        workdir = Path(tempfile.mkdtemp(prefix="brokerd-bench-"))
        remove = True
    description = machine(workdir)
    print(
        f"{description['cpu']}, {description['cores']} cores ({description['usable_cores']} "
        f"usable), {description['python']}, SQLite {description['sqlite']}, "
        f"{description['event_loop']} loop, data on {description['workdir_fs']}"
    )
    print(
        f"{args.messages} messages of {args.size} B over {args.dialogs} dialogs, "
        f"{args.senders} senders (window {args.window}), {args.receivers} receivers (TOP {TOP}, "
        f"{args.groups} groups), "
        f"WAL + synchronous=FULL; hosts {','.join(args.hosts)}"
    )
    results: list[dict[str, Any]] = []
    try:
        for kind in [args.only] if args.only else SCENARIOS:
            results.append(run_scenario(kind, workdir / kind, args))
    finally:
        if remove:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"data and logs kept in {workdir}")
    print_table(results)
    for r in results:
        s, t = r["sender_stats"], r["receiver_stats"] or r["sender_stats"]
        print(
            f"{r['scenario']}: {r['elapsed_s']} s measured (warm-up {r['warmup_s']} s), "
            f"{r['receive_calls']} RECEIVE calls; SEND->enqueued p50/p99 "
            f"{r['send_to_enqueue_ms']['p50']}/{r['send_to_enqueue_ms']['p99']} ms, "
            f"enqueued->RECEIVE p50/p99 {r['enqueue_to_receive_ms']['p50']}/"
            f"{r['enqueue_to_receive_ms']['p99']} ms; retransmissions {s.get('retransmissions')}, "
            f"duplicates {t.get('duplicates')}, acks sent {t.get('acks_sent')}; CPU s "
            + ", ".join(f"{name} {v}" for name, v in r["cpu_s"].items())
            + "; commits "
            + ", ".join(
                f"{name} {n} ({n / r['elapsed_s']:.0f}/s, "
                f"{r['messages'] / max(n, 1):.1f} msgs each)"
                for name, n in r["commits"].items()
            )
        )
        for p in r["problems"]:
            print(f"{r['scenario']}: VIOLATION: {p}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": description,
                    "args": {
                        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                    },
                    "results": results,
                },
                indent=2,
            )
        )
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
