"""The explicit Spark schema of delivery trace events, schema version 1 (docs/traces.md).

Spark never infers the schema of a trace set: inference reads everything twice and
would change the column types with the data. Every field of ``docs/traces.md`` is
here (the list is :data:`brokerd.traces.columnar.FIELDS`, which compaction writes); a
field an event does not carry is null. ``_corrupt`` collects lines that do
not parse (a torn last line after a crash), which the loader counts and skips.
"""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from brokerd.traces import columnar

SCHEMA_VERSION = 1
CORRUPT_COLUMN = columnar.CORRUPT_COLUMN
TIME_COLUMN = columnar.TIME_COLUMN
_TYPES = {
    "string": StringType(),
    "long": LongType(),
    "boolean": BooleanType(),
    "double": DoubleType(),
}

TRACE_SCHEMA = StructType(
    [StructField(name, _TYPES[kind]) for name, kind in columnar.FIELDS]
    + [StructField(CORRUPT_COLUMN, StringType())]
)
"""Every field of trace schema 1, plus the column that collects unparseable lines."""

COMPACTED_SCHEMA = StructType([*TRACE_SCHEMA.fields, StructField(TIME_COLUMN, LongType())])
"""A compacted (Parquet) segment's columns: the same, and the time parsed (microseconds)."""

TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSX"
"""How ``ts`` is written: UTC with microseconds, ``2026-11-21T09:09:57.668116Z``."""
