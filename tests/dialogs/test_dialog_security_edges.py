"""Dialog security at its edges, with real daemons (SPEC R-DLG-14).

What a party without a service's key (a forwarder, or any CA-certified broker) must not
achieve, and what an operator's certificate files must not let through:

* an unsecured first message that claims to come from a service the target holds a
  remote service binding for is not delivered (the binding is what the target checks
  that service's dialogs against);
* a secured first message recorded by a forwarder and replayed once the target has
  removed its closed endpoint does not deliver the message a second time;
* a remote service binding whose certificate is another service's, or from another CA,
  is refused when the daemon starts; one that has expired makes BEGIN DIALOG fail;
* an initiator that ended its dialog WITH ERROR before the target ever answered, and
  is restarted, still gets its Error to the target (it still carries the key
  exchange).

Daemons listen on 127.0.0.191 to 127.0.0.193 only.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from pathlib import Path

import pytest

from brokerd.tools import certs
from brokerd.tools.example import CONTRACT, ORDER, SHOP_SERVICE, WAREHOUSE_SERVICE, database_toml
from brokerd.tools.faultproxy import TerminatingRelay
from brokerd.tools.launcher import Deployment
from protocol import dialog, events
from protocol.dialog import DialogHeader
from protocol.errors import DialogSecurityUnavailable
from protocol.security import Identity
from tests.daemons import FAST_RETRY, drain, running, wait_until
from tests.hostile import HostileBroker, order_message

ALPHA, BETA, RELAY = "127.0.0.191", "127.0.0.192", "127.0.0.193"


def secured_database(
    d: Deployment,
    database: str,
    queue: str,
    service: str,
    far_service: str,
    route_host: str | None,
    *,
    require: bool = True,
    binding_certificate: Path | None = None,
) -> str:
    """A database of the example whose ``service`` has its key pair and a remote service
    binding for ``far_service`` (its own certificate unless ``binding_certificate``)."""
    cert, key = d.issue_service(service)
    far_cert = binding_certificate or d.issue_service(far_service)[0]
    route_name = "ToWarehouse" if database == "shop" else "ToShop"
    remote = (route_name, far_service, route_host) if route_host else None
    text = database_toml(database, queue, service, remote)
    security = f'certificate = "{cert}"\nprivate_key = "{key}"\n'
    if require:
        security += 'dialog_security = "required"\n'
    text = text.replace(f'contracts = ["{CONTRACT}"]\n', f'contracts = ["{CONTRACT}"]\n{security}')
    return text + (
        f'[[database.remote_service_binding]]\nservice = "{far_service}"\n'
        f'certificate = "{far_cert}"\n'
    )


def shop(d: Deployment, route_host: str | None, binding_certificate: Path | None = None) -> str:
    return secured_database(
        d,
        "shop",
        "ClientQueue",
        SHOP_SERVICE,
        WAREHOUSE_SERVICE,
        route_host,
        binding_certificate=binding_certificate,
    )


def warehouse(d: Deployment, route_host: str | None, *, require: bool = True) -> str:
    return secured_database(
        d, "warehouse", "OrderQueue", WAREHOUSE_SERVICE, SHOP_SERVICE, route_host, require=require
    )


class RecordingRelay(TerminatingRelay):
    """A forwarder that keeps a copy of every dialog fragment it relays towards its
    target, as a compromised forwarder may."""

    def __init__(self, listen: str, target: str, identity: Identity) -> None:
        super().__init__(listen, 4022, target, 4022, identity)
        self.recorded: list[tuple[DialogHeader, bytes]] = []

    def _relayed(
        self, ev: events.Event, up: bool
    ) -> events.Fragment | events.Ack | events.Keepalive | None:
        if up and isinstance(ev, events.Fragment):
            self.recorded.append(dialog.decode_fragment(ev.payload))
        return super()._relayed(ev, up)


async def test_an_unsecured_first_message_from_a_bound_service_is_not_delivered(
    tmp_path: Path,
) -> None:
    """The warehouse holds a remote service binding for the shop's service (it does not
    require security of every dialog): a dialog with the shop is secured, so an
    unsecured first message that only claims to come from the shop, sent by a broker
    with a deployment certificate, is refused, not delivered as the shop's."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("beta", BETA, warehouse(d, None, require=False))
    with running(d):
        client = await d.daemons["beta"].client()
        mallory = HostileBroker(d.cert_dir)
        await mallory.connect(BETA)
        try:
            header, body = order_message(uuid.uuid4(), uuid.uuid4(), 1, b"<order id='forged'/>")
            await mallory.send_fragment(header, body)
            got = await client.receive("OrderQueue", timeout=3.0)
        finally:
            await mallory.close()
        assert [m.message_body for m in got] == []
        await client.close()


async def test_a_replayed_first_message_does_not_deliver_it_again(tmp_path: Path) -> None:
    """shop -> forwarder -> warehouse. The forwarder records the dialog's first message
    (sealed, with the key exchange). The dialog ends on both sides and the warehouse
    removes its closed endpoint (``closed_endpoint_keep``, 1 s here); the recorded first
    message, sent again, must not be delivered to the warehouse a second time."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("alpha", ALPHA, shop(d, RELAY))
    d.add(
        "beta",
        BETA,
        warehouse(d, ALPHA),
        extra="[limits]\nclosed_endpoint_keep = 1.0\n",
    )
    ca = certs.read_pair(d.cert_dir, "ca")
    identity = certs.identity_for(certs.issue_instance(ca, "forwarder"), ca)
    relay = RecordingRelay(RELAY, BETA, identity)
    await relay.start()
    try:
        with running(d):
            shop_client = await d.daemons["alpha"].client()
            warehouse_client = await d.daemons["beta"].client()
            handle = await shop_client.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
            await shop_client.send(handle, ORDER, b"<order id='1' amount='1000'/>")
            (first,) = await drain(warehouse_client, "OrderQueue", 1, timeout=30)
            await warehouse_client.end_conversation(first.conversation_handle)
            (end,) = await drain(shop_client, "ClientQueue", 1, timeout=30)
            assert end.is_end_dialog
            await shop_client.end_conversation(handle)

            async def removed() -> bool:
                return not await warehouse_client.view("conversation_endpoints")

            await wait_until(removed, 30)
            recorded = [(h, b) for h, b in relay.recorded if h.sequence_number == 1 and h.sequenced]
            assert recorded and recorded[0][0].security is not None
            mallory = HostileBroker(d.cert_dir)
            await mallory.connect(BETA)
            try:
                await mallory.send_fragment(*recorded[0])
                again = await warehouse_client.receive("OrderQueue", timeout=3.0)
            finally:
                await mallory.close()
            assert [m.message_body for m in again] == []
            await shop_client.close()
            await warehouse_client.close()
    finally:
        await relay.stop()


def foreign_certificate(d: Deployment, service: str) -> Path:
    """A certificate for ``service`` issued by a CA that is not the deployment's."""
    other = certs.create_ca("another CA")
    stem = certs.service_stem(service) + "-foreign"
    certs.write_pair(d.cert_dir, stem, certs.issue_service(other, service))
    return d.cert_dir / f"{stem}.pem"


def test_a_binding_to_the_certificate_of_another_service_is_refused(tmp_path: Path) -> None:
    """The shop's binding for the warehouse names a certificate of the deployment CA, but
    one issued to another service (its subject is that service's name)."""
    d = Deployment(tmp_path, FAST_RETRY)
    other, _ = d.issue_service("//elsewhere/Other")
    d.add("alpha", ALPHA, shop(d, BETA, binding_certificate=other))
    with pytest.raises(RuntimeError, match="//elsewhere/Other"), running(d):
        pass


def test_a_binding_to_a_certificate_of_another_ca_is_refused(tmp_path: Path) -> None:
    """The shop's binding for the warehouse names a certificate with the warehouse's
    name, but from a CA the deployment does not trust."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add(
        "alpha", ALPHA, shop(d, BETA, binding_certificate=foreign_certificate(d, WAREHOUSE_SERVICE))
    )
    with pytest.raises(RuntimeError, match="CA"), running(d):
        pass


async def test_a_dialog_to_a_service_whose_certificate_expired_fails_at_begin(
    tmp_path: Path,
) -> None:
    d = Deployment(tmp_path, FAST_RETRY)
    d.issue_service(SHOP_SERVICE)  # makes the deployment CA
    ca = certs.read_pair(d.cert_dir, "ca")
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    expired = certs.issue_service(ca, WAREHOUSE_SERVICE, days=1, now=long_ago)
    certs.write_pair(d.cert_dir, "warehouse-expired", expired)
    d.add(
        "alpha",
        ALPHA,
        shop(d, BETA, binding_certificate=d.cert_dir / "warehouse-expired.pem"),
    )
    with running(d):
        client = await d.daemons["alpha"].client()
        with pytest.raises(DialogSecurityUnavailable, match="expired"):
            await client.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await client.close()


async def test_an_error_ended_before_the_target_answered_survives_a_restart(
    tmp_path: Path,
) -> None:
    """The shop begins a secured dialog, sends, and ends it WITH ERROR while the
    warehouse is down (the message is dropped, the Error waits). SIGKILL and restart of
    the shop, then the warehouse starts: the Error must reach it, so both sides end."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("alpha", ALPHA, shop(d, BETA))
    d.add("beta", BETA, warehouse(d, ALPHA))
    with running(d, "alpha"):
        shop_client = await d.daemons["alpha"].client()
        handle = await shop_client.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop_client.send(handle, ORDER, b"<order id='1'/>")
        await shop_client.end_conversation(handle, error_code=7, description="cancelled")
        await asyncio.sleep(0.5)
        await shop_client.close()
        d.kill("alpha")
        d.start("alpha")
        d.start("beta")
        warehouse_client = await d.daemons["beta"].client()
        (error,) = await drain(warehouse_client, "OrderQueue", 1, timeout=20)
        assert error.is_error and b"cancelled" in error.message_body
        await warehouse_client.close()
