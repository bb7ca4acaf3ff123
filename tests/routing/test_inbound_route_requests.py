"""Messages from outside for a service no route names, while the dynamic routing service
is asked for a route (R-ROUTE-14, R-ROUTE-4 step 4, R-ROUTE-13), with a real daemon on
127.0.41.x:4022 and a hostile peer of the deployment's CA (``tests.hostile``)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.tools.launcher import Deployment
from examples.dynamic_router import answer
from protocol.dialog import MISSING_ROUTE
from tests.daemons import wait_until
from tests.hostile import HostileBroker, order_message
from tests.routing.deploy import RETRY, stat
from tests.routing.test_routing_bounds import DYNAMIC, routing_service_database

A = "127.0.41.1"
COOLDOWN = 2.0
"""``retry.delayed_retry``: an answered request counts as pending this long."""


@pytest.fixture
def slow_deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(tmp_path, {**RETRY, "delayed_retry": COOLDOWN})
    try:
        yield d
    finally:
        d.stop_all()


async def test_a_message_from_outside_is_asked_for_again_after_an_answer_without_a_route(
    slow_deployment: Deployment,
) -> None:
    """R-ROUTE-14: a message from outside for an unknown service makes the broker ask the
    dynamic routing service; its retransmissions while that request is pending are
    dropped (R-ROUTE-13, at most one request per service name). When the routing service
    answers without creating a route, the sender keeps retrying, and once the request no
    longer counts as pending, a retransmission must make the broker ask again: the drop
    decided while the request was pending must not be kept for the conversation."""
    msdb = '\n[[database]]\nname = "msdb"\n' + DYNAMIC.toml()
    daemon = slow_deployment.add("a", A, msdb + routing_service_database())
    slow_deployment.start("a")
    a = await daemon.client()
    mallory = HostileBroker(slow_deployment.cert_dir)
    await mallory.connect(A)
    header, body = order_message(uuid.uuid4(), uuid.uuid4(), 1, b"<order/>")
    header = header._replace(to_service="//unknown/Warehouse")
    sent = 0

    async def retransmit() -> None:
        nonlocal sent
        sent += 1
        await mallory.send_fragments([(header, body)])

        async def dropped() -> bool:
            return await stat(a, "dropped") >= sent

        await wait_until(dropped, 10)

    try:
        await retransmit()
        assert await stat(a, "route_requests") == 1
        await retransmit()  # the request is pending: dropped, not asked again
        assert await stat(a, "route_requests") == 1
        outcomes: list[str] = []
        while not outcomes:
            for message in await a.receive("RoutingQueue", top=10, timeout=5):
                if message.message_type_name == MISSING_ROUTE:
                    outcomes.append(await answer(a, message, {}))
        assert "no entry" in outcomes[0], outcomes
        answered = time.monotonic()
        # the sender retries while the answered request still counts as pending
        while time.monotonic() < answered + COOLDOWN * 0.75:
            await retransmit()
            await asyncio.sleep(0.2)  # the peer's retransmission interval
        assert await stat(a, "route_requests") == 1
        deadline = answered + COOLDOWN + 5.0
        while await stat(a, "route_requests") < 2:
            assert time.monotonic() < deadline, (
                "retransmissions after the request's cooldown never asked the dynamic "
                "routing service again"
            )
            await retransmit()
            await asyncio.sleep(0.2)  # the peer's retransmission interval
    finally:
        await mallory.close()
        await a.close()
