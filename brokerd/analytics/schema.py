"""The explicit Spark schema of delivery trace events, schema version 1 (docs/traces.md).

Spark never infers the schema of a trace set: inference reads everything twice and
would change the column types with the data. Every field of ``docs/traces.md`` is
here; a field an event does not carry is null. ``_corrupt`` collects lines that do
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

SCHEMA_VERSION = 1
CORRUPT_COLUMN = "_corrupt"

_STRINGS = (
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
_LONGS = (
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
)
_BOOLEANS = ("initiator", "encrypted", "clean")
_DOUBLES = ("wait",)

TRACE_SCHEMA = StructType(
    [StructField(name, StringType()) for name in _STRINGS]
    + [StructField(name, LongType()) for name in _LONGS]
    + [StructField(name, BooleanType()) for name in _BOOLEANS]
    + [StructField(name, DoubleType()) for name in _DOUBLES]
    + [StructField(CORRUPT_COLUMN, StringType())]
)
"""Every field of trace schema 1, plus the column that collects unparseable lines."""

TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSX"
"""How ``ts`` is written: UTC with microseconds, ``2026-11-21T09:09:57.668116Z``."""
