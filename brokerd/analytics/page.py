"""``report.html``: the analysis as one self-contained page a person reads first.

Owns the page: the plain name of every figure (:data:`FIGURES`), the headline
(:func:`headline`), the charts' data (:mod:`brokerd.analytics.charts`) and the
Jinja2 template ``templates/report.html.j2``. The page opens with the audit's
verdict, then the headline figures in plain words, the charts (a timeline of
throughput with retries, faults, restarts and kills; latency histograms per route
and per leg of the path), the messages that waited longest and why, the daemons'
processes, every figure, and every table. The Vega, Vega-Lite and vega-embed
JavaScript is embedded in the page (the bundle ``vl-convert`` ships), so it opens
anywhere, offline; without JavaScript the tables are all there and each chart says
it needs it.

May import the other analytics modules (never Spark itself: the page is built
from what the jobs collected), Jinja2, Altair and vl-convert.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from typing import Any

import altair as alt
import jinja2
import vl_convert
from markupsafe import Markup

from brokerd.analytics import audit as audit_job
from brokerd.analytics import charts
from brokerd.analytics.cache import kept_text
from brokerd.analytics.processes import Process, restarts
from brokerd.analytics.result import Analysis

FIGURES: dict[str, str] = {
    "messages_sent": "Messages sent",
    "messages_delivered": "Messages delivered",
    "messages_received": "Messages taken by the application (RECEIVE)",
    "messages_waiting": "Messages still waiting to be delivered",
    "messages_lost": "Messages lost (acknowledged, never delivered)",
    "messages_held": "Messages held until an earlier one arrives",
    "messages_acknowledged_receiver_untraced": "Messages acknowledged, receiver's traces absent",
    "messages_discarded": "Messages discarded by their own side",
    "messages_retransmitted": "Messages sent more than once",
    "messages_forwarded": "Messages relayed by a forwarder",
    "latency_count": "Messages with a measured latency",
    "latency_p50_ms": "Median latency, SEND to delivery (ms)",
    "latency_p90_ms": "90th percentile latency (ms)",
    "latency_p99_ms": "99th percentile latency (ms)",
    "latency_max_ms": "Longest latency (ms)",
    "latency_mean_ms": "Mean latency (ms)",
    "endpoints_begun": "Conversation endpoints opened",
    "endpoints_ended": "Conversation endpoints closed",
    "conversations_delayed": "Conversations DELAYED (no route for a while)",
    "timers_fired": "Conversation timers fired",
    "lifetimes_expired": "Dialog lifetimes expired",
    "retransmissions": "Retransmissions",
    "duplicates": "Duplicates received (and acknowledged again)",
    "corrupted_messages": "Corrupted messages (failed integrity check)",
    "drops": "Messages dropped (not acknowledged)",
    "discards": "Discard events (messages removed unacknowledged)",
    "connections_refused": "Connections refused",
    "restarts": "Daemon restarts",
    "kills": "Daemons killed (a torn trace, or an unclean stop)",
}
"""Every figure of ``summary.json``'s ``totals`` (and the processes') in plain words."""

FAULTS = ("duplicates", "corrupted_messages", "drops", "connections_refused")
"""The figures the headline adds up as faults."""

TABLE_TITLES: dict[str, str] = {
    "latency_by_service_pair": "Latency per service pair (ms)",
    "latency_by_route": "Latency per route (ms)",
    "latency_by_hop": "Latency per leg of the path (ms)",
    "forwarder_dwell": "Time forwarders held messages (ms)",
    "faults_by_connection": "Faults per connection",
    "faults_by_route": "Faults per route",
    "drops_by_reason": "Drops and discards, and why",
    "delayed_conversations": "DELAYED conversations",
    "wait_reasons": "Why messages waited",
    "route_spread": "Dialogs over load-balanced routes",
    "waiting_messages": "Messages still waiting",
    "open_endpoints": "Endpoints open longest",
    "longest_waits": "Messages that waited longest",
}
"""Tables shown in the page's last section, in this order, with these titles."""

LONGEST_SHOWN = 15
TEMPLATE = "report.html.j2"


@dataclass(frozen=True)
class Figure:
    key: str
    name: str
    value: Any


@dataclass(frozen=True)
class Card:
    """One headline figure: a big value, its plain name, a line of detail."""

    name: str
    value: str
    detail: str
    tone: str = ""
    """``good``, ``bad`` or empty."""


def plain_name(key: str) -> str:
    """A figure's plain name (its raw name, spaced, when it has none yet)."""
    return FIGURES.get(key, key.replace("_", " ").capitalize())


def _count(value: Any) -> str:
    return f"{int(value or 0):,}"


def _ms(value: Any) -> str:
    if value is None:
        return "n/a"
    v = float(value)
    if v >= 1000:
        return f"{v / 1000:.2f} s"
    return f"{v:.1f} ms" if v >= 10 else f"{v:.2f} ms"


def figures(totals: Mapping[str, Any], found: Sequence[Process]) -> list[Figure]:
    """Every figure with its plain name, the processes' restarts and kills last."""
    out = [Figure(k, plain_name(k), v) for k, v in totals.items()]
    out.append(Figure("restarts", plain_name("restarts"), restarts(list(found))))
    out.append(
        Figure("kills", plain_name("kills"), sum(p.ended == "killed" for p in found)),
    )
    return out


def headline(totals: Mapping[str, Any], found: Sequence[Process]) -> list[Card]:
    """The figures a person looks at first."""
    faults = sum(int(totals.get(k) or 0) for k in FAULTS)
    fault_detail = ", ".join(
        f"{int(totals.get(k) or 0):,} {plain_name(k).split(' (')[0].lower()}" for k in FAULTS
    )
    kills = sum(p.ended == "killed" for p in found)
    waiting = int(totals.get("messages_waiting") or 0)
    lost = int(totals.get("messages_lost") or 0)
    return [
        Card(
            "Messages delivered",
            _count(totals.get("messages_delivered")),
            f"of {_count(totals.get('messages_sent'))} sent; "
            f"{_count(totals.get('messages_received'))} taken by the application",
        ),
        Card(
            "Median latency",
            _ms(totals.get("latency_p50_ms")),
            "SEND to delivery, half the messages took less",
        ),
        Card(
            "99th percentile latency",
            _ms(totals.get("latency_p99_ms")),
            f"longest {_ms(totals.get('latency_max_ms'))}",
        ),
        Card(
            "Retransmissions",
            _count(totals.get("retransmissions")),
            f"{_count(totals.get('messages_retransmitted'))} message(s) sent more than once",
            "bad" if totals.get("retransmissions") else "good",
        ),
        Card("Faults", f"{faults:,}", fault_detail, "bad" if faults else "good"),
        Card(
            "Restarts",
            f"{restarts(list(found)):,}",
            f"{kills:,} killed; {len({p.instance for p in found})} daemon(s)",
            "bad" if kills else "",
        ),
        Card(
            "Still waiting",
            f"{waiting:,}",
            f"{lost:,} lost; {_count(totals.get('conversations_delayed'))} conversation(s) DELAYED",
            "bad" if lost else "",
        ),
    ]


def verdict(audit: audit_job.Audit) -> dict[str, Any]:
    """The audit's verdict: passed, a one-line summary, the findings by kind and listed."""
    if audit.passed:
        summary = (
            f"No violation: every message of {audit.streams:,} stream(s) was delivered "
            f"exactly once and in order, or is accounted for"
        )
    else:
        summary = f"{audit.total:,} finding(s)"
    listed = [*audit.violations, *audit.unknowns]
    return {
        "passed": audit.passed,
        "summary": summary,
        "by_kind": [(k, n) for k, n in audit.counts.items() if n],
        "lines": [audit_job.violation_line(v) for v in listed[:500]],
        "more": max(0, audit.total + audit.unknown - 500),
        "detail": f"{audit.streams:,} streams, {audit.messages:,} messages: "
        f"{audit.delivered:,} delivered, {audit.waiting:,} waiting, "
        f"{audit.discarded:,} discarded; {audit.unknown:,} finding(s) unknown (trace "
        "missing in a daemon's crash window)",
    }


def _hop_label(r: Mapping[str, Any]) -> str:
    return f"leg {r['leg']}: {r['from_instance']} → {r['to_instance']}"


def _route_label(r: Mapping[str, Any]) -> str:
    return f"{r['sender']}: {r['route'] or 'no route'} → {r['address'] or 'local'}"


def chart_specs(analysis: Analysis, found: Sequence[Process]) -> list[dict[str, Any]]:
    """The page's charts: id, title, what it shows, and its Vega-Lite spec (None: no data)."""
    t = analysis.tables

    def rows(name: str) -> list[dict[str, Any]]:
        table = t.get(name)
        return table.records() if table is not None else []

    return [
        {
            "id": "timeline",
            "title": "Throughput, retries, faults, restarts",
            "note": "Messages delivered per second by each daemon; below, on the same time "
            "axis, when retransmissions, faults, DELAYED conversations, restarts and kills "
            "happened (the bigger the dot, the more events).",
            "spec": charts.timeline(rows("throughput_by_instance"), found, analysis.bucket_seconds),
        },
        {
            "id": "latency-route",
            "title": "Latency per route",
            "note": "SEND to delivery, per sender, route and address.",
            "spec": charts.latency_histogram(rows("latency_histogram_by_route"), _route_label),
        },
        {
            "id": "latency-hop",
            "title": "Latency per leg of the path",
            "note": "From a broker's send (or forward) of a message to its arrival at the "
            "next broker.",
            "spec": charts.latency_histogram(rows("latency_histogram_by_hop"), _hop_label),
        },
    ]


def _script_json(value: Any) -> Markup:
    """JSON safe inside a ``<script>`` element (no ``</script>``, no ``<!--``)."""
    text = json.dumps(value, allow_nan=False).replace("<", "\\u003c")
    return Markup(text)  # escaped above: every "<" is \\u003c


@lru_cache(maxsize=1)
def vega_bundle() -> Markup:
    """vega, vega-lite and vega-embed, one script (the bundle vl-convert ships for the
    Vega-Lite version Altair writes).

    vl-convert bundles it afresh at each call, about 2 s of CPU taken from the JVM's
    start on a two-core machine, so it is kept in the analytics' cache
    (:mod:`brokerd.analytics.cache`) under the versions it depends on."""
    version = "_".join(alt.SCHEMA_VERSION.split(".")[:2])  # "v6.4.1" -> "v6_4"
    # With no snippet the bundle defines window.vegaEmbed (its stub wants one: say so).
    bundle: Callable[..., str] = vl_convert.javascript_bundle
    script = kept_text(
        f"vega-{metadata.version('vl-convert-python')}-{version}.js",
        lambda: bundle(vl_version=version),
    )
    if "</script" in script.lower():  # would end the page's script element early
        raise ValueError("the Vega bundle cannot be embedded: it contains </script")
    return Markup(script)  # a script, checked above


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("brokerd.analytics", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["script_json"] = _script_json
    env.filters["cell"] = lambda v: "" if v is None else v
    return env


def template() -> jinja2.Template:
    """The page's template (loaded once)."""
    return _environment().get_template(TEMPLATE)


def render(analysis: Analysis) -> str:
    """The whole page."""
    t, found = analysis.tables, analysis.processes
    longest = t.get("longest_waits")
    return template().render(
        inputs=analysis.inputs,
        runtime=f"{analysis.runtime_seconds:.1f}",
        master=analysis.master,
        verdict=verdict(analysis.audit),
        cards=headline(analysis.totals, found),
        charts=chart_specs(analysis, found),
        longest=longest.records()[:LONGEST_SHOWN] if longest is not None else [],
        processes=[p.view() for p in found],
        figures=figures(analysis.totals, found),
        tables=[(TABLE_TITLES[name], t[name]) for name in TABLE_TITLES if name in t],
        vega=vega_bundle(),
    )
