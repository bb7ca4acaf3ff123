"""Client roles (R-CLIENT-2; docs/design.md "Security defaults"): the login name selects a
token; an ``application`` token may use only its own services and queues, an ``admin``
token (the daemon's ``client.token``) everything. One daemon holds the shop and the
warehouse, each an application with a token of its own."""

from __future__ import annotations

import stat
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from brokerd.admin.ctl import main as brokerctl
from brokerd.sdk.client import BrokerClient
from brokerd.tools.example import (
    CONFIRMATION,
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_database,
    warehouse_database,
)
from brokerd.tools.launcher import Daemon, Deployment
from protocol.errors import AuthenticationFailed, PermissionDenied
from tests.daemons import FAST_RETRY

TOKENS = f"""
[[client.token]]
name = "shop"
file = "tokens/shop.token"
role = "application"
services = ["{SHOP_SERVICE}"]
queues = ["ClientQueue"]

[[client.token]]
name = "warehouse"
file = "tokens/warehouse.token"
role = "application"
services = ["{WAREHOUSE_SERVICE}"]
queues = ["OrderQueue"]
"""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Deployment(tmp_path / "deployment", FAST_RETRY)
    d.add(
        "alpha",
        "127.0.0.1",
        shop_database(None) + warehouse_database(None),
        client_extra=TOKENS,
    )
    try:
        yield d.start("alpha")
    finally:
        d.stop_all()


def token(daemon: Daemon, name: str) -> Path:
    return daemon.directory / "tokens" / f"{name}.token"


@pytest.fixture
async def shop(daemon: Daemon) -> AsyncIterator[BrokerClient]:
    async with await daemon.client("shop", token(daemon, "shop")) as client:
        yield client


@pytest.fixture
async def warehouse(daemon: Daemon) -> AsyncIterator[BrokerClient]:
    async with await daemon.client("warehouse", token(daemon, "warehouse")) as client:
        yield client


async def _order(shop: BrokerClient, warehouse: BrokerClient) -> uuid.UUID:
    """The shop orders; the warehouse receives the order. Returns the warehouse's handle."""
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    await shop.send(handle, ORDER, b"<order/>")
    [order] = await warehouse.receive("OrderQueue", timeout=10)
    assert order.message_body == b"<order/>"
    return order.conversation_handle


async def test_applications_send_and_receive_on_their_own_services_and_queues(
    daemon: Daemon, shop: BrokerClient, warehouse: BrokerClient
) -> None:
    assert (shop.role, warehouse.role) == ("application", "application")
    theirs = await _order(shop, warehouse)
    async with warehouse.transaction() as tx:
        await tx.send(theirs, CONFIRMATION, b"<confirmed/>")
        await tx.end_conversation(theirs)
    [reply] = await shop.receive("ClientQueue", timeout=10)
    assert reply.message_body == b"<confirmed/>"
    await shop.begin_conversation_timer(reply.conversation_handle, 60)
    await shop.end_conversation(reply.conversation_handle)
    for path in (token(daemon, "shop"), token(daemon, "warehouse")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # created on first start


async def test_an_application_is_refused_another_applications_queue_and_services(
    shop: BrokerClient, warehouse: BrokerClient
) -> None:
    theirs = await _order(shop, warehouse)
    with pytest.raises(PermissionDenied, match="queue 'OrderQueue' is not one of"):
        await shop.receive("OrderQueue")
    with pytest.raises(PermissionDenied, match="queue 'OrderQueue'"):
        async with shop.transaction() as tx:
            await tx.receive("OrderQueue")
    with pytest.raises(PermissionDenied, match=f"service '{WAREHOUSE_SERVICE}' is not one of"):
        await shop.begin_dialog(WAREHOUSE_SERVICE, SHOP_SERVICE, CONTRACT)
    with pytest.raises(PermissionDenied, match=f"belongs to service '{WAREHOUSE_SERVICE}'"):
        await shop.send(theirs, CONFIRMATION, b"<forged/>")
    with pytest.raises(PermissionDenied):
        await shop.send_many([(theirs, CONFIRMATION, b"<forged/>")])
    with pytest.raises(PermissionDenied):
        async with shop.transaction() as tx:
            await tx.send(theirs, CONFIRMATION, b"<forged/>")
    with pytest.raises(PermissionDenied):
        await shop.end_conversation(theirs, cleanup=True)
    with pytest.raises(PermissionDenied):
        await shop.begin_conversation_timer(theirs, 5)
    with pytest.raises(PermissionDenied):
        await shop.move_conversation(theirs, uuid.uuid4())
    # nothing of it took effect: the warehouse's conversation is intact
    await warehouse.send(theirs, CONFIRMATION, b"<confirmed/>")
    [reply] = await shop.receive("ClientQueue", timeout=10)
    assert reply.message_body == b"<confirmed/>"


async def test_an_application_is_refused_every_admin_operation(shop: BrokerClient) -> None:
    refused = [
        shop.alter_queue("ClientQueue", False),
        shop.create_route("shop", "Elsewhere", "tcp://127.0.0.9:4022"),
        shop.alter_route("shop", "AutoCreatedLocal", address="TRANSPORT"),
        shop.drop_route("shop", "AutoCreatedLocal"),
        shop.explain(WAREHOUSE_SERVICE, database="shop"),
        shop.set_mirror_role("shop", "mirror"),
        shop.conversation_endpoints(),
        shop.transmission_queue(),
        shop.queues(),
        shop.routes(),
        shop.broker_connections(),
        shop.view("stats"),
    ]
    for call in refused:
        with pytest.raises(PermissionDenied, match="is an admin operation"):
            await call
    assert (await shop.ping())["instance"] == "alpha"


async def test_the_admin_token_may_do_everything(
    daemon: Daemon, shop: BrokerClient, warehouse: BrokerClient
) -> None:
    theirs = await _order(shop, warehouse)
    async with await daemon.client() as admin:
        assert admin.role == "admin"
        await admin.send(theirs, CONFIRMATION, b"<from admin/>")
        [reply] = await admin.receive("ClientQueue", timeout=10)
        assert reply.message_body == b"<from admin/>"
        await admin.create_route("shop", "Elsewhere", "tcp://127.0.0.9:4022")
        assert any(r["name"] == "Elsewhere" for r in await admin.view("routes"))
        await admin.drop_route("shop", "Elsewhere")
        await admin.alter_queue("OrderQueue", False)
        await admin.alter_queue("OrderQueue", True)
        assert {row["service"] for row in await admin.view("conversation_endpoints")} == {
            SHOP_SERVICE,
            WAREHOUSE_SERVICE,
        }


async def test_the_login_name_selects_the_token(daemon: Daemon) -> None:
    with pytest.raises(AuthenticationFailed):  # the admin token does not log in as 'shop'
        await daemon.client("shop", daemon.token_file)
    with pytest.raises(AuthenticationFailed):  # nor the shop's token as anyone else
        await daemon.client("admin", token(daemon, "shop"))
    with pytest.raises(AuthenticationFailed):
        await daemon.client("warehouse", token(daemon, "shop"))


def test_brokerctl_logs_in_with_an_application_token(
    daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    shop = [
        "--host",
        daemon.client_host,
        "--user",
        "shop",
        "--token-file",
        str(token(daemon, "shop")),
    ]
    assert brokerctl([*shop, "ping"]) == 0
    assert brokerctl([*shop, "queues"]) == 2
    assert "view is an admin operation" in capsys.readouterr().err
    assert brokerctl(["--config", str(daemon.config_path), "queues"]) == 0  # the admin token
    assert "OrderQueue" in capsys.readouterr().out
