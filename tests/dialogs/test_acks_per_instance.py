"""Dedicated acknowledgements waiting on one connection are merged per endpoint, never
across broker instances, with a real daemon on 127.0.17.21:4022 and a hostile peer of the
deployment's CA (``tests.hostile``).

SPEC ids: R-DLG-5 (every received message is acknowledged; one acknowledgement may cover
several fragments of one endpoint), R-ROUTE-3 (an acknowledgement names the broker
instance that answers, and the one it answers), R-ROUTE-12 (a message naming a broker
instance is delivered to the database with that identifier), R-DLG-14 (a sender accepts
an acknowledgement only from the far broker instance its endpoint is bound to).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

from brokerd.tools.launcher import Deployment
from protocol import dialog, events
from protocol.dialog import FLAG_INITIATOR, FLAG_SEQUENCED, DialogHeader
from tests.daemons import FAST_RETRY, running
from tests.hostile import HostileBroker
from tests.routing.deploy import database

HOST = "127.0.17.21"
ORDERS = "//acks/Orders"
SHOP = "//acks/Shop"
EAST = uuid.UUID("3f1d2c4b-5a6e-4f70-8a9b-0c1d2e3f4a51")
WEST = uuid.UUID("3f1d2c4b-5a6e-4f70-8a9b-0c1d2e3f4a52")
ACK_DELAY = 0.3
"""Long enough that both databases' acknowledgements leave in one batch."""


def first_message(cid: uuid.UUID, sender: uuid.UUID, target: uuid.UUID) -> DialogHeader:
    """Message 1 of dialog ``cid`` from broker instance ``sender`` to ``ORDERS`` at the
    broker instance ``target``."""
    body = b"<order/>"
    return DialogHeader(
        cid,
        SHOP,
        ORDERS,
        sender,
        target,
        flags=FLAG_SEQUENCED | FLAG_INITIATOR,
        sequence_number=1,
        message_length=len(body),
    )


async def acknowledgements(
    mallory: HostileBroker, wanted: int, timeout: float
) -> list[DialogHeader]:
    """The acknowledgements the daemon sends until ``wanted`` came or ``timeout`` passed."""
    assert mallory.reader is not None
    got: list[DialogHeader] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(got) < wanted and loop.time() < deadline:
        with contextlib.suppress(TimeoutError):
            data = await asyncio.wait_for(mallory.reader.read(65536), 0.1)
            if not data:
                break
            for event in mallory.conn.receive_data(data):
                if isinstance(event, events.Ack):
                    got += dialog.decode_acks(event.payload)
    return got


async def test_acknowledgements_of_one_dialog_for_two_broker_instances_are_both_sent(
    tmp_path: Path,
) -> None:
    """R-DLG-5, R-ROUTE-3: one daemon holds two broker instances of one service (two
    databases), and one peer connection carries a dialog's first message from broker
    instance I1 to one of them and a first message of the same conversation id from
    broker instance I2 to the other. Each database acknowledges its own endpoint; both
    acknowledgements wait in the connection's batch at once, and each must leave,
    named by the instance that sends it and the instance it is for: merging one into
    the other (they share the conversation id and direction) loses it, and its sender,
    which accepts an acknowledgement only from its bound far broker instance (R-DLG-14),
    retransmits for ever while the other dialog is acknowledged in the same batches."""
    d = Deployment(tmp_path, {**FAST_RETRY, "ack_delay": ACK_DELAY})
    d.add(
        "orders",
        HOST,
        database("East", [ORDERS], broker_instance=EAST)
        + database("West", [ORDERS], broker_instance=WEST),
    )
    with running(d):
        mallory = HostileBroker(d.cert_dir)
        await mallory.connect(HOST)
        try:
            cid = uuid.uuid4()
            one, two = uuid.uuid4(), uuid.uuid4()
            await mallory.send_fragments(
                [
                    (first_message(cid, one, EAST), b"<order/>"),
                    (first_message(cid, two, WEST), b"<order/>"),
                ]
            )
            got = await acknowledgements(mallory, 2, timeout=5.0)
            answered = {(h.from_broker_instance, h.to_broker_instance) for h in got}
            assert answered == {(EAST, one), (WEST, two)}, got
            assert all(h.conversation_id == cid and h.ack.through == 1 for h in got), got
        finally:
            await mallory.close()
