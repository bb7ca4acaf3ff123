"""Fragments whose extents are not those of one cut of their message (R-DLG-7): every
fragment of a message of several names its index, the fragment count, its offset and the
message's length, and a sender cuts a message at one size, so the fragments of a message
tile it exactly. A fragment that does not fit that cut cannot be part of the message: it
is not stored nor acknowledged (R-DLG-5), and the message the receiver delivers is the
one its sender cut, exact, once (R-DLG-1). Real daemon over TCP, a hostile peer."""

from __future__ import annotations

import uuid
from pathlib import Path

from brokerd.tools import example
from tests.daemons import FAST_RETRY, drain, wait_until
from tests.hostile import HostileBroker, cut, order_message


def _order(length: int) -> bytes:
    head, tail = b"<order>", b"</order>"
    return head + bytes(48 + i % 10 for i in range(length - len(head) - len(tail))) + tail


async def test_fragments_that_do_not_tile_their_message_are_not_joined(
    tmp_path: Path,
) -> None:
    """R-DLG-7, R-DLG-1, R-DLG-5: a peer sends a message of 10,000 bytes as three
    fragments cut at 1,024 bytes (by their offsets), the second and third carrying the
    rest of the message each (8,976 and 7,952 bytes): every offset and length is within
    the message, but joined they make 18,000 bytes. Then it sends the message cut at
    2,500 bytes as a sender does. The receiver delivers the 10,000 bytes sent, once:
    never a body longer than the message it claims to be (nor longer than any size
    bound)."""
    d = example.shop_and_warehouse(tmp_path, FAST_RETRY)
    d.start("beta")
    instance, cid = uuid.uuid4(), uuid.uuid4()
    body = _order(10_000)
    header, _ = order_message(instance, cid, 1, body)
    forged = [
        (
            header._replace(
                fragment_index=i,
                fragment_count=3,
                fragment_offset=i * 1024,
                message_length=len(body),
            ),
            body[i * 1024 :] if i else body[:1024],
        )
        for i in range(3)
    ]
    peer = HostileBroker(d.cert_dir, "alpha")
    try:
        warehouse = await d.daemons["beta"].client()
        await peer.connect(d.daemons["beta"].host)
        await peer.send_fragments(forged)

        async def fragments(n: int) -> bool:
            (stats,) = await warehouse.view("stats")
            return bool(stats["fragments_received"] >= n)

        await wait_until(lambda: fragments(3), 10)
        # nothing of them was kept: not even an endpoint for the conversation they began
        endpoints = await warehouse.view("conversation_endpoints")
        assert [e for e in endpoints if e["conversation_id"] == str(cid)] == []
        await peer.send_fragments(cut(header, body, 2500))
        await wait_until(lambda: fragments(7), 10)
        got = await drain(warehouse, "OrderQueue", 1, timeout=30)
        assert [len(m.message_body) for m in got] == [len(body)]
        assert [m.message_body for m in got] == [body]
        assert await warehouse.receive("OrderQueue", timeout=0.3) == []
        await warehouse.close()
    finally:
        await peer.close()
        d.stop_all()
