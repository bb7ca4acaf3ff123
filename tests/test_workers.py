"""The test workers' network namespaces (tests/workers.py): a process that has made its own
binds the daemons' fixed address while another process holds it, and its loopback works."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from brokerd.tools.soak import netns

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import os, socket
    from tests.workers import own_network_namespace

    own_network_namespace()
    server = socket.create_server(("127.0.0.2", 4022))
    client = socket.create_connection(("127.0.0.2", 4022), timeout=5)
    peer, _ = server.accept()
    client.sendall(b"ping")
    print(peer.recv(4).decode(), os.readlink("/proc/thread-self/ns/net"))
    """
)


def test_a_worker_binds_the_daemons_address_that_another_process_holds() -> None:
    can, why = netns.available()
    if not can:
        pytest.skip(why)
    held = socket.create_server(("127.0.0.2", 4022))
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        held.close()
    assert done.returncode == 0, done.stderr
    reply, namespace = done.stdout.split()
    assert reply == "ping"
    assert namespace != os.readlink("/proc/thread-self/ns/net")


def test_this_worker_is_in_a_namespace_of_its_own_when_tests_run_side_by_side() -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        pytest.skip("not a pytest-xdist worker")
    # The worker's parent is pytest's controller, which stays where it was started.
    assert os.readlink("/proc/thread-self/ns/net") != os.readlink(f"/proc/{os.getppid()}/ns/net")
