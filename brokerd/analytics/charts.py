"""The report's charts, as Vega-Lite specifications built with Altair.

Each function takes rows the jobs collected (``Table.records()``) and returns a
Vega-Lite specification (a dict, its data inline), which the report page draws
with the Vega JavaScript embedded in it (:mod:`brokerd.analytics.page`):

* :func:`latency_histogram`: latencies in log buckets (ten per decade), one stacked
  colour per series (a route, or a leg of the path);
* :func:`timeline`: messages delivered per second per instance over time, over a
  strip that marks, on the same time axis, retransmissions, faults (duplicates,
  corrupted messages, drops, refused connections), DELAYED conversations, and the
  daemons' restarts and kills, each with its count or process on hover.

No chart is drawn from nothing: an empty input gives None, and the page says
there was no data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import altair as alt

from brokerd.analytics.processes import Process
from brokerd.analytics.throughput import FAULTS

WIDTH = 940
"""Plot width of a full-width chart in pixels (the page's column is about 1,100)."""
HEIGHT = 220
PANEL_WIDTH = 430
PANEL_HEIGHT = 110
"""One panel of a histogram's small multiples, two a row."""
MAX_SERIES = 8
"""Series beyond this many (the smallest) are summed into "other"."""

FAULT_LABELS = {
    "duplicates": "duplicate",
    "corrupted_messages": "corrupted message",
    "drops": "drop",
    "connections_refused": "connection refused",
    "delayed": "conversation DELAYED",
}
"""Timeline rows of the fault columns of ``throughput_by_instance`` (:data:`FAULTS`)."""
assert set(FAULT_LABELS) == set(FAULTS.values())

STRIP_ROWS = ["retransmission", *FAULT_LABELS.values(), "restart", "killed"]
STRIP_COLOURS = [
    "#f28e2b",
    "#b07aa1",
    "#e15759",
    "#9c755f",
    "#76b7b2",
    "#edc948",
    "#4e79a7",
    "#d62728",
]

Spec = dict[str, Any]


def _config(chart: alt.TopLevelMixin) -> Spec:
    spec: Spec = (
        chart.configure(font="system-ui, -apple-system, 'Segoe UI', sans-serif")
        .configure_view(stroke=None)
        .configure_axis(labelColor="#444", titleColor="#444", gridColor="#eee")
        .configure_legend(labelLimit=320, orient="bottom", columns=2)
        .to_dict()
    )
    return spec


def _series(
    rows: Sequence[dict[str, Any]], label: Callable[[dict[str, Any]], str]
) -> list[dict[str, Any]]:
    """Rows with their series label; the smallest series beyond :data:`MAX_SERIES` as one."""
    totals: dict[str, int] = {}
    for r in rows:
        totals[label(r)] = totals.get(label(r), 0) + int(r["messages"])
    kept = set(sorted(totals, key=lambda k: (-totals[k], k))[:MAX_SERIES])
    merged: dict[tuple[str, float], dict[str, Any]] = {}
    for r in rows:
        name = label(r) if label(r) in kept else "other"
        key = (name, float(r["low_ms"]))
        row = merged.setdefault(
            key,
            {"series": name, "low_ms": r["low_ms"], "high_ms": r["high_ms"], "messages": 0},
        )
        row["messages"] += int(r["messages"])
    return list(merged.values())


def latency_histogram(
    rows: Sequence[dict[str, Any]], label: Callable[[dict[str, Any]], str]
) -> Spec | None:
    """Messages per log latency bucket, one panel per ``label(row)`` (small multiples on a
    shared time axis, each panel's count axis its own)."""
    values = _series(rows, label)
    if not values:
        return None
    chart = (
        alt.Chart(alt.InlineData(values=values))
        .mark_bar(opacity=0.9, stroke="white", strokeWidth=0.5)
        .encode(
            x=alt.X("low_ms:Q", title="milliseconds (log scale)", scale=alt.Scale(type="log")),
            x2="high_ms:Q",
            y=alt.Y("messages:Q", title="messages"),
            y2=alt.Y2(datum=0),
            color=alt.Color("series:N", legend=None, scale=alt.Scale(scheme="tableau10")),
            tooltip=[
                alt.Tooltip("series:N", title="series"),
                alt.Tooltip("low_ms:Q", title="from ms"),
                alt.Tooltip("high_ms:Q", title="to ms"),
                alt.Tooltip("messages:Q", title="messages"),
            ],
        )
        .properties(width=PANEL_WIDTH, height=PANEL_HEIGHT)
        .facet(
            facet=alt.Facet(
                "series:N",
                title=None,
                header=alt.Header(labelFontSize=12, labelFontWeight="bold", labelLimit=PANEL_WIDTH),
            ),
            columns=2,
        )
        .resolve_scale(y="independent")
    )
    return _config(chart)


def _millis(ts: str) -> str:
    """A trace timestamp cut to milliseconds, which every browser's Date parses."""
    return ts[:23] + "Z" if len(ts) > 24 and ts[19] == "." else ts


def _marks(throughput: Sequence[dict[str, Any]], found: Sequence[Process]) -> list[dict[str, Any]]:
    marks: list[dict[str, Any]] = []
    for r in throughput:
        counts = {"retransmission": r.get("retransmissions") or 0}
        counts.update({FAULT_LABELS[c]: r.get(c) or 0 for c in FAULT_LABELS})
        for kind, count in counts.items():
            if count:
                marks.append(
                    {"t": r["bucket"], "kind": kind, "count": count, "where": r["instance"]}
                )
    for n, p in enumerate(found):
        if n > 0 and found[n - 1].instance == p.instance:
            marks.append(
                {
                    "t": _millis(p.first_ts),
                    "kind": "restart",
                    "count": 1,
                    "where": f"{p.instance} {p.pid}",
                }
            )
        if p.ended == "killed":
            marks.append(
                {
                    "t": _millis(p.last_ts),
                    "kind": "killed",
                    "count": 1,
                    "where": f"{p.instance} {p.pid}",
                }
            )
    return marks


def timeline(
    throughput: Sequence[dict[str, Any]], found: Sequence[Process], bucket_seconds: int
) -> Spec | None:
    """Delivered per second per instance, over a strip of retransmissions, faults, restarts
    and kills on the same time axis."""
    if not throughput:
        return None
    delivered = [
        {"t": r["bucket"], "instance": r["instance"], "per_s": r["delivered_per_s"]}
        for r in throughput
    ]
    marks = _marks(throughput, found)
    title = f"time (UTC, {bucket_seconds} s buckets)"
    lines = (
        alt.Chart(alt.InlineData(values=delivered))
        .mark_line(point=alt.OverlayMarkDef(size=18), interpolate="linear")
        .encode(
            x=alt.X("t:T", title=None, axis=alt.Axis(format="%H:%M:%S")),
            y=alt.Y("per_s:Q", title="messages delivered / s"),
            color=alt.Color(
                "instance:N", title="delivered by", scale=alt.Scale(scheme="tableau10")
            ),
            tooltip=[
                alt.Tooltip("t:T", title="time", format="%H:%M:%S"),
                alt.Tooltip("instance:N"),
                alt.Tooltip("per_s:Q", title="delivered / s"),
            ],
        )
        .properties(width=WIDTH, height=HEIGHT)
    )
    events = alt.InlineData(values=marks)
    kinds = alt.Scale(domain=STRIP_ROWS, range=STRIP_COLOURS)
    strip = (
        alt.Chart(events)
        .mark_circle(opacity=0.85)
        .encode(
            x=alt.X("t:T", title=title, axis=alt.Axis(format="%H:%M:%S")),
            y=alt.Y("kind:N", title=None, sort=STRIP_ROWS, scale=alt.Scale(domain=STRIP_ROWS)),
            size=alt.Size("count:Q", title="events", scale=alt.Scale(range=[30, 400]), legend=None),
            color=alt.Color("kind:N", scale=kinds, legend=None),
            tooltip=[
                alt.Tooltip("t:T", title="time", format="%H:%M:%S.%L"),
                alt.Tooltip("kind:N", title="what"),
                alt.Tooltip("count:Q", title="events"),
                alt.Tooltip("where:N", title="where"),
            ],
        )
        .properties(width=WIDTH, height=24 * len(STRIP_ROWS))
    )
    rules = (
        alt.Chart(events)
        .transform_filter(alt.FieldOneOfPredicate(field="kind", oneOf=["restart", "killed"]))
        .mark_rule(strokeDash=[4, 3], strokeWidth=1.5)
        .encode(x="t:T", color=alt.Color("kind:N", scale=kinds, legend=None))
    )
    top = alt.layer(lines, rules).resolve_scale(color="independent")
    chart = alt.vconcat(top, strip, spacing=6).resolve_scale(x="shared", color="independent")
    return _config(chart)
