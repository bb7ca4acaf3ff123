"""The ``brokerd`` command and the project's other ``python -m`` tools, run as a user runs
them: each a process of its own, its output kept."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The checkout: where ``brokerctl`` runs (no file of the test's directory is its)."""


def module(
    name: str,
    *args: str,
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m NAME ARGS`` with this interpreter (``env``: the whole environment, or
    this one's when None), in ``cwd`` (this process's directory when None)."""
    return subprocess.run(
        [sys.executable, "-m", name, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        check=False,
    )


def brokerd(
    *args: str, timeout: float = 300, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return module("brokerd", *args, timeout=timeout, env=env)


def brokerctl(
    *args: str, timeout: float = 60, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``brokerctl ARGS`` with this environment less ``BROKERD_CONFIG`` (each test says
    which daemon it asks), plus ``env``."""
    environ = {k: v for k, v in os.environ.items() if k != "BROKERD_CONFIG"}
    environ.update(env or {})
    return module("brokerd.admin.ctl", *args, timeout=timeout, env=environ, cwd=ROOT)
