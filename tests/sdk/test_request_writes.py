"""The SDK writes the requests of one turn of the event loop together: a pipelined
producer's SENDs reach the daemon in the order they were made, each answered on its own,
and a close still delivers the requests already made. SPEC R-DLG-1 (exactly once, in
order) and §6 (a SEND returns after its message is durably queued)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from brokerd.sdk.connection import SequenceReply
from brokerd.tools.example import CONTRACT, ORDER, SHOP_SERVICE, WAREHOUSE_SERVICE
from brokerd.tools.launcher import Deployment
from protocol.client_wire import ClientFrame, ClientFrameKind, ClientFrameReader, encode_frame
from protocol.errors import ClientError, ConversationNotFound, RemoteProtocolError
from tests.sdk.orders import ready_count


async def test_pipelined_sends_keep_their_order_and_each_gets_its_sequence_number(
    deployment: Deployment,
) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    bodies = [f"<order n='{n}'/>".encode() for n in range(600)]
    seqs = await asyncio.gather(*(shop.send(handle, ORDER, body) for body in bodies))
    assert seqs == list(range(seqs[0], seqs[0] + 600))
    received: list[bytes] = []
    while len(received) < 600:
        batch = await warehouse.receive("OrderQueue", top=1000, timeout=2.0)
        assert batch, f"only {len(received)} of 600 received"
        received += [m.message_body for m in batch]
    assert received == bodies


async def test_a_request_made_before_close_reaches_the_daemon(deployment: Deployment) -> None:
    """The request is written when the client closes, not dropped with the turn's writes:
    its caller learns nothing (the call fails), as when the connection closes under it."""
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    send = asyncio.create_task(shop.send(handle, ORDER, b"<order n='last'/>"))
    await asyncio.sleep(0)  # the SEND is made and waits for its reply
    await shop.close()
    with pytest.raises(ClientError):
        await send
    for _ in range(100):
        if await ready_count(warehouse) == 1:
            break
        await asyncio.sleep(0.1)
    (message,) = await warehouse.receive("OrderQueue", top=10, timeout=2.0)
    assert message.message_body == b"<order n='last'/>"


async def test_send_nowait_futures_give_sequence_numbers_in_order_and_typed_errors(
    deployment: Deployment,
) -> None:
    """``send_nowait`` writes the request with the others of the turn and returns a future:
    the sequence number once the message is durably queued, or the typed error; with the
    connection closed it raises at once."""
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    futures = [shop.send_nowait(handle, ORDER, f"<order n='{n}'/>".encode()) for n in range(300)]
    unknown = shop.send_nowait(uuid.uuid4(), ORDER, b"<order/>")
    futures += [shop.send_nowait(handle, ORDER, b"<order n='last'/>")]
    seqs = await asyncio.gather(*futures)
    assert seqs == list(range(seqs[0], seqs[0] + 301))
    with pytest.raises(ConversationNotFound):
        await unknown
    received = []
    while len(received) < 301:
        batch = await warehouse.receive("OrderQueue", top=1000, timeout=2.0)
        assert batch, f"only {len(received)} of 301 received"
        received += batch
    assert [m.message_sequence_number for m in received] == seqs
    assert received[-1].message_body == b"<order n='last'/>"
    await shop.close()
    with pytest.raises(ClientError):
        shop.send_nowait(handle, ORDER, b"<order/>")


@pytest.mark.parametrize("meta", [{}, {"sequence_number": "5"}, {"sequence_number": None}])
async def test_a_send_reply_without_a_sequence_number_fails_its_future_only(
    meta: dict[str, object],
) -> None:
    """Bad input from the daemon: the reply, read from its bytes, fails that SEND's future
    with a clear error instead of raising into the reader (which would leave the future,
    and every reply after it in the same read, unanswered)."""
    good, bad = (asyncio.get_running_loop().create_future() for _ in range(2))
    frames = ClientFrameReader().feed(
        encode_frame(ClientFrame(ClientFrameKind.RESPONSE, 1, meta, b""))
        + encode_frame(ClientFrame(ClientFrameKind.RESPONSE, 2, {"sequence_number": 9}, b""))
    )
    SequenceReply(bad).set_result(frames[0])
    SequenceReply(good).set_result(frames[1])
    with pytest.raises(RemoteProtocolError, match="no sequence number"):
        await bad
    assert await good == 9
