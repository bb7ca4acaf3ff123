"""The routing tests' deployment: declared per test with the quick retry timings of
``tests.routing.deploy.RETRY``, every daemon stopped at the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.tools.launcher import Deployment
from tests.routing.deploy import RETRY


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(tmp_path, RETRY)
    try:
        yield d
    finally:
        d.stop_all()
