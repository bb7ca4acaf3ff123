"""The views as ``brokerctl`` prints them (R-PROTO-4): aligned text tables, one line a row.

A cell is the row's value in one line: UUIDs, timestamps and long text shortened unless
``wide``, and control characters (a line break or an escape sequence in a rollback's
reason, say) written as escapes, so that a row never spills onto a second line nor
drives the terminal. ``--json`` keeps the daemon's rows unchanged.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from brokerd.shown_text import one_line

__all__ = ["LAST_COLUMNS", "MAX_TEXT", "SHORT_HEADERS", "display_rows", "format_table"]

SHORT_LENGTH = 8
"""A shortened UUID keeps this many of its last characters: random in a version 4 UUID
and in a version 7 one (a conversation handle), whose first ones are its time."""
MAX_TEXT = 40
"""Other text longer than this is cut (with an ellipsis) unless ``wide``."""
LAST_COLUMNS = ("transmission_status",)
"""Columns moved to the end of the table and never cut."""
SHORT_HEADERS = {
    "conversation_handle": "handle",
    "conversation_id": "conversation",
    "conversation_group_id": "group",
    "is_conversation_error": "error",
    "is_end_of_dialog": "end",
    "far_broker_instance": "far_broker",
    "to_broker_instance": "to_broker",
    "message_sequence_number": "seq",
    "send_sequence": "send_seq",
    "receive_sequence": "recv_seq",
    "unacknowledged": "unacked",
    "remote_service_name": "remote_service",
    "corrupted_messages": "corrupted",
}
"""Column titles used unless ``wide`` (``--json`` and ``--wide`` keep the real names)."""

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(?:\.\d+)?(Z|[+-]\d\d:\d\d)?")


def _decimal(value: float) -> str:
    """Six significant digits, as ``g`` writes them, but never in exponent form from a
    million up (an age of two weeks is ``1209600``, not ``1.2096e+06``): a number that
    large keeps its whole part and up to three decimals."""
    text = f"{value:g}"
    if "e+" in text and math.isfinite(value):
        text = f"{value:.3f}".rstrip("0").rstrip(".")
    return text


def _cell(value: Any, wide: bool, cut: bool) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return _decimal(value)
    if isinstance(value, dict | list):
        text = json.dumps(value, separators=(",", ":"))
    else:
        text = one_line(str(value))
    if wide:
        return text
    if _UUID.fullmatch(text):
        return text[-SHORT_LENGTH:]
    stamp = _TIMESTAMP.fullmatch(text)
    if stamp:
        zone = stamp.group(3)
        zone = "Z" if zone in ("Z", "+00:00", "-00:00") else (zone or "")
        return f"{stamp.group(1)} {stamp.group(2)}{zone}"
    if cut and len(text) > MAX_TEXT:
        if text.startswith("/"):  # a file: the end says more than the beginning
            return "…" + text[-(MAX_TEXT - 1) :]
        return text[: MAX_TEXT - 1] + "…"
    return text


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def format_table(rows: Sequence[dict[str, Any]], wide: bool = False) -> str:
    """Rows of a view as an aligned text table with a header line; ``(no rows)`` if empty.

    Columns are the rows' keys in order of first appearance, except that
    :data:`LAST_COLUMNS` go last and are never cut. Unless ``wide``: UUIDs are
    shortened to their last 8 characters, ISO timestamps to whole seconds, other text to
    :data:`MAX_TEXT` characters, and a few long column names are abbreviated.
    Numbers are right-aligned; lines carry no trailing spaces; every row is one line
    (:func:`one_line`).
    """
    if not rows:
        return "(no rows)"
    columns: list[str] = []
    for row in rows:
        columns.extend(key for key in row if key not in columns)
    columns.sort(key=lambda c: c in LAST_COLUMNS)  # stable: only moves the last ones
    headers = [one_line(c if wide else SHORT_HEADERS.get(c, c)) for c in columns]
    cells = [[_cell(row.get(c), wide, cut=c not in LAST_COLUMNS) for c in columns] for row in rows]
    numeric = [
        all(_is_number(row[c]) for row in rows if row.get(c) is not None)
        and any(row.get(c) is not None for row in rows)
        for c in columns
    ]
    widths = [max(len(h), *(len(line[i]) for line in cells)) for i, h in enumerate(headers)]
    last = len(columns) - 1

    def render(values: Sequence[str], header: bool) -> str:
        parts = []
        for i, value in enumerate(values):
            if numeric[i] and not header:
                parts.append(value.rjust(widths[i]))
            elif i == last:
                parts.append(value)
            else:
                parts.append(value.ljust(widths[i]))
        return "  ".join(parts).rstrip()

    return "\n".join([render(headers, True), *(render(line, False) for line in cells)])


def display_rows(view: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as a table shows them: the one-row ``stats`` view is turned on its side."""
    if view == "stats" and len(rows) == 1:
        return [{"counter": key, "value": value} for key, value in rows[0].items()]
    return rows
