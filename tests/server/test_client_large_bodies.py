"""A large body the client listener reads in place, against a client that lies about it.

SPEC §7 (the client wire) and the brief's bad-input rule: a logged-in client may announce
a body of up to ``limits.max_message_size`` and send only part of it. The listener reads
such a body into a buffer of its own as it arrives (``ClientFrameReader.get_buffer``);
the buffer is not zeroed first (``protocol.buffers.blank``), so its pages cost memory
only as bytes arrive: twenty connections each announcing 90 MiB and sending 256 KiB of it
leave the daemon's RSS far below what they announce, a connection that closes mid-body
loses nothing of anyone else's, and delivery goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.system import memory_mb
from brokerd.sdk.client import BrokerClient
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from protocol.client_wire import (
    CLIENT_FRAME_HEADER,
    CLIENT_WIRE_VERSION,
    ClientFrameKind,
    encode_meta,
)
from tests.daemons import FAST_RETRY, running

ANNOUNCED = 90 * 1024 * 1024
SENT = 256 * 1024
LIARS = 20


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running(shop_and_warehouse(tmp_path, FAST_RETRY)) as d:
        yield d


def _announce(handle: str) -> bytes:
    """A SEND frame's header and meta announcing :data:`ANNOUNCED` body bytes."""
    meta = encode_meta({"op": "send", "conversation_handle": handle, "message_type": ORDER})
    header = CLIENT_FRAME_HEADER.build(
        {
            "version": CLIENT_WIRE_VERSION,
            "kind": int(ClientFrameKind.REQUEST),
            "request_id": 1_000_000,
            "meta_length": len(meta),
            "body_length": ANNOUNCED,
        }
    )
    return header + meta


def _write_raw(client: BrokerClient, data: bytes) -> None:
    """Bytes on the client's own logged-in socket, past the SDK's framing."""
    connection = client._keeper.connection
    assert connection is not None and connection.transport is not None
    connection.transport.write(data)


async def test_bodies_announced_and_not_sent_cost_only_what_arrived(
    deployment: Deployment,
) -> None:
    alpha = deployment.daemons["alpha"]
    assert alpha.process is not None
    shop = await alpha.client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    before = memory_mb(alpha.process.pid, "VmRSS")

    liars = [await alpha.client(reconnect=False) for _ in range(LIARS)]
    for liar in liars:
        _write_raw(liar, _announce(str(handle)) + b"x" * SENT)
    await asyncio.sleep(1.0)
    held = memory_mb(alpha.process.pid, "VmRSS") - before
    assert held < 100, f"{LIARS} connections announcing {ANNOUNCED >> 20} MiB each: +{held} MB"

    # Delivery goes on beside them, large bodies included, and after they go.
    body = b"<o>" + b"y" * (2 * 1024 * 1024) + b"</o>"
    await shop.send(handle, ORDER, body)
    for liar in liars:
        await liar.close()
    await shop.send(handle, ORDER, b"<o/>")
    warehouse = await deployment.daemons["beta"].client()
    got = []
    while len(got) < 2:
        batch = await warehouse.receive("OrderQueue", top=2, timeout=10)
        assert batch, "the SENDs beside the liars were not delivered"
        got += batch
    assert [m.message_body for m in got] == [body, b"<o/>"]
    await shop.close()
    await warehouse.close()
