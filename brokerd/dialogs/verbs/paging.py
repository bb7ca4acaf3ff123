"""Paged views (SPEC R-PROTO-4, Decision): a page of a view's rows after a cursor.

Every view sorts its rows by a key of its own that names one row (a conversation
handle, a handle and a sequence number, a database and a queue's name ...). A request
names the key of the last row it has (``after``, empty for the first page) and how many
rows it wants (``limit``, at most :data:`MAX_PAGE`); the reply holds the next rows in
key order and, when more follow, the key of its last row (``next``), which the next
request passes as ``after``. A cursor is a key, not an offset: rows added or removed
meanwhile move no other row, so a reader that pages through a view sees every row that
stayed there all along exactly once, in order.

Pure: no I/O.

May import: ``protocol`` (its errors).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from protocol.errors import InvalidRequest

MAX_PAGE = 1000
"""Rows of one page at most."""
DEFAULT_PAGE = 500
"""Rows of a page when the request names no ``limit``."""
MAX_CURSOR = 1024
"""Characters of a cursor at most (a longer ``after`` is refused)."""
_INT_BIAS = 1 << 63

T = TypeVar("T")


@dataclass(frozen=True)
class PageRequest:
    """Which page: the rows whose key is above ``after``, at most ``limit`` of them."""

    after: str = ""
    limit: int = DEFAULT_PAGE


def key_part(value: Any) -> str:
    """One field of a key, as text that sorts as the value does (integers padded)."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return f"{value + _INT_BIAS:020d}"
    return str(value)


def row_key(row: Mapping[str, Any], fields: Sequence[str]) -> str:
    """A row's key: its ``fields``, in order, joined by a unit separator."""
    return "\x1f".join(key_part(row[f]) for f in fields)


def smallest_after(items: Iterable[T], key: Callable[[T], str], request: PageRequest) -> list[T]:
    """The ``limit + 1`` items with the smallest keys above ``after``, in key order (one
    more than a page, so that the caller knows whether more follow)."""
    after = request.after
    return heapq.nsmallest(request.limit + 1, (i for i in items if key(i) > after), key=key)


def parse_cursor(after: str, fields: int) -> list[str]:
    """A cursor's fields; InvalidRequest if it is not a key of ``fields`` fields (the
    caller's view did not make it)."""
    parts = after.split("\x1f")
    if len(parts) != fields:
        raise InvalidRequest("after is not a cursor of this view (pass the reply's next)")
    return parts


def int_part(text: str) -> int:
    """An integer field of a cursor (:func:`key_part`'s padding undone)."""
    if not (text.isdigit() and len(text) == 20):
        raise InvalidRequest("after is not a cursor of this view (pass the reply's next)")
    return int(text) - _INT_BIAS
