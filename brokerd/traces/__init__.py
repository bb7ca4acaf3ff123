"""Delivery traces: the append-only JSON Lines segments every daemon writes, compacted
into Parquet once closed (docs/traces.md), and the functions that read them back.

May import: ``brokerd.config``. Nothing else of the daemon.
"""
