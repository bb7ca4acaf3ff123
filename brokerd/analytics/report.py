"""``brokerd analyze``: run every job over a trace set, print the key tables, write the report.

:func:`analyze` loads the traces (:mod:`brokerd.analytics.load`), builds the message table
once (:mod:`brokerd.analytics.messages`, cached) and runs the jobs in turn, reporting
progress (``[6/11] latency per hop: 1.2 s``) to stderr. The result, an
:class:`Analysis`, is printed by :func:`print_summary` and written by
:func:`write_report` as ``summary.json`` (every figure, machine-readable) and
``report.html`` (:mod:`brokerd.analytics.page`: the audit's verdict, the headline
figures in plain words, a timeline and latency charts, the longest waits and every
table; one self-contained file that any browser opens).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol, TextIO, TypeVar

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from brokerd.analytics import audit as audit_job
from brokerd.analytics import delays, faults, latency, throughput, waiting
from brokerd.analytics.load import damaged_segments, load_traces, plain_bytes, trace_files
from brokerd.analytics.messages import distinct_count, message_table
from brokerd.analytics.ordered import Ordered
from brokerd.analytics.processes import processes
from brokerd.analytics.result import Analysis, Table
from brokerd.analytics.session import DEFAULT_MASTER, Kept, keep, spark_session
from brokerd.shown_text import one_line
from brokerd.traces.writer import iso_micros

__all__ = ["Analysis", "Table", "analyze", "print_summary", "render_html", "write_report"]

DEFAULT_TOP = 50
HISTOGRAM_ROWS = 2_000
"""Buckets kept of a per-route or per-hop histogram (about 60 per series at most)."""
T = TypeVar("T")


def _plain(column: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, Decimal):
        return float(value)
    if column.endswith("_t") and isinstance(value, int):
        return iso_micros(value / 1e6)
    if column == "bucket" and isinstance(value, int):
        return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return value


_PARTITION = "_collect_partition"
"""The column that tells :func:`collect` which partition a row was counted in."""


def collect(table: Ordered, title: str, limit: int | None) -> Table:
    """The first ``limit`` rows of ``table`` in its order (all when None), and how many
    rows it has.

    The first rows of a sorted table are its partitions' first rows merged (Spark keeps
    ``limit + 1`` of each), so a table of millions of rows is never held whole. Its rows
    are counted as they go into that sort (an observation: Spark's count of a partition
    as it is consumed, kept from the last attempt of each task), so a table longer than
    the limit is computed once, not a second time for its count.

    A plan whose rows already come in the table's order is read only ``limit + 1`` rows
    into each partition (Spark takes them without sorting). A count no larger than that
    many rows for each partition seen may be of those rows only: the table is then
    counted on its own, as it was before."""
    if limit is None:
        rows = table.sorted().collect()
        total = len(rows)
    else:
        counted = Observation()
        observed = (
            table.df.withColumn(_PARTITION, F.spark_partition_id())
            .observe(
                counted,
                F.count(F.lit(1)).alias("rows"),
                F.max(_PARTITION).alias("last_partition"),
            )
            .drop(_PARTITION)
        )
        rows = observed.orderBy(*table.order).limit(limit + 1).collect()
        total = len(rows)
        if total > limit:
            rows = rows[:limit]
            seen = counted.get
            total = int(seen["rows"])
            if total <= (int(seen["last_partition"]) + 1) * (limit + 1):
                total = table.df.count()
    columns = list(table.df.columns)
    return Table(
        title,
        columns,
        [[_plain(c, r[c]) for c in columns] for r in rows],
        total,
    )


class Lines(Protocol):
    """Where progress lines go: a text file, or the analyzer's client."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class Progress:
    """``[n/N] step: seconds`` lines on stderr (or nowhere), from any thread; once Spark
    runs (:attr:`spark`), each step's jobs carry its name as their description (Spark's
    UI and event log, where a step's jobs are told from another's at once)."""

    def __init__(self, steps: int, out: Lines | None) -> None:
        self.steps = steps
        self.done = 0
        self.out = out
        self.spark: SparkSession | None = None
        self.started = time.perf_counter()
        self._lock = threading.Lock()

    def run(self, name: str, step: Callable[[], T]) -> T:
        """Run one step, reporting its name and time; returns what the step returns."""
        with self._lock:
            self.done += 1
            number = self.done
        if self.out is not None:
            print(f"[{number}/{self.steps}] {name} ...", file=self.out, flush=True)
        began = time.perf_counter()
        if self.spark is not None:  # a local property of this thread's jobs
            self.spark.sparkContext.setJobDescription(name)
        result = step()
        if self.out is not None:
            print(
                f"[{number}/{self.steps}] {name}: {time.perf_counter() - began:.1f} s "
                f"(total {time.perf_counter() - self.started:.1f} s)",
                file=self.out,
                flush=True,
            )
        return result


def _totals(events: DataFrame, messages: DataFrame) -> dict[str, Any]:
    m = messages.agg(
        F.count("sent_t").alias("messages_sent"),
        F.count("delivered_t").alias("messages_delivered"),
        F.count("received_t").alias("messages_received"),
        F.count(F.when(F.col("status") == "waiting", 1)).alias("messages_waiting"),
        F.count(F.when(F.col("status") == "lost", 1)).alias("messages_lost"),
        F.count(F.when(F.col("status") == "held", 1)).alias("messages_held"),
        F.count(F.when(F.col("status") == "acknowledged", 1)).alias(
            "messages_acknowledged_receiver_untraced"
        ),
        F.count(F.when(F.col("status") == "discarded", 1)).alias("messages_discarded"),
        F.count(F.when(F.col("retransmissions") > 0, 1)).alias("messages_retransmitted"),
        F.count(F.when(F.col("forwards") > 0, 1)).alias("messages_forwarded"),
        *latency.distribution(latency.millis("delivered_t", "sent_t"), "latency_"),
    )
    e = events.agg(
        F.count(F.when(F.col("event") == "dialog_begun", 1)).alias("endpoints_begun"),
        F.count(F.when(F.col("event") == "dialog_ended", 1)).alias("endpoints_ended"),
        distinct_count(F.when(F.col("event") == "delayed", F.col("conversation_id"))).alias(
            "conversations_delayed"
        ),
        F.count(F.when(F.col("event") == "timer_fired", 1)).alias("timers_fired"),
        F.count(F.when(F.col("event") == "lifetime_expired", 1)).alias("lifetimes_expired"),
        *faults.total_columns(),
    )
    row = m.crossJoin(e).first()  # one row each: one job for both
    assert row is not None
    return {k: _plain(k, v) for k, v in row.asDict().items()}


STEP_THREADS = 3
"""Steps run at once. Each is a few Spark jobs: on a small set mostly planning, which runs
on the driver while another step's tasks run; on a large one a step's last tasks, and its
driver work between jobs, leave cores idle that another step's tasks use (the
five-million-event set: 254 s with three at a time, 287 s one at a time, same load)."""


def _warm_page() -> None:
    """Load what the report page needs and does not depend on the analysis (its modules,
    the Vega bundle, the template), while Spark starts. The page's module is imported
    here, not with this one: Altair, Jinja2 and vl-convert take about half a second to
    import, spent while the JVM starts instead of before it."""
    with contextlib.suppress(Exception):  # render_html says what is wrong, later
        from brokerd.analytics import page

        page.vega_bundle()
        page.template()


def analyze(
    paths: Sequence[Path],
    *,
    master: str | None = None,
    spark: SparkSession | None = None,
    top: int = DEFAULT_TOP,
    progress: Lines | None = sys.stderr,
    witness: Sequence[tuple[str, bool, int, int]] = (),
) -> Analysis:
    """Run every job over the trace segments under ``paths``; ``witness``: the endpoints of
    database files, (conversation id, is initiator, sent through, received through), that
    confirm what a crash window hid (:func:`brokerd.analytics.audit.audit`)."""
    began = time.perf_counter()
    files = trace_files(list(paths))  # a wrong path fails before Spark starts
    size = plain_bytes(files)
    with ThreadPoolExecutor(2) as driver, ThreadPoolExecutor(STEP_THREADS) as run:
        # the driver's own work runs while the JVM starts
        listed = driver.submit(processes, files)
        checked = driver.submit(damaged_segments, files)
        driver.submit(_warm_page)
        steps = Progress(10 if spark is not None else 11, progress)
        sp = spark or steps.run(
            f"starting Spark ({master or DEFAULT_MASTER})",
            lambda: spark_session(master, input_bytes=size),
        )
        steps.spark = sp
        damaged = checked.result()
        for path, error in damaged.items():  # said whatever the progress: data is left out
            print(
                f"brokerd analyze: {path}: a damaged compressed segment, left out ({error})",
                file=sys.stderr,
            )
        traces = steps.run(
            f"reading {len(files) - len(damaged)} trace segment(s)",
            lambda: load_traces(sp, files, damaged=damaged),
        )
        try:
            events = traces.events
            kept = steps.run("building the message table", lambda: _kept(message_table(events)))
            messages = kept.df
            try:
                jobs = _Jobs(events, messages, traces.first_t, traces.last_t, top)
                audited = run.submit(
                    steps.run,
                    "exactly-once-in-order audit",
                    lambda: audit_job.audit(messages, events, witnesses(sp, witness)),
                )
                parts = [run.submit(steps.run, name, job) for name, job in jobs.steps()]
                summed = run.submit(steps.run, "totals", lambda: _totals(events, messages))
                found = audited.result()
                made = [part.result() for part in parts]
                totals = summed.result()
            finally:
                kept.release()
        finally:
            traces.release()
        spans = listed.result()
    tables = {name: table for part in made for name, table in part.items()}
    return Analysis(
        inputs=traces.view(),
        totals=totals,
        audit=found,
        tables={name: tables[name] for name in TABLES if name in tables},
        bucket_seconds=jobs.width,
        runtime_seconds=time.perf_counter() - began,
        master=master or DEFAULT_MASTER,
        processes=spans,
    )


def _kept(messages: DataFrame) -> Kept:
    """The message table, computed once, into the cache (released if that fails: a job
    cancelled, an executor lost)."""
    kept = keep(messages)
    try:
        kept.df.count()
    except BaseException:
        kept.release()
        raise
    return kept


TABLES = (
    "latency_by_service_pair",
    "latency_by_route",
    "latency_histogram",
    "latency_histogram_by_route",
    "latency_by_hop",
    "forwarder_dwell",
    "latency_histogram_by_hop",
    "faults_by_connection",
    "faults_by_route",
    "drops_by_reason",
    "delayed_conversations",
    "wait_reasons",
    "longest_waits",
    "throughput_by_instance",
    "throughput_by_route",
    "route_spread",
    "waiting_messages",
    "open_endpoints",
)
"""The tables of an analysis, in the order of ``summary.json``."""


class _Jobs:
    """The steps that make the tables, each from the events and the message table; a
    step returns its tables (name -> :class:`Table`), so steps can run at once."""

    def __init__(
        self, events: DataFrame, messages: DataFrame, first_t: int, last_t: int, top: int
    ) -> None:
        self.events = events
        self.messages = messages
        self.last_t = last_t
        self.top = top
        self.width = throughput.bucket_width(first_t, last_t)

    def steps(self) -> list[tuple[str, Callable[[], dict[str, Table]]]]:
        """The steps, longest first (they start in this order)."""
        return [
            ("waiting messages and open endpoints", self.waiting),
            ("DELAYED time, wait reasons and longest waits", self.delays),
            ("latency per service pair and route", self.latencies),
            ("latency per hop", self.hops),
            ("throughput and load balancing", self.throughput),
            ("faults per connection and route", self.faults),
        ]

    def latencies(self) -> dict[str, Table]:
        m, top = self.messages, self.top
        return {
            "latency_by_service_pair": collect(
                latency.by_service_pair(m), "Latency per service pair (ms)", top
            ),
            "latency_by_route": collect(latency.by_route(m), "Latency per route (ms)", top),
            "latency_histogram": collect(
                latency.latency_histogram(m), "SEND to delivery latency", None
            ),
            "latency_histogram_by_route": collect(
                latency.histogram_by_route(m),
                "SEND to delivery latency per route",
                HISTOGRAM_ROWS,
            ),
        }

    def hops(self) -> dict[str, Table]:
        legs, dwell, histogram = latency.by_hop(self.messages)
        return {
            "latency_by_hop": collect(legs, "Latency per hop (ms)", self.top),
            "forwarder_dwell": collect(dwell, "Forwarder dwell time (ms)", self.top),
            "latency_histogram_by_hop": collect(histogram, "Latency per hop", HISTOGRAM_ROWS),
        }

    def faults(self) -> dict[str, Table]:
        e, top = self.events, self.top
        return {
            "faults_by_connection": collect(faults.by_connection(e), "Faults per connection", top),
            "faults_by_route": collect(faults.by_route(self.messages), "Faults per route", top),
            "drops_by_reason": collect(faults.drops_by_reason(e), "Drops and discards", top),
        }

    def delays(self) -> dict[str, Table]:
        e, top = self.events, self.top
        kept = keep(delays.delayed_periods(e, self.last_t))
        periods = kept.df
        try:
            per_conversation = delays.by_conversation(periods)
            return {
                "delayed_conversations": collect(per_conversation, "DELAYED conversations", top),
                "wait_reasons": collect(
                    delays.wait_reasons(e, periods), "Why messages waited", top
                ),
                "longest_waits": collect(
                    waiting.longest_waits(e, self.messages, periods, self.last_t, top),
                    "Messages that waited longest",
                    top,
                ),
            }
        finally:
            kept.release()

    def throughput(self) -> dict[str, Table]:
        e, m, width = self.events, self.messages, self.width
        return {
            "throughput_by_instance": collect(
                throughput.by_instance(e, width),
                "Throughput per instance",
                None,  # at most MAX_BUCKETS per instance
            ),
            "throughput_by_route": collect(
                throughput.by_route(m, width),
                "Throughput per route",
                None,  # at most MAX_BUCKETS per route
            ),
            "route_spread": collect(
                throughput.route_spread(e), "Dialogs over load-balanced routes", self.top
            ),
        }

    def waiting(self) -> dict[str, Table]:
        e, m, last_t, top = self.events, self.messages, self.last_t, self.top
        return {
            "waiting_messages": collect(
                waiting.waiting_messages(e, m, last_t), "Messages waiting longest", top
            ),
            "open_endpoints": collect(
                waiting.open_endpoints(e, m, last_t), "Endpoints open longest", top
            ),
        }


# -- printing ------------------------------------------------------------------------


def format_table(table: Table, limit: int = 10, columns: Sequence[str] | None = None) -> str:
    """A fixed-width text table of the first ``limit`` rows, one line a row: a cell's
    control characters (a line break, an escape sequence in a reason a peer sent) are
    shown as escapes, as ``brokerctl`` shows a view's (:func:`one_line`)."""
    cols = list(columns or table.columns)
    index = [table.columns.index(c) for c in cols]
    rows = [
        ["" if r[i] is None else one_line(str(r[i])) for i in index] for r in table.rows[:limit]
    ]
    widths = [max([len(c), *(len(r[n]) for r in rows)]) for n, c in enumerate(cols)]
    lines = [
        f"{table.title} ({table.total_rows} rows)",
        "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    if table.total_rows > len(rows):
        lines.append(f"... and {table.total_rows - len(rows)} more (see summary.json)")
    return "\n".join(lines)


PRINTED: dict[str, Sequence[str] | None] = {
    "latency_by_service_pair": (
        "service",
        "far_service",
        "count",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "max_ms",
        "receive_p50_ms",
    ),
    "latency_by_route": ("sender", "route", "address", "count", "p50_ms", "p99_ms", "max_ms"),
    "latency_by_hop": (
        "leg",
        "from_instance",
        "to_instance",
        "count",
        "p50_ms",
        "p99_ms",
        "max_ms",
    ),
    "faults_by_connection": (
        "instance",
        "peer",
        "fragments_sent",
        "retransmissions",
        "duplicates",
        "corrupted_messages",
        "refused",
    ),
    "faults_by_route": None,
    "wait_reasons": ("kind", "reason", "where", "times", "total_seconds", "still_waiting"),
    "route_spread": None,
    "waiting_messages": ("conversation_id", "seq", "sender", "age_seconds", "last_status"),
    "longest_waits": ("conversation_id", "seq", "sender", "status", "wait_seconds", "reason"),
    "open_endpoints": (
        "conversation_id",
        "initiator",
        "instance",
        "age_seconds",
        "idle_seconds",
        "last_event",
        "messages_not_received",
    ),
}


def print_summary(analysis: Analysis, out: TextIO = sys.stdout, limit: int = 10) -> None:
    i, t, a = analysis.inputs, analysis.totals, analysis.audit
    print(
        f"{i['events']:,} events from {i['files']} segment(s) of {len(i['instances'])} "
        f"instance(s) ({one_line(', '.join(i['instances']))}), {i['first_event']} .. "
        f"{i['last_event']}; "
        f"{i['lines_skipped']} unreadable line(s) skipped",
        file=out,
    )
    for damaged in i.get("damaged_segments", []):
        print(f"left out, damaged: {damaged['file']} ({damaged['error']})", file=out)
    print(
        f"messages: {t['messages_sent']:,} sent, {t['messages_delivered']:,} delivered, "
        f"{t['messages_received']:,} received, {t['messages_waiting']:,} waiting, "
        f"{t['messages_discarded']:,} discarded; latency SEND->delivered p50 "
        f"{t['latency_p50_ms']} ms, p99 {t['latency_p99_ms']} ms, max {t['latency_max_ms']} ms",
        file=out,
    )
    print(
        f"faults: {t['retransmissions']:,} retransmissions, {t['duplicates']:,} duplicates, "
        f"{t['corrupted_messages']:,} corrupted messages, {t['drops']:,} drops, "
        f"{t['connections_refused']:,} connections refused; "
        f"{t['conversations_delayed']:,} conversation(s) DELAYED",
        file=out,
    )
    verdict = "PASSED" if a.passed else f"FAILED: {a.total} violation(s)"
    print(
        f"\nexactly-once-in-order audit over {a.streams:,} stream(s), {a.messages:,} "
        f"message(s): {verdict}",
        file=out,
    )
    for v in a.violations[: limit * 2]:
        print("  " + audit_job.violation_line(v), file=out)
    if a.total > limit * 2:
        print(f"  ... and {a.total - limit * 2} more (see summary.json)", file=out)
    if a.unknown:
        print(
            f"{a.unknown} finding(s) unknown: their events were lost in a daemon's crash window",
            file=out,
        )
        for v in a.unknowns[:limit]:
            print("  " + audit_job.violation_line(v), file=out)
    for name, columns in PRINTED.items():
        table = analysis.tables.get(name)
        if table is not None and table.rows:
            print("\n" + format_table(table, limit, columns), file=out)
    print(
        f"\nanalysed in {analysis.runtime_seconds:.1f} s "
        f"({i['events'] / max(analysis.runtime_seconds, 1e-9):,.0f} events/s) on {analysis.master}",
        file=out,
    )


# -- the report files --------------------------------------------------------------------


def render_html(analysis: Analysis) -> str:
    """The report page (:mod:`brokerd.analytics.page`)."""
    from brokerd.analytics import page  # see _warm_page

    return page.render(analysis)


def write_report(analysis: Analysis, out_dir: Path) -> tuple[Path, Path]:
    """Write ``summary.json`` and ``report.html`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = out_dir / "summary.json"
    summary.write_text(json.dumps(analysis.view(), indent=1, default=str, allow_nan=False) + "\n")
    html = out_dir / "report.html"
    html.write_text(render_html(analysis), encoding="utf-8")
    return summary, html


# -- the command line ------------------------------------------------------------------------


def witnesses(spark: SparkSession, rows: Sequence[tuple[str, bool, int, int]]) -> DataFrame | None:
    """The endpoints of database files as a table for the audit, or None without any."""
    if not rows:
        return None
    return spark.createDataFrame(list(rows), audit_job.WITNESS_SCHEMA)


def run(args: argparse.Namespace, witness: Sequence[tuple[str, bool, int, int]] = ()) -> int:
    """``brokerd analyze``: returns 0, or 1 when the audit found violations."""
    try:
        analysis = analyze(
            args.paths,
            master=args.master,
            top=args.top,
            progress=None if args.quiet else sys.stderr,
            witness=witness,
        )
    finally:
        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
    print_summary(analysis)
    summary, html = write_report(analysis, args.out)
    print(f"\nwrote {summary} and {html}")
    return 0 if analysis.audit.passed else 1
