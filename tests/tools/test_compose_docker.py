"""The compose deployment (R-OPS-6) run for real in Docker (``soak``: minutes, root, Debian's
docker.io, docker-compose and debootstrap; docs/deployment.md records a run).

Images built from a debootstrapped base, the compose file with the host-network override
up in a network namespace of its own, every broker healthy; orders through the forwarding
hub reach both load-balanced warehouses once each (R-ROUTE-5, R-ROUTE-7) and a reply
comes back; the mirrored database's principal container is killed mid-dialog and the
mirror promoted, and every parts message is received once, in order (R-ROUTE-16,
R-DLG-1); the Spark job over the trace volumes passes its audit (R-TRACE-2); everything
taken down leaves no process, mount, namespace or interface.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from brokerd.tools import compose_docker

pytestmark = pytest.mark.soak


def _interfaces() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    return {line.split(":")[1].strip() for line in out.stdout.splitlines()}


@pytest.mark.skipif(
    os.geteuid() != 0
    or not all(shutil.which(t) for t in ("dockerd", "debootstrap", "docker-compose", "nsenter")),
    reason="needs root, docker.io, docker-compose and debootstrap",
)
def test_the_compose_deployment_runs_in_docker_and_loses_nothing() -> None:
    before = _interfaces()
    result = compose_docker.run()
    drive = result["drive"]
    assert all(n > 0 for n in drive["orders_per_warehouse"]), drive
    assert sum(drive["orders_per_warehouse"]) == compose_docker.ORDERS
    assert drive["orders_received_once"] and drive["reply_through_hub"], drive
    assert drive["parts_received"] == drive["parts_sent"], drive
    assert drive["parts_exactly_once_in_order"], drive
    assert result["analyze_exit"] == 0, result["analyze_output"]
    assert result["leftovers"] == []
    assert _interfaces() == before
