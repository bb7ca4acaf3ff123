"""What an authenticated but hostile (or faulty) adjacent broker can make a daemon hold
with the fragments of messages of several (R-DLG-7, R-DLG-5): fragments of one message
that disagree on its length, messages cut into fragments below the least fragment size
a sender cuts at, and more partial messages than ``limits.partial_messages``. Each is
refused, not stored nor acknowledged, counted and named in the ``drops`` view; nothing
already acknowledged is lost, and the message sent as a sender sends it is delivered
once, exact (R-DLG-1). Real daemon over TCP, on its own loopback address, a hostile
peer."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from brokerd.sdk.client import BrokerClient
from brokerd.tools import example
from brokerd.tools.launcher import Deployment
from protocol.dialog import DialogHeader
from protocol.fragments import MIN_FRAGMENT_SIZE
from tests.daemons import FAST_RETRY, assert_exactly_once_in_order, drain, wait_until
from tests.hostile import HostileBroker, cut, order_message

HOSTS = ("127.0.51.1", "127.0.51.2")
"""The shop's and the warehouse's addresses (only the warehouse runs: the hostile peer
speaks for the shop)."""


def _order(seq: int, length: int) -> bytes:
    head = f"<order>{seq}:".encode()
    tail = b"</order>"
    filler = bytes(48 + (i * 7 + seq) % 10 for i in range(length - len(head) - len(tail)))
    return head + filler + tail


def _warehouse(tmp_path: Path, extra: str = "") -> Deployment:
    d = example.shop_and_warehouse(tmp_path, FAST_RETRY, hosts=HOSTS, extra=extra)
    d.start("beta")
    return d


async def _stats(warehouse: BrokerClient) -> dict[str, Any]:
    (stats,) = await warehouse.view("stats")
    return stats


async def _received(warehouse: BrokerClient, n: int) -> None:
    async def check() -> bool:
        return bool((await _stats(warehouse))["fragments_received"] >= n)

    await wait_until(check, 10)


async def _drops(warehouse: BrokerClient) -> list[str]:
    return [str(r["reason"]) for r in await warehouse.view("drops")]


async def test_fragments_that_claim_another_length_than_the_held_ones_are_refused(
    tmp_path: Path,
) -> None:
    """R-DLG-7, R-DLG-5: a message of 2,500 bytes cut at 1,024 bytes is three fragments.
    The peer sends the first; the warehouse holds it (acknowledged) and is restarted
    (what it holds is read back from its file). Then the peer sends the other two as
    fragments of a message of 3,000 bytes: each is a fragment of one cut at 1,024 bytes
    of the length it claims, but not of the message held. They are refused (not stored,
    not acknowledged, counted, the drop names both lengths), and the message sent as a
    sender cuts it is delivered once, exact, of the length its first fragment said."""
    d = _warehouse(tmp_path)
    instance, cid = uuid.uuid4(), uuid.uuid4()
    body = _order(1, 2500)
    header, _ = order_message(instance, cid, 1, body)
    honest = cut(header, body, 1024)
    forged_body = body[:2048] + _order(2, 952)
    forged = cut(header._replace(message_length=3000), forged_body, 1024)
    assert [h.fragment_count for h, _ in forged] == [3, 3, 3]
    peer = HostileBroker(d.cert_dir, "alpha")
    try:
        warehouse = await d.daemons["beta"].client()
        await peer.connect(d.daemons["beta"].host)
        await peer.send_fragments([honest[0]])
        await _received(warehouse, 1)

        async def held() -> bool:
            rows = await warehouse.queue_messages("OrderQueue")
            return [(r.status, r.size) for r in rows] == [(2, 2500)]

        await wait_until(held, 10)
        await warehouse.close()
        await peer.close()
        d.stop("beta")
        d.start("beta")
        warehouse = await d.daemons["beta"].client()
        peer = HostileBroker(d.cert_dir, "alpha")
        await peer.connect(d.daemons["beta"].host)
        refused = (await _stats(warehouse)).get("fragments_refused", 0)
        await peer.send_fragments(forged[1:])
        await _received(warehouse, 2)
        drops = await _drops(warehouse)
        assert any("3000" in r and "2500" in r for r in drops), drops
        assert [(r.status, r.size) for r in await warehouse.queue_messages("OrderQueue")] == [
            (2, 2500)
        ]
        stats = await _stats(warehouse)
        assert stats["fragments_refused"] == refused + 2, stats
        await peer.send_fragments(honest)
        got = await drain(warehouse, "OrderQueue", 1, timeout=30)
        assert [m.message_body for m in got] == [body]
        assert await warehouse.receive("OrderQueue", timeout=0.3) == []
        await warehouse.close()
    finally:
        await peer.close()
        d.stop_all()


async def test_a_message_cut_below_the_least_fragment_size_is_refused(tmp_path: Path) -> None:
    """R-DLG-7: every fragment but the last of a message of several carries at least
    ``MIN_FRAGMENT_SIZE`` bytes (the least ``limits.fragment_size`` a sender cuts at),
    so a message is at most one fragment (one stored row) per that many bytes. A peer
    that sends a message of 3,000 bytes as 30 fragments of 100 bytes has none of them
    taken: no endpoint, no row, nothing acknowledged; each refusal is counted and names
    the bound. The same message cut at the least size is delivered once, exact."""
    d = _warehouse(tmp_path)
    instance, cid = uuid.uuid4(), uuid.uuid4()
    body = _order(1, 3000)
    header, _ = order_message(instance, cid, 1, body)
    tiny = cut(header, body, 100)
    assert len(tiny) == 30
    peer = HostileBroker(d.cert_dir, "alpha")
    try:
        warehouse = await d.daemons["beta"].client()
        await peer.connect(d.daemons["beta"].host)
        await peer.send_fragments(tiny)
        await _received(warehouse, 30)
        assert [e for e in await warehouse.view("conversation_endpoints")] == []
        assert await warehouse.queue_messages("OrderQueue") == []
        stats = await _stats(warehouse)
        assert stats["fragments_refused"] == 30, stats
        drops = await _drops(warehouse)
        assert any(str(MIN_FRAGMENT_SIZE) in r for r in drops), drops
        await peer.send_fragments(cut(header, body, MIN_FRAGMENT_SIZE))
        got = await drain(warehouse, "OrderQueue", 1, timeout=30)
        assert [m.message_body for m in got] == [body]
        await warehouse.close()
    finally:
        await peer.close()
        d.stop_all()


async def test_partial_messages_beyond_the_limit_wait_for_their_sender(tmp_path: Path) -> None:
    """R-DLG-7, R-DLG-5: with ``limits.partial_messages = 2`` the warehouse holds at most
    two messages of several whose fragments have not all arrived. A peer sends the first
    fragment of three such messages (three dialogs): the third is refused (not stored,
    not acknowledged, counted in ``partial_refusals``, the drop names the limit). After a
    restart the two held are counted again from the file and a fourth is refused too.
    Once one held message completes, the others' first fragments, sent again as a
    sender retransmits, are taken, and every message is delivered once, exact."""
    d = _warehouse(tmp_path, extra="[limits]\npartial_messages = 2\n")
    instance = uuid.uuid4()
    cids = [uuid.uuid4() for _ in range(4)]
    bodies = [_order(n, 2500) for n in range(4)]
    messages: list[list[tuple[DialogHeader, bytes]]] = []
    for cid, body in zip(cids, bodies, strict=True):
        header, _ = order_message(instance, cid, 1, body)
        messages.append(cut(header, body, 1024))
    peer = HostileBroker(d.cert_dir, "alpha")
    try:
        warehouse = await d.daemons["beta"].client()
        await peer.connect(d.daemons["beta"].host)
        await peer.send_fragments([m[0] for m in messages[:3]])
        await _received(warehouse, 3)

        async def held(n: int) -> bool:
            rows = await warehouse.queue_messages("OrderQueue")
            return len(rows) == n and all(r.status == 2 for r in rows)

        await wait_until(lambda: held(2), 10)
        stats = await _stats(warehouse)
        assert stats["partial_refusals"] == 1, stats
        assert len(await warehouse.view("conversation_endpoints")) == 2
        drops = await _drops(warehouse)
        assert any("limits.partial_messages" in r for r in drops), drops

        await warehouse.close()
        await peer.close()
        d.stop("beta")
        d.start("beta")
        warehouse = await d.daemons["beta"].client()
        peer = HostileBroker(d.cert_dir, "alpha")
        await peer.connect(d.daemons["beta"].host)
        await peer.send_fragments([messages[3][0]])
        await _received(warehouse, 1)
        stats = await _stats(warehouse)
        assert stats["partial_refusals"] == 1, stats
        assert await held(2)

        # Every message is sent whole, as its sender retransmits what it has no
        # acknowledgement of: the held ones complete first, and the others follow.
        await peer.send_fragments([f for m in messages for f in m])
        got = await drain(warehouse, "OrderQueue", 4, timeout=30)
        assert sorted(m.message_body for m in got) == sorted(bodies)
        assert_exactly_once_in_order(got)
        assert await warehouse.receive("OrderQueue", timeout=0.3) == []
        await warehouse.close()
    finally:
        await peer.close()
        d.stop_all()
