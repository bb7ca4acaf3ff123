"""Text from outside shown to a person on a terminal: control characters as escapes.

A peer's close reason, a service name or a drop reason can carry any character; written
raw, an escape sequence drives the operator's terminal. ``brokerctl`` and ``brokerd
analyze`` print such text through :func:`one_line`.

May import: the standard library only.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or f"\\x{ord(char):02x}"


def one_line(text: str) -> str:
    """``text`` with its control characters as escapes (``\\n``, ``\\x1b`` ...)."""
    return _CONTROL.sub(_escape, text)
