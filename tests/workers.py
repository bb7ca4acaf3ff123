"""Tests run side by side (pytest-xdist, ``./dev test`` passes ``-n 2``), each worker in a
network namespace of its own.

Tests run real daemons on fixed loopback addresses (127.0.0.1:4022, 127.0.0.2:4022, a
fault proxy on 127.0.0.3:4022), as a deployment on one machine does. Two workers in one
namespace would take each other's ports, so each worker process unshares its network
namespace before any test runs and brings its loopback up: every address of 127/8 is its
own, and the daemons, proxies, Spark masters and browsers it starts inherit it. The
namespace has no name and goes when the worker's last process exits.

The tests that share the session's Spark (the ``spark`` fixture) run on one worker
(``xdist_group``), so that one JVM serves them all.
"""

from __future__ import annotations

import ctypes
import os
import subprocess

import pytest

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return  # run without pytest-xdist (``-p no:xdist``): no groups to keep
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))
