"""What the benchmarks read from the operating system: CPU time and memory of a process
(Linux ``/proc``) and a description of the machine a result was measured on."""

from __future__ import annotations

import asyncio
import math
import os
import platform
import sqlite3
import threading
from pathlib import Path
from typing import Any


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process so far, with that of its children that have
    ended and been waited for (Linux /proc: ``utime``, ``stime``, ``cutime``,
    ``cstime``), or NaN. A daemon compacts its closed trace segments in a process of its
    own (``python -m brokerd.traces.columnar``): that CPU is the daemon's work too."""
    if pid is None:
        return math.nan
    try:
        _, fields = _stat(Path(f"/proc/{pid}/stat").read_text())
        return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return math.nan


def _stat(text: str) -> tuple[str, list[str]]:
    """The program name of a ``/proc/PID/stat`` line and the fields after it (the name,
    in parentheses, may hold spaces and parentheses of its own)."""
    name, rest = text.split("(", 1)[1].rsplit(")", 1)
    return name, rest.split()


def written_bytes(pid: int | None) -> float:
    """Bytes a process has caused to be written to storage so far (``write_bytes`` of
    Linux's ``/proc/PID/io``: its files' pages as they reach the disk, not its socket
    writes), or NaN. Its children's writes are not in it (Linux keeps no such sum): a
    daemon's trace compaction writes its Parquet file, about 30 bytes a message
    (docs/traces.md), against the about 1 kB of JSON Lines the daemon itself wrote."""
    if pid is None:
        return math.nan
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return math.nan


def memory_mb(pid: int | None, field: str = "VmHWM") -> float:
    """A memory figure of ``/proc/PID/status`` in MB (10^6 bytes): ``VmHWM`` is the peak
    resident set size, ``VmRSS`` the current one. NaN when unknown."""
    if pid is None:
        return math.nan
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e6
    except (OSError, ValueError, IndexError):
        pass
    return math.nan


def filesystem_of(path: Path) -> str:
    """The file system type holding ``path`` (fsync cost depends on it)."""
    best, kind = "", "?"
    resolved = path.resolve()
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                parts = line.split()
                if (
                    len(parts) >= 3
                    and resolved.is_relative_to(parts[1])
                    and len(parts[1]) > len(best)
                ):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return f"{kind} ({best})" if best else kind


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(workdir: Path) -> dict[str, Any]:
    """The CPU, cores, interpreter, SQLite, event loop and file system of a run."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "sqlite": sqlite3.sqlite_version,
        "event_loop": type(asyncio.get_event_loop_policy()).__module__.split(".")[0],
        "workdir_fs": filesystem_of(workdir),
        "kernel": platform.release(),
    }


def own_cpu_seconds() -> float:
    """User + system CPU time of this process so far."""
    t = os.times()
    return t.user + t.system


class TreeCpu:
    """The CPU time of a process and of every process below it, by program name, read
    from ``/proc`` every ``interval`` seconds while it runs.

    A child that nobody waits for (the JVM that PySpark starts, for one) never reaches
    its parent's ``cutime``, so the tree is sampled: each process's last reading
    counts, which leaves out at most its last ``interval`` of CPU."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        self.root = root
        self.interval = interval
        self._last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-cpu", daemon=True)

    def __enter__(self) -> TreeCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def by_program(self) -> dict[str, float]:
        """CPU seconds per program name (``java``, ``python3``...), largest first."""
        totals: dict[str, float] = {}
        for name, seconds in self._last.values():
            totals[name] = totals.get(name, 0.0) + seconds
        return dict(sorted(totals.items(), key=lambda item: -item[1]))

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval):
                self._sample()
                return

    def _sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        parents: dict[int, tuple[int, str, float]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:  # a process that ends between the listing and the read is left out
                name, fields = _stat((entry / "stat").read_text())
            except (OSError, IndexError, ValueError):
                continue
            parents[int(entry.name)] = (
                int(fields[1]),
                name,
                (int(fields[11]) + int(fields[12])) / tick,
            )
        tree = {self.root}
        grown = True
        while grown:
            grown = False
            for pid, (parent, _, _) in parents.items():
                if parent in tree and pid not in tree:
                    tree.add(pid)
                    grown = True
        for pid in tree:
            if pid in parents:
                _, name, seconds = parents[pid]
                self._last[pid] = (name, seconds)
