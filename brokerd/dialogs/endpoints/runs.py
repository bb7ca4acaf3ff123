"""Runs of alike consecutive items: how a batch of messages becomes one trace entry per
run of messages that share every field but their sequence number.

May import: the standard library only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence


def alike_runs(keys: Sequence[object]) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each run of equal consecutive ``keys``, in order."""
    start = 0
    while start < len(keys):
        end = start + 1
        while end < len(keys) and keys[end] == keys[start]:
            end += 1
        yield start, end
        start = end
