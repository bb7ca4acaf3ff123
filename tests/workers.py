"""Tests run side by side (pytest-xdist, ``./dev test`` passes ``-n 2``), each worker in a
network namespace of its own.

Tests run real daemons on fixed loopback addresses (127.0.0.1:4022, 127.0.0.2:4022, a
fault proxy on 127.0.0.3:4022), as a deployment on one machine does. Two workers in one
namespace would take each other's ports, so each worker process unshares its network
namespace before any test runs and brings its loopback up: every address of 127/8 is its
own, and the daemons, proxies, Spark masters and browsers it starts inherit it. The
namespace has no name and goes when the worker's last process exits.

Tests go to the workers one at a time, as they become free, except the tests of a module
that has a module-scoped fixture (a Spark analysis, an analyzer, a deployment the module
shares): those go to one worker together (:class:`ModulesKeptWhole`), so that the fixture
is made once. Spread over both workers, a module's fixture was made on each and again
whenever a worker's next test came from another module: the synthetic analysis of
``tests/analytics/test_analytics.py`` three times a run. Each worker has its own
session-scoped Spark (the ``spark`` fixture).
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

CLONE_NEWNET = 0x40000000
"""``unshare(2)``'s flag for a new network namespace (``<sched.h>``)."""


def own_network_namespace() -> None:
    """Move the calling thread, and every thread and process it starts from now on, into a
    new network namespace whose loopback is up. Needs CAP_SYS_ADMIN."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"unshare(CLONE_NEWNET): {os.strerror(error)}")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, capture_output=True)


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    try:
        own_network_namespace()
    except (OSError, subprocess.CalledProcessError) as e:
        raise pytest.UsageError(
            f"pytest-xdist worker {worker} needs a network namespace of its own (the tests' "
            f"daemons share fixed loopback ports): {e}. Run as root, or without -n."
        ) from e


MODULE_FIXTURE = re.compile(r"""@pytest\.fixture\([^)]*scope=["']module["']""")
"""How a test module declares a fixture it shares between its tests."""


class ModulesKeptWhole(LoadScopeScheduling):
    """pytest-xdist's ``loadscope`` distribution, where a scope is a single test, except
    in a module that declares a module-scoped fixture, whose tests are one scope."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._kept_whole: dict[str, bool] = {}

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        whole = self._kept_whole.get(module)
        if whole is None:
            path = Path(str(self.config.rootpath)) / module
            try:
                whole = bool(MODULE_FIXTURE.search(path.read_text()))
            except OSError:
                whole = False
            self._kept_whole[module] = whole
        return module if whole else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """``--dist loadscope`` (``./dev test``): :class:`ModulesKeptWhole`."""
    if config.getvalue("dist") != "loadscope":
        return None
    return ModulesKeptWhole(config, log)
