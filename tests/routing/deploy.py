"""Building blocks for routing tests with real daemons (worked-example style deployments).

A database here is "AdventureWorks"-like: services on the ``DEFAULT`` contract,
one queue per service, and the route table the test gives. Addresses of the
documentation's ``tcp://host.Adventure-Works.com:4022/`` hosts are mapped to loopback
aliases 127.0.0.x, each daemon listening on port 4022.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.tools.launcher import Deployment
from tests.daemons import wait_until

AW = "AdventureWorks"
RETRY = {"initial": 0.5, "maximum": 2.0, "ack_delay": 0.005, "delayed_retry": 0.5}


@dataclass(frozen=True)
class R:
    """A route row (R-OBJ-5) as the documentation's tables write it."""

    name: str
    address: str
    service: str | None = None
    broker_instance: uuid.UUID | str | None = None
    mirror_address: str | None = None

    def toml(self) -> str:
        lines = ["[[database.route]]", f'name = "{self.name}"', f'address = "{self.address}"']
        if self.service is not None:
            lines.append(f'remote_service_name = "{self.service}"')
        if self.broker_instance is not None:
            lines.append(f'broker_instance = "{self.broker_instance}"')
        if self.mirror_address is not None:
            lines.append(f'mirror_address = "{self.mirror_address}"')
        return "\n".join(lines) + "\n"


def queue_of(service: str) -> str:
    """The queue a test service reads from."""
    return "Q_" + "".join(ch if ch.isalnum() else "_" for ch in service)


def database(
    name: str,
    services: Sequence[str] = (),
    routes: Sequence[R] = (),
    broker_instance: uuid.UUID | str | None = None,
    mirror_role: str | None = None,
) -> str:
    """One ``[[database]]`` table."""
    text = f'\n[[database]]\nname = "{name}"\n'
    if broker_instance is not None:
        text += f'broker_instance = "{broker_instance}"\n'
    if mirror_role is not None:
        text += f'mirror_role = "{mirror_role}"\n'
    for service in services:
        text += (
            f'[[database.queue]]\nname = "{queue_of(service)}"\n'
            f'[[database.service]]\nname = "{service}"\nqueue = "{queue_of(service)}"\n'
            'contracts = ["DEFAULT"]\n'
        )
    for route in routes:
        text += route.toml()
    return text


def addr(host: str) -> str:
    """The documentation's trailing-slash spelling, mapped to a loopback alias."""
    return f"tcp://{host}:4022/"


async def tq(client: BrokerClient) -> list[dict[str, object]]:
    return await client.view("transmission_queue")


async def wait_status(client: BrokerClient, text: str, timeout: float = 20.0) -> str:
    """Wait until a transmission-queue row's status contains ``text``; return that status."""
    found: list[str] = []

    async def check() -> bool:
        for row in await client.view("transmission_queue"):
            status = str(row["transmission_status"])
            if text in status:
                found.append(status)
                return True
        return False

    await wait_until(check, timeout)
    return found[0]


async def wait_drops(client: BrokerClient, text: str, timeout: float = 20.0) -> str:
    """Wait until the daemon reports a dropped message whose reason contains ``text``."""
    found: list[str] = []

    async def check() -> bool:
        for row in await client.view("drops"):
            if text in row["reason"]:
                found.append(row["reason"])
                return True
        return False

    await wait_until(check, timeout)
    return found[0]


async def stat(client: BrokerClient, name: str) -> int:
    (row,) = await client.view("stats")
    return int(row[name])


# -- mirrored pairs (R-ROUTE-15, R-ROUTE-16) ---------------------------------------------


async def mirroring(deployment: Deployment, name: str) -> dict[str, object]:
    """Daemon ``name``'s row of the ``mirroring`` view (one mirrored database)."""
    client = await deployment.daemons[name].client()
    try:
        (row,) = await client.view("mirroring")
        return row
    finally:
        await client.close()


async def wait_caught_up(deployment: Deployment, principal: str, mirror: str) -> None:
    """Until ``mirror`` is attached to ``principal`` and holds and confirmed its last unit."""

    async def same() -> bool:
        p = await mirroring(deployment, principal)
        m = await mirroring(deployment, mirror)
        return bool(p["mirror_attached"]) and p["lsn"] == m["lsn"] == p["confirmed"]

    await wait_until(same, 30)


async def receive_some(
    client: BrokerClient, count: int, queue: str, timeout: float = 30
) -> list[ReceivedMessage]:
    """Up to ``count`` messages of ``queue``, RECEIVEd until they came or ``timeout`` s."""
    got: list[ReceivedMessage] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(got) < count and loop.time() < deadline:
        got += await client.receive(queue, top=count - len(got), timeout=1.0)
    return got
