"""A small, deterministic YAML writer for the files the tools generate (``docker-compose.yml``
and its overrides): mappings, lists, strings, integers and booleans only.

Strings are written as JSON strings (double-quoted YAML scalars), so no value is ever read
back as another type (``"no"``, ``"8022"``, ``"5s"`` stay strings). Short lists of scalars
are written inline (``[a, b]``), everything else in block style, keys in the order given.

May import the standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

Value = str | int | bool | Sequence["Value"] | Mapping[str, "Value"]

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_INLINE_WIDTH = 80


def dump(document: Mapping[str, Value], header: str = "") -> str:
    """``document`` as YAML text, after ``header`` (comment lines, each ``# ``-prefixed)."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += _mapping(document, 0)
    return "\n".join(lines) + "\n"


def _scalar(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"not a YAML scalar: {value!r}")


def _key(key: str) -> str:
    return key if _PLAIN_KEY.fullmatch(key) else json.dumps(key)


def _is_scalar(value: Value) -> bool:
    return isinstance(value, str | int | bool)


def _inline(value: Value) -> str | None:
    """``value`` on one line, if it is a scalar, an empty collection or a short list of
    scalars; None otherwise."""
    if isinstance(value, str | int):
        return _scalar(value)
    if isinstance(value, Mapping):
        return "{}" if not value else None
    if not value:
        return "[]"
    if all(_is_scalar(item) for item in value):
        text = "[" + ", ".join(_scalar(item) for item in value) + "]"
        return text if len(text) <= _INLINE_WIDTH else None
    return None


def _mapping(mapping: Mapping[str, Value], indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for key, value in mapping.items():
        inline = _inline(value)
        if inline is not None:
            lines.append(f"{pad}{_key(key)}: {inline}")
        elif isinstance(value, Mapping):
            lines.append(f"{pad}{_key(key)}:")
            lines += _mapping(value, indent + 2)
        elif not isinstance(value, str | int):
            lines.append(f"{pad}{_key(key)}:")
            lines += _sequence(value, indent + 2)
    return lines


def _sequence(items: Sequence[Value], indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for item in items:
        inline = _inline(item)
        if inline is not None:
            lines.append(f"{pad}- {inline}")
        elif isinstance(item, Mapping):
            inner = _mapping(item, indent + 2)
            lines.append(f"{pad}- {inner[0].lstrip()}")
            lines += inner[1:]
        elif not isinstance(item, str | int):
            inner = _sequence(item, indent + 2)
            lines.append(f"{pad}- {inner[0].lstrip()}")
            lines += inner[1:]
    return lines
