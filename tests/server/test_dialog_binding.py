"""R-DLG-14: a message, acknowledgement or error for a conversation is accepted only from
the broker the conversation is bound to.

A hostile broker holding a valid certificate from the deployment CA, knowing the
conversation id and both broker instances, connects to beta's port 4022 and forges a
message (with a piggybacked acknowledgement), a dedicated acknowledgement, a broker
error and a sequenced Error for a live dialog between alpha and beta, sent directly
and claiming to relay them (hop count 1). Nothing is enqueued, beta's unacknowledged
reply stays in its transmission queue, the dialog does not end, and the legitimate
messages are delivered in order afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brokerd.dialogs.endpoints.broker_errors import error_body
from brokerd.sdk.client import BrokerClient
from brokerd.tools.example import (
    CONFIRMATION,
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from protocol.dialog import (
    ERROR,
    FLAG_ERROR,
    FLAG_INITIATOR,
    FLAG_SEQUENCED,
    Acknowledgement,
    DialogHeader,
)
from tests.daemons import FAST_RETRY, drain, running, wait_until
from tests.hostile import HostileBroker


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running(shop_and_warehouse(tmp_path, FAST_RETRY)) as d:
        yield d


async def endpoint(client: BrokerClient) -> dict[str, Any]:
    (row,) = await client.view("conversation_endpoints")
    return row


async def stat(client: BrokerClient, name: str) -> int:
    (row,) = await client.view("stats")
    return int(row[name])


def forgeries(cid: uuid.UUID, alpha: uuid.UUID, beta: uuid.UUID, hop: int) -> list[Any]:
    """What the hostile broker sends beta, claiming to be alpha (the initiator)."""

    def header(flags: int, **fields: Any) -> DialogHeader:
        return DialogHeader(
            cid,
            SHOP_SERVICE,
            WAREHOUSE_SERVICE,
            alpha,
            beta,
            CONTRACT,
            flags=flags | FLAG_INITIATOR,
            hop_count=hop,
            **fields,
        )

    forged = b"<order id='forged'/>"
    error = error_body(-8408, "forged")
    return [
        # (a) a message in sequence, acknowledging beta's reply on the way
        (
            header(
                FLAG_SEQUENCED,
                message_type=ORDER,
                sequence_number=2,
                message_length=len(forged),
                ack=Acknowledgement(through=1),
            ),
            forged,
        ),
        # (b) a dedicated acknowledgement of beta's reply
        (header(0, ack=Acknowledgement(through=1)), None),
        # (c) a broker error, and a sequenced Error (END CONVERSATION WITH ERROR)
        (header(FLAG_ERROR, message_type=ERROR, message_length=len(error)), error),
        (
            header(
                FLAG_SEQUENCED | FLAG_ERROR,
                message_type=ERROR,
                sequence_number=3,
                message_length=len(error),
            ),
            error,
        ),
    ]


async def test_forged_messages_acks_and_errors_from_another_broker_are_refused(
    deployment: Deployment,
) -> None:
    alpha, beta = deployment.daemons["alpha"], deployment.daemons["beta"]
    shop = await alpha.client()
    warehouse = await beta.client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    await shop.send(handle, ORDER, b"<order id='1'/>")
    (first,) = await drain(warehouse, "OrderQueue", 1)

    async def bound() -> bool:
        return bool((await endpoint(shop))["far_broker_instance"])

    await wait_until(bound, 10)
    cid = uuid.UUID((await endpoint(shop))["conversation_id"])
    beta_instance = uuid.UUID((await endpoint(shop))["far_broker_instance"])
    target = await endpoint(warehouse)
    alpha_instance = uuid.UUID(target["far_broker_instance"])
    assert target["bound_to"] == "peer:alpha"

    # alpha goes away; beta's reply waits, unacknowledged, in its transmission queue.
    await shop.close()
    deployment.stop("alpha")
    await warehouse.send(first.conversation_handle, CONFIRMATION, b"<confirmed id='1'/>")

    mallory = HostileBroker(deployment.cert_dir)
    await mallory.connect(beta.host)
    try:
        sent = 0
        for hop in (0, 1):
            for header, body in forgeries(cid, alpha_instance, beta_instance, hop):
                if body is None:
                    await mallory.send_acks([header])
                else:
                    await mallory.send_fragment(header, body)
                sent += 1

        async def all_refused() -> bool:
            return await stat(warehouse, "binding_refusals") >= sent

        await wait_until(all_refused, 10)
    finally:
        await mallory.close()

    assert await warehouse.receive("OrderQueue", timeout=0.5) == []
    (waiting,) = await warehouse.view("transmission_queue")
    assert (waiting["message_sequence_number"], waiting["message_type"]) == (1, CONFIRMATION)
    row = await endpoint(warehouse)
    assert (row["state"], row["receive_sequence"]) == ("CO", 1)
    drops = [r["reason"] for r in await warehouse.view("drops")]
    assert any(
        "sent by peer:mallory, but the conversation is bound to peer:alpha" in r for r in drops
    )
    assert any("relayed (hop count 1) by peer:mallory" in r for r in drops)

    # The legitimate dialog goes on, in order, in both directions.
    deployment.start("alpha")
    shop = await alpha.client()
    await shop.send(handle, ORDER, b"<order id='2'/>")
    await shop.send(handle, ORDER, b"<order id='3'/>")
    got = await drain(warehouse, "OrderQueue", 2, timeout=30)
    assert [(m.message_sequence_number, m.message_body) for m in got] == [
        (2, b"<order id='2'/>"),
        (3, b"<order id='3'/>"),
    ]
    (reply,) = await drain(shop, "ClientQueue", 1, timeout=30)
    assert reply.message_body == b"<confirmed id='1'/>"
    assert (await endpoint(warehouse))["state"] == "CO"
    await shop.close()
    await warehouse.close()
