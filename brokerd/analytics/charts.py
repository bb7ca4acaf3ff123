"""Inline SVG charts for the HTML report: no JavaScript, no files beside the page.

:func:`bar_chart` draws one bar per label (the latency histogram, retransmissions
per connection); :func:`line_chart` draws one line per series over time
(throughput per instance). Both return an ``<svg>`` element as a string, with a
``<title>`` per bar or point so a browser shows the exact figure on hover.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape

WIDTH = 760
HEIGHT = 320
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 104
LABEL_CHARS = 30
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10 ** len(str(int(value))) / 10
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= value:
            return float(step * magnitude)
    return value


def _fmt(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _short(label: str) -> str:
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…"


def _frame(title: str, y_label: str, y_max: float) -> list[str]:
    plot_h = HEIGHT - TOP - BOTTOM
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="14" '
        f'font-weight="bold">{escape(title)}</text>',
        f'<text x="14" y="{TOP + plot_h / 2}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 14 {TOP + plot_h / 2})">{escape(y_label)}</text>',
    ]
    for i in range(5):
        value = y_max * i / 4
        y = TOP + plot_h - plot_h * i / 4
        out.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{LEFT - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">'
            f"{_fmt(value)}</text>"
        )
    return out


def bar_chart(
    title: str, labels: Sequence[str], values: Sequence[float], y_label: str, x_label: str = ""
) -> str:
    """One bar per label; labels are written under the bars (rotated when many)."""
    if not values:
        return empty_chart(title)
    y_max = _nice_max(max(values))
    out = _frame(title, y_label, y_max)
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    slot = plot_w / len(values)
    every = max(1, len(values) // 24)
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        h = plot_h * value / y_max
        x = LEFT + i * slot
        out.append(
            f'<rect x="{x + slot * 0.1:.1f}" y="{TOP + plot_h - h:.1f}" '
            f'width="{max(slot * 0.8, 1):.1f}" height="{h:.1f}" fill="{PALETTE[0]}">'
            f"<title>{escape(label)}: {_fmt(value)}</title></rect>"
        )
        if i % every == 0:
            lx, ly = x + slot / 2, TOP + plot_h + 12
            out.append(
                f'<text x="{lx:.1f}" y="{ly:.1f}" font-size="9" text-anchor="end" '
                f'transform="rotate(-55 {lx:.1f} {ly:.1f})">{escape(_short(label))}</text>'
            )
    if x_label:
        out.append(
            f'<text x="{WIDTH / 2}" y="{HEIGHT - 4}" font-size="11" text-anchor="middle">'
            f"{escape(x_label)}</text>"
        )
    out.append("</svg>")
    return "\n".join(out)


def line_chart(
    title: str, xs: Sequence[float], series: Mapping[str, Sequence[float]], y_label: str
) -> str:
    """One line per series over ``xs`` (seconds since the epoch, shown as UTC times)."""
    if not xs or not series:
        return empty_chart(title)
    y_max = _nice_max(max((max(v) for v in series.values() if v), default=0.0))
    out = _frame(title, y_label, y_max)
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    x0, x1 = min(xs), max(xs)
    span = (x1 - x0) or 1.0

    def px(x: float) -> float:
        return LEFT + plot_w * (x - x0) / span

    for i in range(5):
        x = x0 + span * i / 4
        label = datetime.fromtimestamp(x, UTC).strftime("%H:%M:%S")
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        out.append(
            f'<text x="{px(x):.1f}" y="{TOP + plot_h + 14}" font-size="10" '
            f'text-anchor="{anchor}">{label}</text>'
        )
    for n, (name, values) in enumerate(series.items()):
        color = PALETTE[n % len(PALETTE)]
        points = " ".join(
            f"{px(x):.1f},{TOP + plot_h - plot_h * v / y_max:.1f}"
            for x, v in zip(xs, values, strict=True)
        )
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{points}"/>')
        for x, v in zip(xs, values, strict=True):
            out.append(
                f'<circle cx="{px(x):.1f}" cy="{TOP + plot_h - plot_h * v / y_max:.1f}" r="2" '
                f'fill="{color}"><title>{escape(name)} '
                f"{datetime.fromtimestamp(x, UTC):%H:%M:%S}: {_fmt(v)}</title></circle>"
            )
        lx = LEFT + 8 + (n % 4) * 170
        ly = HEIGHT - 22 + (n // 4) * 12
        out.append(
            f'<rect x="{lx}" y="{ly - 8}" width="10" height="10" fill="{color}"/>'
            f'<text x="{lx + 14}" y="{ly + 1}" font-size="10">{escape(name)}</text>'
        )
    out.append(
        f'<text x="{WIDTH - RIGHT}" y="{TOP - 6}" font-size="10" text-anchor="end">UTC</text>'
    )
    out.append("</svg>")
    return "\n".join(out)


def empty_chart(title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="60">'
        f'<text x="8" y="20" font-size="14" font-weight="bold">{escape(title)}</text>'
        f'<text x="8" y="44" font-size="12">no data in this trace set</text></svg>'
    )
