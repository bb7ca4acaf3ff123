"""What an analysis found, as plain data: :class:`Table` and :class:`Analysis`.

The jobs (:mod:`brokerd.analytics.report`) fill them; ``summary.json`` is their
:meth:`Analysis.view`, and the page (:mod:`brokerd.analytics.page`) is drawn from them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from brokerd.analytics import audit as audit_job
from brokerd.analytics.processes import Process
from brokerd.analytics.session import DEFAULT_MASTER
from brokerd.traces.writer import iso_micros


@dataclass
class Table:
    """One result table, collected: at most ``limit`` rows of ``total_rows``."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    total_rows: int

    def view(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "columns": self.columns,
            "rows": self.rows,
            "total_rows": self.total_rows,
        }

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


@dataclass
class Analysis:
    inputs: dict[str, Any]
    totals: dict[str, Any]
    audit: audit_job.Audit
    tables: dict[str, Table] = field(default_factory=dict)
    bucket_seconds: int = 1
    runtime_seconds: float = 0.0
    master: str = DEFAULT_MASTER
    processes: list[Process] = field(default_factory=list)
    """The daemon processes that wrote the traces (:mod:`brokerd.analytics.processes`)."""

    def view(self) -> dict[str, Any]:
        events = int(self.inputs["events"])
        return {
            "generated": iso_micros(time.time()),
            "master": self.master,
            "runtime_seconds": round(self.runtime_seconds, 3),
            "events_per_second": round(events / self.runtime_seconds, 1)
            if self.runtime_seconds
            else None,
            "inputs": self.inputs,
            "totals": self.totals,
            "audit": self.audit.view(),
            "bucket_seconds": self.bucket_seconds,
            "processes": [p.view() for p in self.processes],
            "tables": {name: t.view() for name, t in self.tables.items()},
        }
