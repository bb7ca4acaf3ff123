"""The example deployment: a shop on one broker orders from a warehouse on another.

Two daemons on 127.0.0.1:4022 and 127.0.0.2:4022 with the configurations below, and a
request/reply application across them through the SDK (:func:`request_reply`).
Tests and benchmarks reuse the same configurations.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from brokerd.tools.launcher import Deployment

CONTRACT = "//shop/OrderContract"
ORDER = "//shop/Order"
CONFIRMATION = "//shop/Confirmation"
SHOP_SERVICE = "//shop/Client"
WAREHOUSE_SERVICE = "//warehouse/Orders"

_MESSAGE_TYPES = f"""
[[database.message_type]]
name = "{ORDER}"
validation = "none"
[[database.message_type]]
name = "{CONFIRMATION}"
validation = "none"
[[database.contract]]
name = "{CONTRACT}"
messages = [
    {{ message_type = "{ORDER}", sent_by = "initiator" }},
    {{ message_type = "{CONFIRMATION}", sent_by = "target" }},
]
"""


def database_toml(name: str, queue: str, service: str, route: tuple[str, str, str] | None) -> str:
    """One ``[[database]]`` with the example's message types and contract, a queue and a
    service; ``route`` is (route name, remote service, peer host) or None for no route."""
    text = _database_head(name) + _queue_and_service(queue, service)
    if route is not None:
        route_name, remote_service, peer_host = route
        text += f"""[[database.route]]
name = "{route_name}"
remote_service_name = "{remote_service}"
address = "tcp://{peer_host}:4022"
"""
    return text


def two_services_database(name: str) -> str:
    """One ``[[database]]`` holding both the shop's and the warehouse's queue and service
    (a dialog between them stays inside one database)."""
    return (
        _database_head(name)
        + _queue_and_service("ClientQueue", SHOP_SERVICE)
        + _queue_and_service("OrderQueue", WAREHOUSE_SERVICE)
    )


def _database_head(name: str) -> str:
    return f"""
[[database]]
name = "{name}"
{_MESSAGE_TYPES}
"""


def _queue_and_service(queue: str, service: str) -> str:
    return f"""[[database.queue]]
name = "{queue}"
[[database.service]]
name = "{service}"
queue = "{queue}"
contracts = ["{CONTRACT}"]
"""


def shop_database(warehouse_host: str | None) -> str:
    """The shop; its route sends the warehouse's traffic to ``warehouse_host`` (None: no route)."""
    route = ("ToWarehouse", WAREHOUSE_SERVICE, warehouse_host) if warehouse_host else None
    return database_toml("shop", "ClientQueue", SHOP_SERVICE, route)


def warehouse_database(shop_host: str | None) -> str:
    """The warehouse; its route sends replies to the shop at ``shop_host`` (None: no route)."""
    route = ("ToShop", SHOP_SERVICE, shop_host) if shop_host else None
    return database_toml("warehouse", "OrderQueue", WAREHOUSE_SERVICE, route)


def shop_and_warehouse(
    root: Path,
    retry: dict[str, float] | None = None,
    hosts: tuple[str, str] = ("127.0.0.1", "127.0.0.2"),
    beta_route_host: str | None = None,
    extra: str = "",
    endpoint_extra: str = "",
) -> Deployment:
    """The two-broker deployment, declared (not started).

    ``beta_route_host`` makes alpha's route to the warehouse point elsewhere (a
    fault-injection proxy in front of beta, for instance). ``extra`` is top-level TOML
    added to both configurations (a ``[trace]`` table, for instance), ``endpoint_extra``
    lines added to both ``[endpoint]`` tables.
    """
    deployment = Deployment(root, retry)
    deployment.add(
        "alpha",
        hosts[0],
        shop_database(beta_route_host or hosts[1]),
        extra=extra,
        endpoint_extra=endpoint_extra,
    )
    deployment.add(
        "beta", hosts[1], warehouse_database(hosts[0]), extra=extra, endpoint_extra=endpoint_extra
    )
    return deployment


async def request_reply(deployment: Deployment, orders: int = 3) -> None:
    alpha, beta = deployment.daemons["alpha"], deployment.daemons["beta"]
    shop = await alpha.client()
    warehouse = await beta.client()
    try:
        t0 = time.perf_counter()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        print(f"alpha: BEGIN DIALOG {SHOP_SERVICE} -> {WAREHOUSE_SERVICE}: handle {handle}")
        for n in range(1, orders + 1):
            body = f"<order id='{n}'><item>widget</item><qty>{n}</qty></order>".encode()
            seq = await shop.send(handle, ORDER, body)
            print(f"alpha: SEND {ORDER} #{seq} ({len(body)} bytes) committed")
        received = 0
        target = None
        while received < orders:
            for m in await warehouse.receive("OrderQueue", top=10, timeout=10):
                received += 1
                target = m.conversation_handle
                print(
                    f"beta:  RECEIVE #{m.message_sequence_number} {m.message_type_name}: "
                    f"{m.message_body.decode()}"
                )
                reply = f"<confirmation order='{m.message_sequence_number}'/>".encode()
                await warehouse.send(m.conversation_handle, CONFIRMATION, reply)
                print(f"beta:  SEND {CONFIRMATION} for #{m.message_sequence_number}")
        assert target is not None
        confirmed = 0
        while confirmed < orders:
            for m in await shop.receive("ClientQueue", top=10, timeout=10):
                confirmed += 1
                print(f"alpha: RECEIVE {m.message_type_name}: {m.message_body.decode()}")
        await shop.end_conversation(handle)
        print("alpha: END CONVERSATION (state DO until beta ends too)")
        for m in await warehouse.receive("OrderQueue", timeout=10):
            print(f"beta:  RECEIVE {m.message_type_name}")
            if m.is_end_dialog:
                await warehouse.end_conversation(m.conversation_handle)
                print("beta:  END CONVERSATION")
        # alpha has ended: beta's EndDialog closes its endpoint and is not received
        await asyncio.sleep(0.3)
        for name, client in (("alpha", shop), ("beta", warehouse)):
            for endpoint in await client.conversation_endpoints():
                short = str(endpoint.conversation_handle)[-8:]
                print(f"{name}: endpoint {short} state {endpoint.state}")
            queued = await client.transmission_queue()
            print(f"{name}: transmission queue holds {len(queued)} message(s)")
        for link in await shop.broker_connections():
            print(
                f"alpha: connection {link.direction} {link.peer} {link.address} "
                f"frames {link.frames_sent}/{link.frames_received} "
                f"encrypted={link.encrypted}"
            )
        print(f"request/reply of {orders} orders done in {time.perf_counter() - t0:.2f} s")
    finally:
        await shop.close()
        await warehouse.close()
