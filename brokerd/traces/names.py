"""A trace segment's file names through its life: written as ``.jsonl.open``, closed as
``.jsonl``, compacted as ``.parquet`` (or, by an earlier version, ``.jsonl.gz``), each a
rename of the one before (docs/traces.md). A reader lists segments by name while their
daemon renames them: :func:`later_names` says where a segment listed under one name may
have gone, and :func:`latest_names` keeps each segment of a listing once.

May import: nothing of brokerd (``brokerctl trace`` reads segments with it).
"""

from __future__ import annotations

from pathlib import Path

OPEN_SUFFIX = ".jsonl.open"
CLOSED_SUFFIX = ".jsonl"
COMPACT_SUFFIX = ".parquet"
GZIP_SUFFIX = ".jsonl.gz"
"""Compacted by an earlier version: read, never written."""
COMPACT_SUFFIXES = (COMPACT_SUFFIX, GZIP_SUFFIX)
LIFE_ORDER = (OPEN_SUFFIX, CLOSED_SUFFIX, *COMPACT_SUFFIXES)
"""The suffixes in the order a segment takes them: a listing made in this order finds a
segment renamed between two of its looks under one name at least."""


def stem(path: Path) -> str:
    """A segment's name without its suffix (the same through its life)."""
    for suffix in (*COMPACT_SUFFIXES, OPEN_SUFFIX, CLOSED_SUFFIX):
        if path.name.endswith(suffix):
            return path.name.removesuffix(suffix)
    return path.name


def later_names(path: Path) -> list[Path]:
    """The names the segment at ``path`` takes after it: an open one is closed, then
    compacted; a closed one is compacted."""
    name, base = path.name, stem(path)
    if name.endswith(OPEN_SUFFIX):
        suffixes: tuple[str, ...] = (CLOSED_SUFFIX, *COMPACT_SUFFIXES)
    elif name.endswith(CLOSED_SUFFIX):
        suffixes = COMPACT_SUFFIXES
    else:
        suffixes = ()
    return [path.with_name(base + suffix) for suffix in suffixes]


def latest_names(paths: list[Path]) -> list[Path]:
    """``paths`` (a listing of segments) less each name a segment had before another name
    listed too: an open segment closed while the listing was made, a closed one whose
    compaction is done but for deleting it. Each segment is kept once, under its latest
    name."""
    listed = set(paths)
    return [p for p in paths if not any(later in listed for later in later_names(p))]
