"""The SDK tests' deployment: alpha (the shop) on 127.0.0.1:4022 and beta (the warehouse)
on 127.0.0.2:4022, both started, real files under the test's tmp_path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.tools.example import shop_and_warehouse
from brokerd.tools.launcher import Deployment
from tests.daemons import FAST_RETRY, running


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running(shop_and_warehouse(tmp_path / "deployment", FAST_RETRY)) as d:
        yield d
