"""A closed trace segment as one columnar file (Parquet, zstd), and its lines back.

Compaction (:class:`brokerd.traces.segments.SegmentKeeper`) turns each closed segment
of JSON Lines into a Parquet file with one column per field of trace schema 1
(:data:`FIELDS`), plus two columns of its own: ``t``, the event's time in microseconds
since the epoch (UTC) parsed once here rather than by every reader; ``_corrupt``, the
text of a line that did not parse (a torn tail, with its newline if it had one), kept so
that a reader counts it as the plain segment would have made it count; and ``_extra``,
a line's fields of another schema version, as JSON. Nothing of a line is lost. Spark
reads the columns it needs and no others (docs/traces.md "Compaction"; docs/analytics.md,
Performance).

:func:`write` runs in a process of its own (``python -m brokerd.traces.columnar SOURCE
TARGET``, started by the keeper's worker thread): Arrow's memory and its parser's CPU
stay out of the daemon. :func:`lines` gives a compacted segment's events back as JSON
Lines (``v`` and ``instance`` first, null fields left out), for ``read_events``,
``brokerctl trace`` and the analytics' process list.

May import: nothing of brokerd.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

STRING_FIELDS = (
    "instance",
    "ts",
    "event",
    "conversation_id",
    "database",
    "peer",
    "seqs",
    "service",
    "far_service",
    "contract",
    "message_type",
    "queue",
    "route",
    "step",
    "address",
    "decision",
    "target_database",
    "reason",
    "direction",
    "last_ts",
    "last_event",
)
LONG_FIELDS = (
    "v",
    "n",
    "seq",
    "fragment",
    "fragments",
    "size",
    "attempt",
    "through",
    "acked",
    "hop",
    "pid",
    "last_n",
    "sent_through",
    "received_through",
    "rollbacks",
    "dropped",
)
BOOLEAN_FIELDS = ("initiator", "encrypted", "clean")
DOUBLE_FIELDS = ("wait",)
FIELDS: tuple[tuple[str, str], ...] = (
    tuple((name, "string") for name in STRING_FIELDS)
    + tuple((name, "long") for name in LONG_FIELDS)
    + tuple((name, "boolean") for name in BOOLEAN_FIELDS)
    + tuple((name, "double") for name in DOUBLE_FIELDS)
)
"""Every field of trace schema 1 (docs/traces.md) and its type."""
_NAMES = tuple(name for name, _ in FIELDS)
TIME_COLUMN = "t"
CORRUPT_COLUMN = "_corrupt"
EXTRA_COLUMN = "_extra"
"""A line's fields that are not of :data:`FIELDS` (another schema version's), as JSON."""
FILE_MODE = 0o600
BLOCK_BYTES = 8 * 1024 * 1024
"""Arrow's JSON reader parses a segment in blocks of this size (a line must fit one)."""
_TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(?:Z|[+-]\d\d(?:\d\d)?)\Z")
"""``ts`` as the writer writes it; the analytics read no other form (schema.TIMESTAMP_FORMAT)."""
_FIRST = ("v", "instance")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def micros(ts: object) -> int | None:
    """``ts`` (``2026-11-21T09:09:57.668116Z``) in microseconds since the epoch; None when
    it is not a timestamp of that form."""
    if not isinstance(ts, str) or not _TS.match(ts):
        return None
    try:
        when = datetime.fromisoformat(ts)
    except ValueError:
        return None
    return (when - _EPOCH) // _MICROSECOND


NICENESS = 10
"""How much lower than its daemon a compaction runs: a background job that may wait,
where the daemon's delivery should not (on a busy machine the two share the cores)."""

_UTC_TS = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$"
"""``ts`` as the writer writes it, in UTC (an RE2 pattern, for Arrow)."""


def _times(ts: Any) -> Any:
    """:func:`micros` of every ``ts`` of a column, as an Arrow array. A column of the
    writer's UTC form (every line a daemon writes) is converted by Arrow at once, about
    five times cheaper than a line at a time; any other, or a time Arrow refuses (a
    month 13), falls back to :func:`micros` for each."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = ts.combine_chunks() if isinstance(ts, pa.ChunkedArray) else ts
    ours = pc.match_substring_regex(column, _UTC_TS)
    if pc.all(pc.fill_null(ours, True)).as_py():  # a null ts makes a null t either way
        try:
            return pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    return pa.array([micros(value) for value in column.to_pylist()], type=pa.int64())


def _arrow_types() -> dict[str, Any]:
    import pyarrow as pa

    return {
        "string": pa.string(),
        "long": pa.int64(),
        "boolean": pa.bool_(),
        "double": pa.float64(),
    }


def _fits(kind: str, value: object) -> bool:
    if value is None:
        return True
    if kind == "string":
        return isinstance(value, str)
    if kind == "long":
        return type(value) is int and -(2**63) <= value < 2**63
    if kind == "boolean":
        return type(value) is bool
    return type(value) in (int, float)


def _table_line_by_line(data: bytes) -> Any:
    """The segment parsed a line at a time: a line that is not a JSON object, or has a
    field of the wrong type, is one row with only ``_corrupt`` (as Spark's permissive
    JSON reader makes it)."""
    import pyarrow as pa

    types = _arrow_types()
    columns: dict[str, list[Any]] = {name: [] for name, _ in FIELDS}
    corrupt: list[str | None] = []
    extra: list[str | None] = []
    pieces = data.split(b"\n")
    for i, piece in enumerate(pieces):
        if not piece.strip():
            continue
        raw = piece if i == len(pieces) - 1 else piece + b"\n"  # a torn tail has no newline
        try:
            event = orjson.loads(piece)
        except orjson.JSONDecodeError:
            event = None
        good = isinstance(event, dict) and all(
            _fits(kind, event.get(name)) for name, kind in FIELDS
        )
        for name, _ in FIELDS:
            columns[name].append(event.get(name) if good else None)
        corrupt.append(None if good else raw.decode("utf-8", "replace"))
        others = {k: v for k, v in event.items() if k not in _NAMES} if good else None
        extra.append(orjson.dumps(others).decode() if others else None)
    arrays = [pa.array(columns[name], type=types[kind]) for name, kind in FIELDS]
    return pa.Table.from_arrays(
        [*arrays, pa.array(corrupt, type=pa.string()), pa.array(extra, type=pa.string())],
        names=[*_NAMES, CORRUPT_COLUMN, EXTRA_COLUMN],
    )


def _table(data: bytes) -> Any:
    import pyarrow as pa
    import pyarrow.json as pajson

    types = _arrow_types()
    schema = pa.schema([(name, types[kind]) for name, kind in FIELDS])
    try:
        table = pajson.read_json(
            pa.BufferReader(data),
            read_options=pajson.ReadOptions(use_threads=False, block_size=BLOCK_BYTES),
            parse_options=pajson.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="error"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        # a torn line, a field of another type or a field of another schema version
        return _table_line_by_line(data)
    table = table.select(list(_NAMES))
    table = table.append_column(CORRUPT_COLUMN, pa.nulls(table.num_rows, pa.string()))
    return table.append_column(EXTRA_COLUMN, pa.nulls(table.num_rows, pa.string()))


def write(source: Path, target: Path) -> int:
    """``source`` (JSON Lines) as a Parquet file at ``target``, created 0600 and fsynced.
    Returns the rows written."""
    import pyarrow.parquet as pq

    table = _table(source.read_bytes())
    table = table.append_column(TIME_COLUMN, _times(table.column("ts")))
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "wb") as out:
        # page checksums: a damaged page is found when it is read (check), not used
        pq.write_table(table, out, compression="zstd", write_page_checksum=True)
        out.flush()
        os.fsync(out.fileno())
    return int(table.num_rows)


def _line_rows(table: Any) -> Iterator[bytes]:
    """The rows of a table read from a compacted segment as JSON Lines."""
    held = set(table.column_names)  # an earlier version's file lacks the fields added since
    order = [n for n in (*_FIRST, *(n for n in _NAMES if n not in _FIRST)) if n in held]
    for row in table.to_pylist():
        torn = row.get(CORRUPT_COLUMN)
        if torn is not None:  # as it was written: a torn tail without its newline
            yield torn.encode()
            continue
        event = {name: row[name] for name in order if row[name] is not None}
        extra = row.get(EXTRA_COLUMN)
        if extra is not None:
            event.update(orjson.loads(extra))
        yield orjson.dumps(event) + b"\n"


def _columns(parquet: Any) -> list[str]:
    """The columns of a compacted segment to read: those its version wrote (the fields
    added since are missing)."""
    held = set(parquet.schema_arrow.names)
    return [n for n in (*_NAMES, CORRUPT_COLUMN, EXTRA_COLUMN) if n in held]


def lines(path: Path) -> Iterator[bytes]:
    """The events of a compacted segment as JSON Lines, in the order they were written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path, page_checksum_verification=True)
    for batch in parquet.iter_batches(columns=_columns(parquet)):
        yield from _line_rows(pa.Table.from_batches([batch]))


def edge_lines(path: Path, count: int, *, last: bool = False) -> list[bytes]:
    """The first (or ``last``) ``count`` events of a compacted segment as JSON Lines,
    without turning the others into lines (a row group is read, its edge converted)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path, page_checksum_verification=True)
    columns = _columns(parquet)
    groups = range(parquet.num_row_groups)
    tables: list[Any] = []
    held = 0
    for group in reversed(groups) if last else groups:
        table = parquet.read_row_group(group, columns=columns)
        if last:
            tables.insert(0, table)
        else:
            tables.append(table)
        held += table.num_rows
        if held >= count:
            break
    if not tables:
        return []
    table = pa.concat_tables(tables)
    edge = table.slice(max(0, table.num_rows - count)) if last else table.slice(0, count)
    return list(_line_rows(edge))


def highest(path: Path, column: str) -> Any:
    """The highest value of ``column`` in a compacted segment, from the statistics its
    footer keeps of each row group: no page is read, so a page damaged on disk does not
    hide it. None when the footer tells none (no such column, or nulls only); ``OSError``
    or ``ValueError`` when the footer does not read."""
    import pyarrow.parquet as pq

    meta = pq.read_metadata(path)
    names = meta.schema.names
    if column not in names:
        return None
    index = names.index(column)
    values = []
    for group in range(meta.num_row_groups):
        stats = meta.row_group(group).column(index).statistics
        if stats is not None and stats.has_min_max:
            values.append(stats.max)
    return max(values, default=None)


def check(path: Path) -> str | None:
    """Why a compacted segment cannot be read (its footer, a page's checksum or its
    compression damaged), or None when every row of it reads."""
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path, page_checksum_verification=True)
        for group in range(parquet.num_row_groups):
            parquet.read_row_group(group)
    except (OSError, ValueError) as exc:  # Arrow's errors are OSErrors or ValueErrors
        return " ".join(str(exc).split()) or type(exc).__name__
    return None


def rows(path: Path) -> int:
    """The events (rows) of a compacted segment, from its footer."""
    import pyarrow.parquet as pq

    return int(pq.read_metadata(path).num_rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m brokerd.traces.columnar SOURCE TARGET``: the keeper's compaction."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m brokerd.traces.columnar SOURCE.jsonl TARGET", file=sys.stderr)
        return 2
    with contextlib.suppress(OSError):  # housekeeping gives way to delivery
        os.nice(NICENESS)
    write(Path(args[0]), Path(args[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
