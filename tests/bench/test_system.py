"""What the benchmarks read from /proc: the CPU of a whole tree of processes."""

from __future__ import annotations

import subprocess
import sys

from bench.system import TreeCpu

BURN = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"


def test_a_grandchild_is_counted_under_its_own_program() -> None:
    """The shell starts a Python that burns 0.6 s of CPU: the tree's sampling counts it
    under its own name, read from its own /proc entry while it runs (not from the
    shell's ``cutime``, which a JVM that PySpark never waits for would not reach)."""
    script = f"{sys.executable} -c '{BURN}' & wait"
    with subprocess.Popen(["sh", "-c", script]) as shell, TreeCpu(shell.pid, 0.05) as cpu:
        shell.wait()
    by_program = cpu.by_program()
    burner = next(name for name in by_program if name.startswith("python"))
    assert 0.5 <= by_program[burner] <= 0.9, by_program
    assert by_program.get("sh", 0.0) < 0.2
