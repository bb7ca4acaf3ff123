"""Dialog security with real daemons (SPEC R-DLG-14).

The shop and the warehouse each have a service certificate from the deployment CA
and a remote service binding for the other; the shop's service requires dialog
security. The dialog key travels with the first messages, wrapped for the
warehouse's key and signed by the shop's; from then on every body is encrypted and
every header authenticated end to end.

* through a forwarder, the forwarder's database files and trace segments never hold
  the body;
* a relay that terminates both connections (a compromised forwarder, built on the
  fault proxy) and alters a body, an acknowledgement and an Error is refused at the
  far end, and each message is delivered intact on retransmission;
* the dialog key is persisted: SIGKILL and restart of either end, and the dialog goes
  on under the same key;
* a dialog that must be secured but has no remote service binding fails at BEGIN
  DIALOG (``dialog_security_unavailable``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from brokerd.dialogs.endpoints.broker_errors import error_body
from brokerd.sdk.client import BrokerClient
from brokerd.tools import certs
from brokerd.tools.example import (
    CONFIRMATION,
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    database_toml,
)
from brokerd.tools.faultproxy import RelayPlan, TerminatingRelay
from brokerd.tools.launcher import Deployment
from brokerd.traces.segments import segment_lines
from brokerd.traces.writer import segment_files
from protocol.dialog import ERROR, FLAG_ERROR, Acknowledgement, DialogHeader
from protocol.errors import DialogSecurityUnavailable
from tests.daemons import FAST_RETRY, drain, running, wait_until
from tests.hostile import HostileBroker

ALPHA, BETA, FORWARDER = "127.0.0.1", "127.0.0.2", "127.0.0.5"
RELAY_TO_BETA, RELAY_TO_ALPHA = "127.0.0.3", "127.0.0.4"
MARKER = b"PLAINTEXT-MARKER-7f3a"


def secured(
    d: Deployment,
    database: str,
    queue: str,
    service: str,
    far_service: str,
    route_host: str | None,
    *,
    require: bool = True,
    bind: bool = True,
) -> str:
    """A database of the example with ``service``'s key pair and (``bind``) a remote
    service binding for ``far_service``."""
    cert, key = d.issue_service(service)
    far_cert, _ = d.issue_service(far_service)
    remote = ("ToWarehouse", far_service, route_host) if route_host else None
    if remote and database == "warehouse":
        remote = ("ToShop", far_service, route_host)
    text = database_toml(database, queue, service, remote)
    security = f'certificate = "{cert}"\nprivate_key = "{key}"\n'
    if require:
        security += 'dialog_security = "required"\n'
    text = text.replace(f'contracts = ["{CONTRACT}"]\n', f'contracts = ["{CONTRACT}"]\n{security}')
    if bind:
        text += (
            f'[[database.remote_service_binding]]\nservice = "{far_service}"\n'
            f'certificate = "{far_cert}"\n'
        )
    return text


def shop(d: Deployment, route_host: str | None, **kw: Any) -> str:
    return secured(d, "shop", "ClientQueue", SHOP_SERVICE, WAREHOUSE_SERVICE, route_host, **kw)


def warehouse(d: Deployment, route_host: str | None, **kw: Any) -> str:
    return secured(d, "warehouse", "OrderQueue", WAREHOUSE_SERVICE, SHOP_SERVICE, route_host, **kw)


async def stat(client: BrokerClient, name: str) -> int:
    (row,) = await client.view("stats")
    return int(row[name])


def files_holding(root: Path, marker: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and marker in p.read_bytes()]


@pytest.fixture
def direct(tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("alpha", ALPHA, shop(d, BETA))
    d.add("beta", BETA, warehouse(d, ALPHA))
    with running(d):
        yield d


async def test_a_secured_dialog_survives_sigkill_and_restart_of_either_end(
    direct: Deployment,
) -> None:
    shop_client = await direct.daemons["alpha"].client()
    warehouse_client = await direct.daemons["beta"].client()
    handle = await shop_client.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    await shop_client.send(handle, ORDER, b"<order id='1'/>")
    (first,) = await drain(warehouse_client, "OrderQueue", 1)
    assert first.message_body == b"<order id='1'/>"
    target = first.conversation_handle
    for client in (shop_client, warehouse_client):
        (row,) = await client.view("conversation_endpoints")
        assert row["secured"] is True
    await warehouse_client.send(target, CONFIRMATION, b"<confirmed id='1'/>")
    (reply,) = await drain(shop_client, "ClientQueue", 1)
    assert reply.message_body == b"<confirmed id='1'/>"

    # The target dies; a message waits; it comes back with the key from its file.
    await warehouse_client.close()
    direct.kill("beta")
    await shop_client.send(handle, ORDER, b"<order id='2'/>")
    direct.start("beta")
    warehouse_client = await direct.daemons["beta"].client()
    (second,) = await drain(warehouse_client, "OrderQueue", 1, timeout=30)
    assert (second.message_sequence_number, second.message_body) == (2, b"<order id='2'/>")

    # The initiator dies; a reply waits; it comes back with the key from its file.
    await shop_client.close()
    direct.kill("alpha")
    await warehouse_client.send(target, CONFIRMATION, b"<confirmed id='2'/>")
    direct.start("alpha")
    shop_client = await direct.daemons["alpha"].client()
    (reply,) = await drain(shop_client, "ClientQueue", 1, timeout=30)
    assert (reply.message_sequence_number, reply.message_body) == (2, b"<confirmed id='2'/>")
    large = b"<order id='3'>" + bytes(range(256)) * 800 + b"</order>"  # 4 fragments
    await shop_client.send(handle, ORDER, large)
    (third,) = await drain(warehouse_client, "OrderQueue", 1, timeout=30)
    assert third.message_body == large

    for client in (shop_client, warehouse_client):
        assert await stat(client, "dialog_security_refusals") == 0

    # With the warehouse down, the shop restarts; a CA-certified broker then forges the
    # warehouse's broker error and acknowledgement (unsealed: it has no dialog key). They
    # are refused: the restarted initiator knows the target has answered under the key.
    (row,) = await shop_client.view("conversation_endpoints")
    await warehouse_client.close()
    direct.stop("beta")
    await shop_client.close()
    direct.kill("alpha")
    direct.start("alpha")
    shop_client = await direct.daemons["alpha"].client()
    await shop_client.send(handle, ORDER, b"<order id='4'/>")
    (before,) = await shop_client.view("conversation_endpoints")
    forged = forged_frames(row)
    mallory = HostileBroker(direct.cert_dir)
    await mallory.connect(ALPHA)
    try:
        await mallory.send_fragment(*forged[0])
        await mallory.send_acks([forged[1]])

        async def refused() -> bool:
            return await stat(shop_client, "dialog_security_refusals") >= 2

        await wait_until(refused, 10)
    finally:
        await mallory.close()
    (row,) = await shop_client.view("conversation_endpoints")
    # Nothing unsent deleted (order 4, and order 3 if its acknowledgement was lost in the
    # kill), and the dialog not ended.
    assert (row["state"], row["unacknowledged"]) == ("CO", before["unacknowledged"])
    assert before["unacknowledged"] >= 1
    direct.start("beta")
    warehouse_client = await direct.daemons["beta"].client()
    (fourth,) = await drain(warehouse_client, "OrderQueue", 1, timeout=30)
    assert fourth.message_body == b"<order id='4'/>"
    await shop_client.close()
    await warehouse_client.close()


def forged_frames(row: dict[str, Any]) -> list[Any]:
    """An unsealed broker error and acknowledgement, as if from the far side of ``row``."""
    cid = uuid.UUID(row["conversation_id"])
    far = uuid.UUID(row["far_broker_instance"])
    error = error_body(-8408, "forged")
    header = DialogHeader(
        cid,
        WAREHOUSE_SERVICE,
        SHOP_SERVICE,
        far,
        None,
        CONTRACT,
        ERROR,
        FLAG_ERROR,
        message_length=len(error),
    )
    ack = DialogHeader(
        cid,
        WAREHOUSE_SERVICE,
        SHOP_SERVICE,
        far,
        None,
        CONTRACT,
        flags=0,
        ack=Acknowledgement(through=1000),
    )
    return [(header, error), ack]


async def test_a_dialog_that_must_be_secured_without_a_binding_fails_at_begin(
    tmp_path: Path,
) -> None:
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("alpha", ALPHA, shop(d, BETA, bind=False))
    with running(d):
        client = await d.daemons["alpha"].client()
        with pytest.raises(DialogSecurityUnavailable, match="no remote service binding"):
            await client.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await client.close()


async def test_an_unsecured_dialog_to_a_service_that_requires_security_is_refused(
    tmp_path: Path,
) -> None:
    """The initiator has no binding and does not require security: its dialog goes out
    unsecured, and the warehouse answers with a broker error instead of enqueueing it."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add(
        "alpha",
        ALPHA,
        database_toml("shop", "ClientQueue", SHOP_SERVICE, ("W", WAREHOUSE_SERVICE, BETA)),
    )
    d.add("beta", BETA, warehouse(d, ALPHA))
    with running(d):
        shop_client = await d.daemons["alpha"].client()
        warehouse_client = await d.daemons["beta"].client()
        handle = await shop_client.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop_client.send(handle, ORDER, MARKER)
        (error,) = await drain(shop_client, "ClientQueue", 1)
        assert error.is_error and b"requires dialog security" in error.message_body
        assert await warehouse_client.receive("OrderQueue", timeout=0.5) == []
        await shop_client.close()
        await warehouse_client.close()


async def test_a_forwarder_never_holds_the_plaintext_of_a_secured_dialog(tmp_path: Path) -> None:
    """alpha -> forwarder -> beta and back; the forwarder's files are grepped for a marker
    the bodies carry both ways."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("alpha", ALPHA, shop(d, FORWARDER))
    d.add("beta", BETA, warehouse(d, FORWARDER))
    d.add(
        "forwarder",
        FORWARDER,
        '\n[[database]]\nname = "msdb"\n'
        f'[[database.route]]\nname = "Fwd"\nremote_service_name = "{WAREHOUSE_SERVICE}"\n'
        f'address = "tcp://{BETA}:4022"\n'
        f'[[database.route]]\nname = "Back"\nremote_service_name = "{SHOP_SERVICE}"\n'
        f'address = "tcp://{ALPHA}:4022"\n',
        endpoint_extra="message_forwarding = true\n",
    )
    with running(d):
        shop_client = await d.daemons["alpha"].client()
        warehouse_client = await d.daemons["beta"].client()
        forwarder = await d.daemons["forwarder"].client()
        handle = await shop_client.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        for n in range(5):
            await shop_client.send(handle, ORDER, MARKER + b" order %d" % n)
        got = await drain(warehouse_client, "OrderQueue", 5)
        assert [m.message_body for m in got] == [MARKER + b" order %d" % n for n in range(5)]
        await warehouse_client.send(got[0].conversation_handle, CONFIRMATION, MARKER + b" reply")
        (reply,) = await drain(shop_client, "ClientQueue", 1)
        assert reply.message_body == MARKER + b" reply"
        (stats,) = await forwarder.view("stats")
        assert stats["forwarded_fragments"] >= 6
        for client in (shop_client, warehouse_client, forwarder):
            await client.close()
    # Stopped: every trace segment is flushed, the WAL is in the file.
    forwarder_dir = d.daemons["forwarder"].directory
    segments = segment_files([forwarder_dir])
    assert list(forwarder_dir.rglob("*.sqlite")) and segments
    assert files_holding(forwarder_dir, MARKER) == []
    # a compacted segment is compressed: its lines are searched as a reader sees them
    assert [s for s in segments if MARKER in b"".join(segment_lines(s))] == []


@pytest.fixture
async def relayed(tmp_path: Path) -> AsyncIterator[tuple[Deployment, TerminatingRelay]]:
    """alpha -> relay -> beta, beta -> relay -> alpha: every frame of the dialog passes a
    relay that holds a deployment certificate and ends both connections."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("alpha", ALPHA, shop(d, RELAY_TO_BETA))
    d.add("beta", BETA, warehouse(d, RELAY_TO_ALPHA))
    ca = certs.read_pair(d.cert_dir, "ca")
    identity = certs.identity_for(certs.issue_instance(ca, "relay"), ca)
    up = TerminatingRelay(RELAY_TO_BETA, 4022, BETA, 4022, identity)
    down = TerminatingRelay(RELAY_TO_ALPHA, 4022, ALPHA, 4022, identity)
    await up.start()
    await down.start()
    try:
        with running(d):
            yield d, up
    finally:
        await up.stop()
        await down.stop()


async def test_what_a_relay_alters_is_refused_and_then_delivered_intact(
    relayed: tuple[Deployment, TerminatingRelay],
) -> None:
    d, relay = relayed
    relay.plan = RelayPlan(alter_fragments={1, 3}, alter_acks={1}, alter_errors={1})
    shop_client = await d.daemons["alpha"].client()
    warehouse_client = await d.daemons["beta"].client()
    handle = await shop_client.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    bodies = [MARKER + b" order %d" % n for n in range(1, 4)]
    for body in bodies:
        await shop_client.send(handle, ORDER, body)
    got = await drain(warehouse_client, "OrderQueue", 3, timeout=30)
    assert [(m.message_sequence_number, m.message_body) for m in got] == [
        (n, body) for n, body in enumerate(bodies, 1)
    ]

    async def settled() -> bool:
        return not await shop_client.view("transmission_queue")

    await wait_until(settled, 30)
    assert relay.stats.altered >= 3  # two bodies and an acknowledgement
    assert all(MARKER not in body for body in relay.bodies)

    # END CONVERSATION WITH ERROR: the relay alters the Error; the target refuses it,
    # and the retransmitted one arrives intact.
    await shop_client.end_conversation(handle, error_code=7, description="out of stock")
    (error,) = await drain(warehouse_client, "OrderQueue", 1, timeout=30)
    assert error.is_error and b"out of stock" in error.message_body
    assert relay.stats.altered >= 4
    refused = await stat(warehouse_client, "dialog_security_refusals")
    # the altered first message and the altered Error; the altered third came before the
    # dialog's first had got through, and no message but the first begins a dialog (SPEC
    # §5): it was dropped as such, and its intact copy delivered later
    assert refused >= 2
    assert await stat(shop_client, "dialog_security_refusals") >= 1  # the altered ack
    drops = [r["reason"] for r in await warehouse_client.view("drops")]
    assert any("refused by dialog security" in r for r in drops)
    assert any("not the first of its dialog" in r for r in drops)
    await shop_client.close()
    await warehouse_client.close()
