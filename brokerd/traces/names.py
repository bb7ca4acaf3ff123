"""A trace segment's file names through its life: written as ``.jsonl.open``, closed as
``.jsonl``, compacted as ``.parquet`` (or, by an earlier version, ``.jsonl.gz``), each a
rename of the one before (docs/traces.md). A reader lists segments by name while their
daemon renames them: :func:`later_names` says where a segment listed under one name may
have gone, and :func:`latest_names` keeps each segment of a listing once. A name alone
does not make a segment: :func:`regular_files` leaves out what is not a regular file (a
FIFO named like a segment, whose reading would wait for a writer that never comes), and
:func:`open_regular` opens a plain segment without waiting on one.

May import: nothing of brokerd (``brokerctl trace`` reads segments with it).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

OPEN_SUFFIX = ".jsonl.open"
CLOSED_SUFFIX = ".jsonl"
COMPACT_SUFFIX = ".parquet"
GZIP_SUFFIX = ".jsonl.gz"
"""Compacted by an earlier version: read, never written."""
COMPACT_SUFFIXES = (COMPACT_SUFFIX, GZIP_SUFFIX)
LIFE_ORDER = (OPEN_SUFFIX, CLOSED_SUFFIX, *COMPACT_SUFFIXES)
"""The suffixes in the order a segment takes them: a listing made in this order finds a
segment renamed between two of its looks under one name at least."""
NOT_REGULAR = "not a regular file (a FIFO, a socket or a device named like a segment)"
"""Why a reader skips a file named like a segment that is not one."""


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


def is_regular(path: Path) -> bool:
    """Whether ``path`` is a regular file (a symbolic link followed), or is gone: a segment
    renamed or deleted since it was listed is its readers' to follow. Only a regular file
    is opened to be read; anything else named like a segment is skipped unopened."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except FileNotFoundError:
        return True


def regular_files(paths: Iterable[Path], skipped: Callable[[Path, str], None]) -> list[Path]:
    """``paths`` less what is not a regular file (:func:`is_regular`), each of those passed
    to ``skipped`` with why: the readers' note."""
    kept = []
    for path in paths:
        if is_regular(path):
            kept.append(path)
        else:
            skipped(path, NOT_REGULAR)
    return kept


def require_regular(path: Path) -> None:
    """Raise ``OSError`` (:data:`NOT_REGULAR`) unless ``path`` is a regular file: called
    before a file is handed to a reader that opens it by name (gzip, Arrow)."""
    if not is_regular(path):
        raise OSError(f"{path}: {NOT_REGULAR}")


def open_regular(path: Path) -> BinaryIO:
    """A plain segment opened for reading, never waiting (opened non-blocking, then its
    kind checked on the descriptor: a FIFO put in its place since it was listed raises
    ``OSError``, :data:`NOT_REGULAR`)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: {NOT_REGULAR}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
