"""ALTER QUEUE ... STATUS survives a restart; a change of the configured status still
applies at the next start (R-DLG-12)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from brokerd.tools.launcher import Deployment


async def _status(deployment: Deployment) -> str:
    client = await deployment.daemons["beta"].client()
    try:
        rows = await client.queues()
        return str(next(r["status"] for r in rows if r["queue"] == "OrderQueue"))
    finally:
        await client.close()


async def _alter(deployment: Deployment, status: bool) -> None:
    client = await deployment.daemons["beta"].client()
    await client.alter_queue("OrderQueue", status)
    await client.close()


async def _restart(deployment: Deployment, kill: bool = False) -> None:
    if kill:
        deployment.kill("beta")
    else:
        deployment.stop("beta")
    await asyncio.to_thread(deployment.start, "beta")


def _configure(config: Path, status: str | None) -> None:
    text = config.read_text().replace('\nstatus = "off"', "").replace('\nstatus = "on"', "")
    if status is not None:
        text = text.replace('name = "OrderQueue"', f'name = "OrderQueue"\nstatus = "{status}"')
    config.write_text(text)


async def test_a_queue_status_set_by_alter_queue_survives_a_restart(
    deployment: Deployment,
) -> None:
    await _alter(deployment, False)
    await _restart(deployment, kill=True)
    assert await _status(deployment) == "off"  # the configuration (on) did not overwrite it

    await _alter(deployment, True)
    _configure(deployment.daemons["beta"].config_path, "off")  # the configuration changes
    await _restart(deployment)
    assert await _status(deployment) == "off"

    await _alter(deployment, True)  # the configuration still says off, unchanged
    await _restart(deployment)
    assert await _status(deployment) == "on"
