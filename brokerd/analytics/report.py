"""``brokerd analyze``: run every job over a trace set, print the key tables, write the report.

:func:`analyze` loads the traces (:mod:`brokerd.analytics.load`), builds the message table
once (:mod:`brokerd.analytics.messages`, cached) and runs the jobs in turn, reporting
progress (``[6/11] latency per hop: 1.2 s``) to stderr. The result, an
:class:`Analysis`, is printed by :func:`print_summary` and written by
:func:`write_report` as ``summary.json`` (every figure, machine-readable) and
``report.html`` (the same tables, with charts of the latency distribution,
throughput over time and retransmissions; one self-contained file that any
browser opens).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from html import escape
from pathlib import Path
from typing import Any, TextIO, TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from brokerd.analytics import audit as audit_job
from brokerd.analytics import charts, delays, faults, latency, throughput, waiting
from brokerd.analytics.load import load_traces, trace_files
from brokerd.analytics.messages import message_table
from brokerd.analytics.session import DEFAULT_MASTER, spark_session
from brokerd.traces.writer import iso_micros

DEFAULT_TOP = 50
T = TypeVar("T")


@dataclass
class Table:
    """One result table, collected: at most ``limit`` rows of ``total_rows``."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    total_rows: int

    def view(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "columns": self.columns,
            "rows": self.rows,
            "total_rows": self.total_rows,
        }

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


@dataclass
class Analysis:
    inputs: dict[str, Any]
    totals: dict[str, Any]
    audit: audit_job.Audit
    tables: dict[str, Table] = field(default_factory=dict)
    bucket_seconds: int = 1
    runtime_seconds: float = 0.0
    master: str = DEFAULT_MASTER

    def view(self) -> dict[str, Any]:
        events = int(self.inputs["events"])
        return {
            "generated": iso_micros(time.time()),
            "master": self.master,
            "runtime_seconds": round(self.runtime_seconds, 3),
            "events_per_second": round(events / self.runtime_seconds, 1)
            if self.runtime_seconds
            else None,
            "inputs": self.inputs,
            "totals": self.totals,
            "audit": self.audit.view(),
            "bucket_seconds": self.bucket_seconds,
            "tables": {name: t.view() for name, t in self.tables.items()},
        }


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


def collect(df: DataFrame, title: str, limit: int | None) -> Table:
    """Collect up to ``limit`` rows (all when None), counting the rest only when cut."""
    rows = df.limit(limit + 1).collect() if limit is not None else df.collect()
    total = len(rows)
    if limit is not None and total > limit:
        rows = rows[:limit]
        total = df.count()
    columns = list(df.columns)
    return Table(
        title,
        columns,
        [[_plain(c, r[c]) for c in columns] for r in rows],
        total,
    )


class Progress:
    """``[n/N] step: seconds`` lines on stderr (or nowhere)."""

    def __init__(self, steps: int, out: TextIO | None) -> None:
        self.steps = steps
        self.done = 0
        self.out = out
        self.started = time.perf_counter()

    def run(self, name: str, step: Callable[[], T]) -> T:
        """Run one step, reporting its name and time; returns what the step returns."""
        self.done += 1
        if self.out is not None:
            print(f"[{self.done}/{self.steps}] {name} ...", file=self.out, flush=True)
        began = time.perf_counter()
        result = step()
        if self.out is not None:
            print(
                f"[{self.done}/{self.steps}] {name}: {time.perf_counter() - began:.1f} s "
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
    ).first()
    e = events.agg(
        F.count(F.when(F.col("event") == "dialog_begun", 1)).alias("endpoints_begun"),
        F.count(F.when(F.col("event") == "dialog_ended", 1)).alias("endpoints_ended"),
        F.count_distinct(F.when(F.col("event") == "delayed", F.col("conversation_id"))).alias(
            "conversations_delayed"
        ),
        F.count(F.when(F.col("event") == "timer_fired", 1)).alias("timers_fired"),
        F.count(F.when(F.col("event") == "lifetime_expired", 1)).alias("lifetimes_expired"),
        *faults.total_columns(),
    ).first()
    assert m is not None and e is not None
    out: dict[str, Any] = {}
    for row in (m, e):
        out.update({k: _plain(k, v) for k, v in row.asDict().items()})
    return out


def analyze(
    paths: Sequence[Path],
    *,
    master: str | None = None,
    spark: SparkSession | None = None,
    top: int = DEFAULT_TOP,
    progress: TextIO | None = sys.stderr,
) -> Analysis:
    """Run every job over the trace segments under ``paths``."""
    began = time.perf_counter()
    files = trace_files(list(paths))  # a wrong path fails before Spark starts
    steps = Progress(10 if spark is not None else 11, progress)
    sp = spark or steps.run(
        f"starting Spark ({master or DEFAULT_MASTER})", lambda: spark_session(master)
    )
    traces = steps.run(f"reading {len(files)} trace segment(s)", lambda: load_traces(sp, files))
    events = traces.events
    messages = message_table(events).cache()
    tables: dict[str, Table] = {}
    width = throughput.bucket_width(traces.first_t, traces.last_t)

    def put(name: str, title: str, df: DataFrame, limit: int | None = top) -> None:
        tables[name] = collect(df, title, limit)

    def latencies() -> None:
        put(
            "latency_by_service_pair",
            "Latency per service pair (ms)",
            latency.by_service_pair(messages),
        )
        put("latency_by_route", "Latency per route (ms)", latency.by_route(messages))
        put(
            "latency_histogram",
            "SEND to delivery latency",
            latency.latency_histogram(messages),
            None,
        )

    def hops() -> None:
        legs, dwell = latency.by_hop(events)
        put("latency_by_hop", "Latency per hop (ms)", legs)
        put("forwarder_dwell", "Forwarder dwell time (ms)", dwell)

    def fault_tables() -> None:
        put("faults_by_connection", "Faults per connection", faults.by_connection(events))
        put("faults_by_route", "Faults per route", faults.by_route(messages))
        put("drops_by_reason", "Drops and discards", faults.drops_by_reason(events))

    def delay_tables() -> None:
        periods = delays.delayed_periods(events, traces.last_t).cache()
        try:
            put("delayed_conversations", "DELAYED conversations", delays.by_conversation(periods))
            put("wait_reasons", "Why messages waited", delays.wait_reasons(events, periods))
        finally:
            periods.unpersist()

    def throughput_tables() -> None:
        put(
            "throughput_by_instance",
            "Throughput per instance",
            throughput.by_instance(events, width),
            None,  # at most MAX_BUCKETS per instance
        )
        put(
            "throughput_by_route",
            "Throughput per route",
            throughput.by_route(messages, width),
            None,  # at most MAX_BUCKETS per route
        )
        put("route_spread", "Dialogs over load-balanced routes", throughput.route_spread(events))

    def waiting_tables() -> None:
        put(
            "waiting_messages",
            "Messages waiting longest",
            waiting.waiting_messages(events, messages, traces.last_t),
        )
        put(
            "open_endpoints",
            "Endpoints open longest",
            waiting.open_endpoints(events, messages, traces.last_t),
        )

    try:
        steps.run("building the message table", messages.count)
        totals = steps.run("totals", lambda: _totals(events, messages))
        found = steps.run("exactly-once-in-order audit", lambda: audit_job.audit(messages))
        steps.run("latency per service pair and route", latencies)
        steps.run("latency per hop", hops)
        steps.run("faults per connection and route", fault_tables)
        steps.run("DELAYED time and wait reasons", delay_tables)
        steps.run("throughput and load balancing", throughput_tables)
        steps.run("waiting messages and open endpoints", waiting_tables)
    finally:
        messages.unpersist()
        traces.release()
    return Analysis(
        inputs=traces.view(),
        totals=totals,
        audit=found,
        tables=tables,
        bucket_seconds=width,
        runtime_seconds=time.perf_counter() - began,
        master=master or DEFAULT_MASTER,
    )


# -- printing ------------------------------------------------------------------------


def format_table(table: Table, limit: int = 10, columns: Sequence[str] | None = None) -> str:
    """A fixed-width text table of the first ``limit`` rows."""
    cols = list(columns or table.columns)
    index = [table.columns.index(c) for c in cols]
    rows = [["" if r[i] is None else str(r[i]) for i in index] for r in table.rows[:limit]]
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
        f"instance(s) ({', '.join(i['instances'])}), {i['first_event']} .. {i['last_event']}; "
        f"{i['lines_skipped']} unreadable line(s) skipped",
        file=out,
    )
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


def _html_table(table: Table) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in table.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{'' if v is None else escape(str(v))}</td>" for v in row) + "</tr>"
        for row in table.rows
    )
    more = (
        f'<p class="more">{table.total_rows - len(table.rows)} more row(s) in summary.json</p>'
        if table.total_rows > len(table.rows)
        else ""
    )
    return (
        f"<h3>{escape(table.title)} <small>({table.total_rows} rows)</small></h3>"
        f"<div class=scroll><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
        f"</table></div>{more}"
    )


def _charts(analysis: Analysis) -> list[str]:
    out = []
    # log buckets, ten per decade; empty ones between the first and last are drawn too
    counts = {
        round(math.log10(r["low_ms"]) * 10): r["messages"]
        for r in analysis.tables["latency_histogram"].records()
    }
    steps = range(min(counts), max(counts) + 1) if counts else range(0)
    out.append(
        charts.bar_chart(
            "SEND to delivery latency",
            [f"{10 ** (b / 10):.3g}-{10 ** ((b + 1) / 10):.3g}" for b in steps],
            [counts.get(b, 0) for b in steps],
            "messages",
            "milliseconds (log buckets)",
        )
    )
    rows = analysis.tables["throughput_by_instance"].records()
    buckets = sorted({r["bucket"] for r in rows})
    series: dict[str, list[float]] = {}
    for name in sorted({r["instance"] for r in rows}):
        got = {r["bucket"]: r["delivered_per_s"] for r in rows if r["instance"] == name}
        if any(got.values()):
            series[f"{name} delivered/s"] = [got.get(b, 0.0) for b in buckets]
    xs = [
        datetime.strptime(b, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp() for b in buckets
    ]
    out.append(
        charts.line_chart(
            f"Throughput over time ({analysis.bucket_seconds} s buckets)",
            xs,
            series,
            "messages delivered per second",
        )
    )
    retrans: dict[str, list[float]] = {}
    for name in sorted({r["instance"] for r in rows}):
        got = {r["bucket"]: r["retransmissions"] for r in rows if r["instance"] == name}
        if any(got.values()):
            retrans[f"{name} retransmissions"] = [float(got.get(b, 0)) for b in buckets]
    out.append(
        charts.line_chart(
            "Retransmissions over time", xs, retrans, f"per {analysis.bucket_seconds} s"
        )
    )
    conns = [r for r in analysis.tables["faults_by_connection"].records() if r["retransmissions"]][
        :30
    ]
    out.append(
        charts.bar_chart(
            "Retransmissions per connection",
            [f"{r['instance']} -> {r['peer']}" for r in conns],
            [r["retransmissions"] for r in conns],
            "retransmissions",
        )
    )
    return out


STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; font-size: 12px; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; white-space: nowrap; }
th { background: #f0f0f0; }
.scroll { max-height: 420px; overflow: auto; }
.pass { color: #1a7f37; } .fail { color: #c62828; }
.figures td:first-child { font-weight: bold; }
small, .more { color: #666; }
"""


def render_html(analysis: Analysis) -> str:
    i, a = analysis.inputs, analysis.audit
    verdict = (
        '<p class="pass">PASSED: no violation</p>'
        if a.passed
        else f'<p class="fail">FAILED: {a.total} violation(s)</p>'
    )
    violations = "".join(
        f"<li><code>{escape(audit_job.violation_line(v))}</code></li>" for v in a.violations[:500]
    )
    figures = "".join(
        f"<tr><td>{escape(k)}</td><td>{escape(str(v))}</td></tr>"
        for k, v in {**analysis.totals}.items()
    )
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<title>brokerd delivery trace report</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>brokerd delivery trace report</h1>",
        f"<p>{i['events']:,} events from {i['files']} segment(s) of instances "
        f"{escape(', '.join(i['instances']))}, {escape(i['first_event'])} to "
        f"{escape(i['last_event'])}. Analysed in {analysis.runtime_seconds:.1f} s on "
        f"{escape(analysis.master)}.</p>",
        "<h2>Exactly-once-in-order audit</h2>",
        verdict,
        f"<p>{a.streams:,} streams, {a.messages:,} messages: {a.delivered:,} delivered, "
        f"{a.waiting:,} waiting, {a.discarded:,} discarded.</p>",
        f"<ul>{violations}</ul>" if violations else "",
        f"<h2>Figures</h2><table class=figures>{figures}</table>",
        "<h2>Charts</h2>",
        *(f"<div>{svg}</div>" for svg in _charts(analysis)),
        "<h2>Tables</h2>",
        *(_html_table(t) for t in analysis.tables.values()),
        "</body></html>",
    ]
    return "\n".join(parts)


def write_report(analysis: Analysis, out_dir: Path) -> tuple[Path, Path]:
    """Write ``summary.json`` and ``report.html`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = out_dir / "summary.json"
    summary.write_text(json.dumps(analysis.view(), indent=1, default=str, allow_nan=False) + "\n")
    html = out_dir / "report.html"
    html.write_text(render_html(analysis), encoding="utf-8")
    return summary, html


# -- the command line ------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """``brokerd analyze``: returns 0, or 1 when the audit found violations."""
    try:
        analysis = analyze(
            args.paths,
            master=args.master,
            top=args.top,
            progress=None if args.quiet else sys.stderr,
        )
    finally:
        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
    print_summary(analysis)
    summary, html = write_report(analysis, args.out)
    print(f"\nwrote {summary} and {html}")
    return 0 if analysis.audit.passed else 1
