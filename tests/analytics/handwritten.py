"""Trace segments written event by event at chosen times, through the daemon's own trace
writer: the handcrafted sets of the analytics tests."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from brokerd.config import TraceConfig
from brokerd.traces.writer import TraceWriter

T0 = 1_790_000_000.0


class Writer:
    """Trace events at chosen times, through the daemon's own writer."""

    def __init__(self, root: Path) -> None:
        self.now = T0
        self.root = root
        self.writers: dict[str, TraceWriter] = {}

    def emit(self, instance: str, t: float, event: str, cid: uuid.UUID | None, **f: object) -> None:
        if instance not in self.writers:
            self.writers[instance] = TraceWriter(
                TraceConfig(directory=self.root / instance, compress=False),
                instance,
                clock=lambda: self.now,
            )
        self.now = t
        self.writers[instance].emit(event, cid, **f)

    def close(self) -> None:
        async def write() -> None:
            for w in self.writers.values():
                await w.start()
                await w.stop()  # flushes the buffer and closes the segment

        asyncio.run(write())
