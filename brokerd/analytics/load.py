"""Reading the trace segments of many daemons into one events table.

Owns :func:`load_traces`: the segments (compacted ``*.parquet``, ``*.jsonl`` and
still-open ``*.jsonl.open`` files, found recursively under each path given) are read
with the explicit schema of :mod:`brokerd.analytics.schema`, JSON Lines in permissive
mode. Lines that do not parse (a torn tail after a crash), events of another schema
version and events whose timestamp does not parse are counted and left out, never
fatal. Each event has ``t``, its time in microseconds since the epoch (UTC), which every
job uses: parsed here from a line's ``ts``, or read from a compacted segment, where the
compaction parsed it once.

JSON Lines are parsed once, into Spark's cache (:func:`brokerd.analytics.session.keep`),
and so is a small set; a large set of compacted segments alone is not cached: each job
reads the columns it needs from the files, which costs about what reading the cache
does, and building the cache would cost more than any job (docs/analytics.md,
Performance). :meth:`Traces.release` drops the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from brokerd.analytics.schema import (
    COMPACTED_SCHEMA,
    CORRUPT_COLUMN,
    SCHEMA_VERSION,
    TIME_COLUMN,
    TIMESTAMP_FORMAT,
    TRACE_SCHEMA,
)
from brokerd.analytics.session import Kept, is_small, keep
from brokerd.errors import AnalyticsError
from brokerd.traces import columnar
from brokerd.traces.names import NOT_REGULAR
from brokerd.traces.segments import is_columnar, is_compressed, unreadable
from brokerd.traces.writer import iso_micros, segment_files

UNREAD_FIELDS = ("ts", "contract", "encrypted", "pid", "rollbacks")
"""Fields no job reads: left out of the events table (``ts``, unique to each event, is
most of a cached set's size; every job reads the time as ``t``)."""

PLAIN_BYTES_PER_EVENT = 250
"""About the size of an event as a line of JSON (docs/traces.md, bytes per message)."""


@dataclass
class Traces:
    """The events of a trace set, and what reading it found."""

    events: DataFrame
    """Every usable event: the schema's columns plus ``t`` (microseconds, UTC)."""
    cached: Kept | None
    """The parsed lines, held in memory (and on disk beyond it) until :meth:`release`;
    None when the jobs read compacted segments directly."""
    files: int
    bytes: int
    events_total: int
    lines_skipped: int
    """Lines that did not parse, had no event name or no parseable timestamp."""
    other_versions: int
    """Events of a schema version this analysis does not know, or of none (left out)."""
    instances: list[str]
    first_t: int
    last_t: int
    """The latest event of the whole set: "now" for what is still waiting."""
    damaged: dict[str, str] = field(default_factory=dict)
    """Compressed segments left out because they do not read, and why (file -> error)."""

    def release(self) -> None:
        """Drop the cached lines."""
        if self.cached is not None:
            self.cached.release()

    def view(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "events": self.events_total,
            "lines_skipped": self.lines_skipped,
            "other_schema_versions": self.other_versions,
            "instances": self.instances,
            "first_event": _iso(self.first_t),
            "last_event": _iso(self.last_t),
            "span_seconds": round((self.last_t - self.first_t) / 1e6, 6),
            "damaged_segments": [
                {"file": name, "error": error} for name, error in sorted(self.damaged.items())
            ],
        }


def _iso(micros: int) -> str:
    return iso_micros(micros / 1e6) if micros else ""


def trace_files(paths: list[Path]) -> list[Path]:
    """The segment files under ``paths`` (directories, searched recursively, or files); a
    file that is not a regular one (a FIFO) is never opened: named, it is refused, and
    found in a directory, noted and left out (:func:`segment_files`)."""
    found: list[Path] = []
    for path in paths:
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += segment_files([path])
        elif path.exists():
            raise AnalyticsError(f"{path}: {NOT_REGULAR}")
        else:
            raise AnalyticsError(f"{path}: no such trace directory or file")
    if not found:
        shown = ", ".join(str(p) for p in paths)
        raise AnalyticsError(f"no trace segments (*.jsonl) under {shown}")
    return sorted(set(found))


def plain_bytes(files: list[Path]) -> int:
    """The size of ``files`` as JSON Lines: a compacted segment counts its events at
    :data:`PLAIN_BYTES_PER_EVENT` (what a set costs to analyse follows its events, not
    its compression; one whose footer does not read counts nothing)."""
    return sum(
        _compacted_rows(f) * PLAIN_BYTES_PER_EVENT if is_columnar(f) else f.stat().st_size
        for f in files
    )


def _compacted_rows(path: Path) -> int:
    try:
        return columnar.rows(path)
    except (OSError, ValueError):  # Arrow's errors: damaged_segments says which
        return 0


def damaged_segments(files: list[Path]) -> dict[Path, str]:
    """The compressed segments among ``files`` that do not read (:func:`unreadable`: a
    disk error, a copy cut short), and why. Each is read through (about 1 s for five
    million compacted events, while Spark starts); Spark would fail the whole analysis
    on the first, without naming it."""
    found = {path: unreadable(path) for path in files if is_compressed(path)}
    return {path: error for path, error in found.items() if error is not None}


def load_traces(
    spark: SparkSession,
    paths: list[Path],
    *,
    cache: bool | None = None,
    damaged: Mapping[Path, str] | None = None,
) -> Traces:
    """Read every segment under ``paths`` into one events table, cached (``cache``; None:
    unless the set is large and compacted alone); ``damaged``, the compressed segments
    known not to read (:func:`damaged_segments`, found here when None), are left out."""
    files = trace_files(paths)
    if damaged is None:
        damaged = damaged_segments(files)
    files = [f for f in files if f not in damaged]
    if not files:
        shown = ", ".join(str(p) for p in paths)
        raise AnalyticsError(f"no readable trace segments under {shown}")
    lines = [str(f) for f in files if not is_columnar(f)]
    columns = [str(f) for f in files if is_columnar(f)]
    frames: list[DataFrame] = []
    if lines:
        frames.append(
            spark.read.schema(TRACE_SCHEMA)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
            .json(lines)
            # try_: a timestamp that does not parse makes a null (a skipped line), not an error
            .withColumn(
                TIME_COLUMN,
                F.unix_micros(F.try_to_timestamp(F.col("ts"), F.lit(TIMESTAMP_FORMAT))),
            )
        )
    if columns:
        frames.append(spark.read.schema(COMPACTED_SCHEMA).parquet(*columns))
    raw = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
    raw = raw.drop(*UNREAD_FIELDS)
    if cache is None:
        cache = bool(lines) or is_small(plain_bytes(files))
    usable = F.col(CORRUPT_COLUMN).isNull() & F.col("event").isNotNull() & F.col("t").isNotNull()
    ours = F.col("v").eqNullSafe(SCHEMA_VERSION)
    known = usable & ours
    # The files are parsed once, into the cache; the counts and every job read the cache.
    cached = keep(raw) if cache else None
    table = cached.df if cached is not None else raw
    # per instance (a handful of rows): numbers only in the aggregate, which Spark then
    # compiles; a set of the instances in it would make every row go through an object
    per_instance = (
        table.groupBy("instance")
        .agg(
            F.count(F.when(~usable, 1)).alias("skipped"),
            F.count(F.when(usable & ~ours, 1)).alias("other"),
            F.count(F.when(known, 1)).alias("n"),
            F.min(F.when(known, F.col("t"))).alias("first"),
            F.max(F.when(known, F.col("t"))).alias("last"),
        )
        .collect()
    )
    firsts = [r["first"] for r in per_instance if r["first"] is not None]
    lasts = [r["last"] for r in per_instance if r["last"] is not None]
    events = table.where(known).drop(CORRUPT_COLUMN, "v")
    return Traces(
        events=events,
        files=len(files),
        bytes=sum(f.stat().st_size for f in files),
        events_total=sum(int(r["n"]) for r in per_instance),
        lines_skipped=sum(int(r["skipped"]) for r in per_instance),
        other_versions=sum(int(r["other"]) for r in per_instance),
        instances=sorted(r["instance"] for r in per_instance if r["n"] and r["instance"]),
        first_t=int(min(firsts, default=0)),
        last_t=int(max(lasts, default=0)),
        cached=cached,
        damaged={str(path): error for path, error in damaged.items()},
    )
