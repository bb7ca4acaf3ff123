"""The ``brokerd`` command, run as a user runs it: a process of its own, its output kept."""

from __future__ import annotations

import subprocess
import sys


def brokerd(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "brokerd", *args], capture_output=True, text=True, timeout=timeout
    )
