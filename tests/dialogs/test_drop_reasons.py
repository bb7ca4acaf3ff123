"""The ``drops`` view keeps the latest reasons a message was dropped, so a daemon that has
run for months shows what it drops now, not what it dropped in its first minutes
(R-ROUTE-6, R-ROUTE-7, R-ROUTE-13: drops are counted, traced, shown and logged)."""

from __future__ import annotations

from pathlib import Path

from brokerd.config import TraceConfig
from brokerd.dialogs.endpoints.events import DialogEvents
from brokerd.dialogs.endpoints.stats import DROP_REASONS_KEPT, EngineStats
from brokerd.traces.writer import TraceWriter


def test_the_latest_drop_reasons_are_kept(tmp_path: Path) -> None:
    stats = EngineStats()
    events = DialogEvents(TraceWriter(TraceConfig(directory=tmp_path), "alpha"), stats)
    for n in range(DROP_REASONS_KEPT * 3):
        events.note_drop(f"reason {n}")
    kept = list(stats.drop_reasons)
    assert len(kept) == DROP_REASONS_KEPT
    assert kept[-1] == f"reason {DROP_REASONS_KEPT * 3 - 1}"
    assert kept[0] == f"reason {DROP_REASONS_KEPT * 2}"
