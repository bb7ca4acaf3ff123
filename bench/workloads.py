"""The workloads W1-W6 and how one run of each is carried out against brokerd.

Every run builds a fresh deployment (:mod:`bench.deployments`) in a working
directory, starts its daemons, runs an unrecorded warm-up, then the measured run with
the producer and the consumer in separate OS processes (:mod:`bench.producer`,
:mod:`bench.consumer`), reads each daemon's CPU time (``/proc/PID/stat``) before and
after, its peak resident memory (``VmHWM``) and counters, stops the daemons and
removes the directory. W6 (recovery) has its own sequence, see :func:`run_recovery`.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from bench import checks, consumer, producer, report
from bench.deployments import Topology, build, commits_so_far
from bench.system import cpu_seconds, memory_mb, written_bytes
from brokerd.tools.launcher import Daemon

MIB = 1 << 20
RECEIVE_BYTES = 64 * MIB
"""A RECEIVE's reply is one client frame, whose body the SDK accepts up to
``DEFAULT_MAX_BODY`` (128 MiB): TOP is lowered so that its bodies fit in half of that."""


W4_RECEIVERS = 8
"""W4's consumer runs eight RECEIVE loops. A RECEIVE of one conversation group (SPEC
§6, as SQL Server's) returns at most 10 messages of W4's dialogs, and a single reader
would commit once per 10 messages; a Service Broker application facing many
conversation groups runs several queue readers (activation's MAX_QUEUE_READERS), whose
commits the daemon groups. With :data:`W4_GROUPS` each RECEIVE takes many groups."""
W4_GROUPS = 1024
"""W4's RECEIVEs each return the messages of up to 1,024 conversation groups (SPEC §6's
``groups``, brokerd's own): the messages of many dialogs in one round trip and one
removal, each group locked as a RECEIVE of one locks it."""


@dataclass(frozen=True)
class Workload:
    name: str
    topology: str
    messages: int
    size: int
    dialogs: int
    what: str
    receivers: int = 1
    """Concurrent RECEIVE loops of the consumer by default."""
    groups: int = 1
    """Conversation groups one RECEIVE may return by default (SPEC §6)."""


WORKLOADS = {
    w.name: w
    for w in (
        Workload("W1", "local", 50_000, 200, 1, "local: producer and consumer on one broker"),
        Workload("W2", "remote", 50_000, 200, 1, "remote: producer on A, consumer on B"),
        Workload("W3", "remote", 500, MIB, 1, "large remote: 1 MiB bodies, A to B"),
        Workload(
            "W4",
            "remote",
            100_000,
            200,
            10_000,
            "many dialogs, 10 messages each, A to B",
            receivers=W4_RECEIVERS,
            groups=W4_GROUPS,
        ),
        Workload("W5", "forwarder", 50_000, 200, 1, "via a forwarder: A to B through C"),
        Workload("W6", "remote", 1_000_000, 200, 100, "recovery: A restarted with a backlog"),
    )
}
PEER_WORKLOADS = ("W1", "W2", "W3", "W4")
"""The workloads the peer's benchmark runs too (W4 as :data:`PEER_STANDS_IN`)."""
PEER_STANDS_IN = {"W4": "W2"}
"""A workload the peer's benchmark has no name for, and the one it runs instead: the
peer has no dialogs, so for W4 it moves the same messages of the same size as one
stream (its W2), which is what an application of many dialogs asks of it."""


@dataclass(frozen=True)
class Options:
    workload: str
    messages: int
    size: int
    dialogs: int
    window: int = 1000
    batch: int = 1
    """SENDs per request (``send_many``); 1 pipelines single SENDs."""
    top: int = 1000
    receivers: int = 1
    groups: int = 1
    """Conversation groups one RECEIVE may return (``receive(..., groups=n)``)."""
    encryption: bool = True
    trace: bool = True
    warmup: int = 0
    timeout: float = 300.0
    workdir: Path | None = None
    keep: bool = False
    databases: int = 2
    """The local topology's databases: 2, the shop and the warehouse (delivery through the
    local link), or 1 holding both services (SEND straight into the target queue)."""

    @property
    def receive_top(self) -> int:
        """``top``, lowered for large bodies (see :data:`RECEIVE_BYTES`)."""
        return max(1, min(self.top, RECEIVE_BYTES // self.size))

    @property
    def mode(self) -> str:
        """The non-default modes, labelled in every result line ("" = all defaults)."""
        labels = []
        if not self.encryption:
            labels.append("encryption off")
        if not self.trace:
            labels.append("trace off")
        if self.batch > 1:
            labels.append(f"batch {self.batch}")
        if self.databases == 1:
            labels.append("one database")
        if self.groups > 1:
            labels.append(f"groups {self.groups}")
        return ", ".join(labels)


def default_warmup(workload: Workload, messages: int) -> int:
    """Unrecorded messages before each measured run: a tenth of the run, 10 to 5,000."""
    if workload.name == "W6":
        return 0
    return max(10, min(5000, messages // 10))


# -- processes -------------------------------------------------------------------------


_SPAWN = multiprocessing.get_context("spawn")


@dataclass
class Child:
    process: multiprocessing.process.BaseProcess
    results: Connection
    ready: Event | None = None
    """Kept alive until the child has unpickled it."""

    def result(self, deadline: float) -> dict[str, Any]:
        """The child's result dict; it is terminated if none comes by ``deadline``."""
        result: dict[str, Any] | None = None
        try:
            if self.results.poll(max(0.0, deadline - time.monotonic())):
                result = self.results.recv()
        except EOFError:
            pass
        finally:
            self.process.join(10)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
        return result if result is not None else {"errors": ["no result from a child process"]}


def start_consumer(job: consumer.ConsumerJob, wait_ready: float | None = 30.0) -> Child:
    """Start the consumer process; wait (``wait_ready`` s) until it has connected."""
    ready = _SPAWN.Event()
    receive_end, send_end = _SPAWN.Pipe(duplex=False)
    process = _SPAWN.Process(target=consumer.main, args=(job, ready, send_end), daemon=True)
    process.start()
    send_end.close()
    child = Child(process, receive_end, ready)
    if wait_ready is not None and not ready.wait(wait_ready):
        child.result(time.monotonic())
        raise RuntimeError(f"the consumer did not connect within {wait_ready:g} s")
    return child


def start_producer(job: producer.ProducerJob) -> Child:
    receive_end, send_end = _SPAWN.Pipe(duplex=False)
    process = _SPAWN.Process(target=producer.main, args=(job, send_end), daemon=True)
    process.start()
    send_end.close()
    return Child(process, receive_end)


def producer_job(
    daemon: Daemon, options: Options, messages: int, dialogs: int
) -> producer.ProducerJob:
    return producer.ProducerJob(
        daemon.host,
        daemon.client_port,
        daemon.token_file,
        messages,
        options.size,
        dialogs,
        options.window,
        options.timeout,
        options.batch,
    )


def consumer_job(
    daemon: Daemon, options: Options, messages: int, dialogs: int
) -> consumer.ConsumerJob:
    return consumer.ConsumerJob(
        daemon.host,
        daemon.client_port,
        daemon.token_file,
        messages,
        options.size,
        dialogs,
        options.receive_top,
        options.receivers,
        options.timeout,
        options.groups,
    )


def transfer(
    topology: Topology, options: Options, messages: int, dialogs: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One producer/consumer pair: the consumer connects first, then the producer sends."""
    source, sink = topology.daemons[topology.producer], topology.daemons[topology.consumer]
    receiving = start_consumer(consumer_job(sink, options, messages, dialogs))
    sending = start_producer(producer_job(source, options, messages, dialogs))
    deadline = time.monotonic() + options.timeout + 60
    produced = sending.result(deadline)
    consumed = receiving.result(deadline)
    return produced, consumed


# -- daemon figures --------------------------------------------------------------------


async def _views(daemons: dict[str, Daemon], wait_acked: str | None) -> dict[str, dict[str, Any]]:
    """Each daemon's ``stats`` row and its unacknowledged messages; first waits (up to
    30 s) until ``wait_acked`` holds none, so its counters include the last acks."""
    out: dict[str, dict[str, Any]] = {}
    for name, daemon in daemons.items():
        client = await daemon.client()
        try:
            deadline = time.monotonic() + (30.0 if name == wait_acked else 0.0)
            while True:
                endpoints = await client.conversation_endpoints()
                unacked = sum(e.unacknowledged for e in endpoints)
                if unacked == 0 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            (stats,) = await client.view("stats")
            out[name] = {**stats, "unacknowledged": unacked}
        finally:
            await client.close()
    return out


@dataclass(frozen=True)
class Counters:
    """What each daemon has used so far: CPU seconds, group commits and bytes written to
    storage. A daemon that is not running has used nothing since it (re)starts."""

    cpu: dict[str, float]
    commits: dict[str, int]
    written: dict[str, float]

    def since(self, before: Counters) -> Counters:
        return Counters(
            {n: v - before.cpu.get(n, 0.0) for n, v in self.cpu.items()},
            {n: v - before.commits.get(n, 0) for n, v in self.commits.items()},
            {n: v - before.written.get(n, 0.0) for n, v in self.written.items()},
        )


def daemon_counters(topology: Topology) -> Counters:
    """Each running daemon's :class:`Counters` now (its commits from its ``databases``
    view, :func:`commits_so_far`)."""
    running = {n: d for n, d in topology.daemons.items() if d.running}
    pids = {n: d.process.pid if d.process else None for n, d in running.items()}
    cpu = {n: cpu_seconds(pid) for n, pid in pids.items()}
    written = {n: written_bytes(pid) for n, pid in pids.items()}

    async def read() -> dict[str, int]:
        out: dict[str, int] = {}
        for name, daemon in running.items():
            client = await daemon.client()
            try:
                out[name] = await commits_so_far(client)
            finally:
                await client.close()
        return out

    return Counters(cpu, asyncio.run(read()), written)


def daemon_figures(
    topology: Topology, before: Counters, messages: int, wait_acked: str | None
) -> dict[str, Any]:
    """Each daemon's use over the measured run (since ``before``, up to now: the last
    acknowledgements, which ``wait_acked`` is waited for, come after), its peak memory
    and its counters."""
    daemons = topology.daemons
    pids = {n: d.process.pid if d.process else None for n, d in daemons.items()}
    used = daemon_counters(topology).since(before)
    views = asyncio.run(_views(daemons, wait_acked))
    return {
        "cpu_daemon_s": {n: report.rounded(v, 2) for n, v in used.cpu.items()},
        "cpu_us_per_msg": {n: report.rounded(v * 1e6 / messages, 1) for n, v in used.cpu.items()},
        "rss_peak_mb": {n: report.rounded(memory_mb(pid), 1) for n, pid in pids.items()},
        "commits": used.commits,
        "written_kb_per_msg": {
            n: report.rounded(v / 1000 / messages, 2) for n, v in used.written.items()
        },
        "retransmissions": sum(int(v.get("retransmissions", 0)) for v in views.values()),
        "duplicates": sum(int(v.get("duplicates", 0)) for v in views.values()),
        "bodies_read_back": sum(int(v.get("bodies_read_back", 0)) for v in views.values()),
        "unacknowledged": sum(int(v["unacknowledged"]) for v in views.values()),
    }


# -- runs ------------------------------------------------------------------------------


def base_line(options: Options) -> dict[str, Any]:
    return {
        "workload": options.workload,
        "broker": report.BROKERD,
        "messages": options.messages,
        "size": options.size,
        "dialogs": options.dialogs,
        "window": options.window,
        "batch": options.batch,
        "top": options.receive_top,
        "receivers": options.receivers,
        "encryption": "on" if options.encryption else "off",
        "trace": "on" if options.trace else "off",
        "mode": options.mode,
    }


def run(options: Options) -> dict[str, Any]:
    """One run of ``options.workload``; returns its result line."""
    root = Path(tempfile.mkdtemp(prefix=f"brokerd-bench-{options.workload}-", dir=options.workdir))
    workload = WORKLOADS[options.workload]
    topology = build(
        workload.topology,
        root,
        encryption=options.encryption,
        trace=options.trace,
        databases=options.databases,
    )
    try:
        if workload.name == "W6":
            return run_recovery(topology, options)
        return run_transfer(topology, options)
    except BaseException:
        for name, daemon in topology.daemons.items():
            topology.deployment.kill(name)
            print(f"--- {name} log ({daemon.log_path}) ---\n{daemon.log_tail()}", file=sys.stderr)
        raise
    finally:
        topology.deployment.stop_all()
        if not options.keep:
            shutil.rmtree(root, ignore_errors=True)


def run_transfer(topology: Topology, options: Options) -> dict[str, Any]:
    """W1-W5: warm-up, then the measured transfer."""
    topology.start()
    line = base_line(options)
    problems: list[str] = []
    if options.warmup:
        produced, consumed = transfer(topology, options, options.warmup, 1)
        warm = checks.run_problems(produced, consumed, options.warmup)
        problems += [f"warm-up: {p}" for p in warm]
    before = daemon_counters(topology)
    produced, consumed = transfer(topology, options, options.messages, options.dialogs)
    figures = daemon_figures(topology, before, options.messages, topology.producer)
    if consumed.get("count"):
        line.update(report.throughput(consumed, produced.get("t0", 0), options.size))
    problems += checks.run_problems(produced, consumed, options.messages)
    if options.trace and options.messages + options.warmup <= 200_000:
        time.sleep(0.5)  # traces are flushed every 0.2 s
        sink = topology.daemons[topology.consumer]
        problems += checks.broker_order_problems(sink.directory / "data" / "traces")
    if figures["unacknowledged"]:
        problems.append(f"{figures['unacknowledged']} messages still unacknowledged after 30 s")
    for name, daemon in topology.daemons.items():
        if not daemon.running:
            problems.append(f"daemon {name} exited during the run")
    line.update(
        {
            "publish_confirm_s": report.rounded((produced["t_done"] - produced["t0"]) / 1e9, 4)
            if "t_done" in produced
            else None,
            "received": consumed.get("count", 0),
            "receive_calls": consumed.get("receive_calls", 0),
            "cpu_producer_s": report.rounded(produced.get("cpu", math.nan), 2),
            "cpu_consumer_s": report.rounded(consumed.get("cpu", math.nan), 2),
            **figures,
            "warmup": options.warmup,
            "ok": not problems,
        }
    )
    if problems:
        line["problems"] = problems[: checks.MAX_PROBLEMS]
    return line


def run_recovery(topology: Topology, options: Options) -> dict[str, Any]:
    """W6: the producer SENDs ``messages`` to A while B is down, so they wait in A's
    transmission queue; A is SIGKILLed and restarted, then B starts with the consumer
    waiting. Reported: the SEND rate into the backlog, A's RSS holding it, A's restart
    time, the time from B's start (ready) to the first message received and to the last
    (the backlog drained), retransmissions and duplicates, and each daemon's peak RSS."""
    a_name, b_name = topology.producer, topology.consumer
    a, b = topology.daemons[a_name], topology.daemons[b_name]
    line = base_line(options)
    problems: list[str] = []
    topology.start(a_name)
    produced = start_producer(producer_job(a, options, options.messages, options.dialogs)).result(
        time.monotonic() + options.timeout + 60
    )
    backlog_rss = memory_mb(a.process.pid if a.process else None, "VmRSS")
    t_kill = time.monotonic_ns()
    topology.deployment.kill(a_name)
    topology.start(a_name)
    t_restarted = time.monotonic_ns()
    receiving = start_consumer(
        consumer_job(b, options, options.messages, options.dialogs), wait_ready=None
    )
    time.sleep(0.5)  # the consumer process is up and retrying its connection
    before = daemon_counters(topology)
    t_peer = time.monotonic_ns()
    topology.start(b_name)
    t_peer_ready = time.monotonic_ns()
    consumed = receiving.result(time.monotonic() + options.timeout + 60)
    figures = daemon_figures(topology, before, options.messages, a_name)  # B: its whole life
    t_drained = time.monotonic_ns()
    if consumed.get("count"):
        line.update(report.throughput(consumed, t_peer_ready, options.size))
    problems += checks.run_problems(produced, consumed, options.messages)
    if figures["unacknowledged"]:
        problems.append(f"{figures['unacknowledged']} messages still unacknowledged after 30 s")
    first, last = consumed.get("first_ns", 0), consumed.get("last_ns", 0)

    def since(start: int, end: int) -> float | None:
        return round((end - start) / 1e9, 3) if end and start else None

    sending_s = since(produced.get("t0", 0), produced.get("t_done", 0))
    line.update(
        {
            "send_msgs_per_s": round(options.messages / sending_s, 1) if sending_s else None,
            "backlog_rss_mb": report.rounded(backlog_rss, 1),
            "restart_s": since(t_kill, t_restarted),
            "peer_start_s": since(t_peer, t_peer_ready),
            "first_delivery_s": since(t_peer_ready, first),
            "first_delivery_after_restart_s": since(t_restarted, first),
            "all_received_s": since(t_peer_ready, last),
            "drained_s": since(t_peer_ready, t_drained) if not figures["unacknowledged"] else None,
            "received": consumed.get("count", 0),
            "receive_calls": consumed.get("receive_calls", 0),
            "cpu_producer_s": report.rounded(produced.get("cpu", math.nan), 2),
            "cpu_consumer_s": report.rounded(consumed.get("cpu", math.nan), 2),
            **figures,
            "ok": not problems,
        }
    )
    if problems:
        line["problems"] = problems[: checks.MAX_PROBLEMS]
    return line
