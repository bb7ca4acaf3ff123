"""The figures of a run and the markdown summary of many runs.

A run's latencies are receive time minus send time of every message, p50 and p99 by
the nearest-rank method (as the peer's benchmark computes them). A summary takes, per
workload and broker, the median of each figure across the runs; with lines of the peer
broker, the ratios brokerd / peer of those medians.
"""

from __future__ import annotations

import json
import math
import statistics
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import Any

FIGURES = ("seconds", "msgs_per_s", "mb_per_s", "p50_ms", "p99_ms", "max_ms")
RATIOS = ("msgs_per_s", "mb_per_s", "p50_ms", "p99_ms")
"""Figures compared with the peer: brokerd's value divided by the peer's."""
BROKERD, PEER_FIELD = "brokerd", "broker"


def percentile(sorted_values: list[float] | list[int], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (NaN when empty)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


def rounded(value: float, digits: int) -> float | None:
    return None if value is None or math.isnan(value) else round(value, digits)


def throughput(
    consumed: dict[str, Any], t0_ns: int, size: int, end_ns: int | None = None
) -> dict[str, Any]:
    """seconds (``t0_ns`` to the last receive, or ``end_ns``), msgs/s, MB/s (10^6 bytes of
    bodies per second) and the latency percentiles of every message received."""
    sent, recv = array("q"), array("q")
    sent.frombytes(consumed["sent_ns"])
    recv.frombytes(consumed["recv_ns"])
    latencies = sorted(r - s for s, r in zip(sent, recv, strict=True) if r)
    count = consumed["count"]
    end = end_ns if end_ns is not None else consumed["last_ns"]
    seconds = (end - t0_ns) / 1e9 if count and t0_ns else math.nan
    ok_time = seconds > 0
    return {
        "seconds": rounded(seconds, 4),
        "msgs_per_s": round(count / seconds, 1) if ok_time else None,
        "mb_per_s": round(count * size / seconds / 1e6, 2) if ok_time else None,
        "p50_ms": rounded(percentile(latencies, 50) / 1e6, 3),
        "p99_ms": rounded(percentile(latencies, 99) / 1e6, 3),
        "max_ms": rounded(latencies[-1] / 1e6, 3) if latencies else None,
    }


def add_ratios(line: dict[str, Any], peer: dict[str, Any]) -> None:
    """Add ``ratio_<figure>`` = brokerd / peer for each of :data:`RATIOS` both have."""
    for name in RATIOS:
        mine, theirs = line.get(name), peer.get(name)
        if isinstance(mine, int | float) and isinstance(theirs, int | float) and theirs:
            line[f"ratio_{name}"] = round(mine / theirs, 3)


def medians(lines: list[dict[str, Any]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in FIGURES:
        values = [r[name] for r in lines if isinstance(r.get(name), int | float)]
        out[name] = round(statistics.median(values), 4) if values else None
    return out


def summary_line(
    workload: str, mine: list[dict[str, Any]], peer: list[dict[str, Any]]
) -> dict[str, Any]:
    """One line of medians per broker across the runs, and the ratios brokerd / peer."""
    line: dict[str, Any] = {"summary": True, "workload": workload, "runs": len(mine)}
    if mine:
        line["mode"] = mine[0].get("mode", "")
    ours = medians(mine)
    line[BROKERD] = ours
    if peer:
        theirs = medians(peer)
        line["peer"] = {"broker": peer[0].get(PEER_FIELD), **theirs}
        for name in RATIOS:
            a, b = ours.get(name), theirs.get(name)
            if a is not None and b:
                line[f"ratio_{name}"] = round(a / b, 3)
    line["ok"] = all(r.get("ok") for r in mine + peer)
    return line


def read_lines(paths: Iterable[Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        for text in path.read_text().splitlines():
            text = text.strip()
            if text.startswith("{"):
                rows.append(json.loads(text))
    return rows


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """Per sitting, workload, size, mode and broker: runs, medians, all-ok; then brokerd /
    peer within the sitting (a result file appended to over several sittings is not
    pooled: figures move by up to 2x from one day to the next)."""
    by_sitting: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_sitting.setdefault(str(r.get("sitting", "")), []).append(r)
    if len(by_sitting) > 1:
        return "\n\n".join(
            f"Sitting {name or '(not named)'}:\n\n{markdown(part)}"
            for name, part in sorted(by_sitting.items())
        )
    groups: dict[tuple[str, int, int, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("summary") or r.get("label") == "warmup" or "workload" not in r:
            continue
        broker = str(r.get(PEER_FIELD, BROKERD))
        key = (r["workload"], int(r["messages"]), int(r["size"]), str(r.get("mode", "")), broker)
        groups.setdefault(key, []).append(r)
    out = [
        "| workload | broker | mode | messages | size B | runs | seconds | msgs/s | MB/s "
        "| p50 ms | p99 ms | max ms | all ok |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    ratio_rows: list[str] = []
    for key in sorted(groups):
        workload, messages, size, mode, broker = key
        m = medians(groups[key])
        ok = all(r.get("ok") for r in groups[key])
        out.append(
            f"| {workload} | {broker} | {mode or '-'} | {messages} | {size} | {len(groups[key])} "
            f"| {_fmt(m['seconds'], 2)} | {_fmt(m['msgs_per_s'], 0)} | {_fmt(m['mb_per_s'], 1)} "
            f"| {_fmt(m['p50_ms'], 1)} | {_fmt(m['p99_ms'], 1)} | {_fmt(m['max_ms'], 1)} | {ok} |"
        )
        if broker == BROKERD:
            for (w, n, s, _mode, other), peer_rows in sorted(groups.items()):
                if (w, n, s) == (workload, messages, size) and other != BROKERD:
                    p = medians(peer_rows)
                    cells = []
                    for name in RATIOS:
                        a, b = m[name], p[name]
                        cells.append(f"{a / b:.2f}x" if a is not None and b else "-")
                    ratio_rows.append(
                        f"| {workload} | {mode or '-'} | {other} | " + " | ".join(cells) + " |"
                    )
    if ratio_rows:
        out += [
            "",
            "brokerd / peer (medians):",
            "",
            "| workload | brokerd mode | peer | msgs/s | MB/s | p50 | p99 |",
            "|---|---|---|---:|---:|---:|---:|",
            *ratio_rows,
        ]
    return "\n".join(out)
