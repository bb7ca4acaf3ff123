"""The daemon's files are its user's alone: databases, WAL, traces, the client token."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from tests.daemons import FAST_RETRY, running, wait_until
from tests.sdk.orders import wait_ready


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    old = os.umask(0o022)  # as a shell usually has it: the daemon must not rely on it
    try:
        with running(shop_and_warehouse(tmp_path / "deployment", FAST_RETRY)) as d:
            yield d
    finally:
        os.umask(old)


async def test_files_a_daemon_writes_are_readable_by_its_user_only(
    deployment: Deployment,
) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    await shop.send(handle, ORDER, b"<order n='1'/>")
    await wait_ready(warehouse, 1)
    data = deployment.daemons["beta"].directory / "data"

    def written() -> list[Path]:
        return [p for p in data.rglob("*") if p.is_file()]

    async def traces_written() -> bool:
        return any("traces" in p.parts for p in written())

    await wait_until(traces_written, 5)
    names = {p.name for p in written()}
    assert {"warehouse.sqlite", "warehouse.sqlite-wal", "client.token"} <= names, names
    loose = {str(p.relative_to(data)): oct(stat.S_IMODE(os.stat(p).st_mode)) for p in written()}
    assert all(mode == "0o600" for mode in loose.values()), loose
    for client in (shop, warehouse):
        await client.close()
