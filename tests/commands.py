"""The ``brokerd`` command and the project's other ``python -m`` tools, run as a user runs
them: each a process of its own, its output kept."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping


def module(
    name: str, *args: str, timeout: float = 300, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m NAME ARGS`` with this interpreter (``env``: the whole environment, or
    this one's when None)."""
    return subprocess.run(
        [sys.executable, "-m", name, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def brokerd(
    *args: str, timeout: float = 300, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return module("brokerd", *args, timeout=timeout, env=env)
