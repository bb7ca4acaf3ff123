"""A message cut again at another fragment size (R-DLG-7): a sender restarted with
another ``limits.fragment_size``, or a mirror configured with another, resends a message
the receiver holds part of, cut differently. The receiver drops the fragments it holds
of that cut (from memory and from the file), takes the message as it is cut now, and
delivers the exact body once, in order (R-DLG-1); the sender takes each acknowledgement's
fragments as all the receiver holds. Real daemons over TCP: a hostile peer that sends
exact cuts, and a real sender restarted with another fragment size behind the fault
proxy."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from brokerd.tools import example
from brokerd.tools.faultproxy import FaultPlan
from brokerd.tools.launcher import Deployment
from protocol.dialog import DialogHeader
from tests.daemons import (
    FAST_RETRY,
    PROXY_HOST,
    assert_exactly_once_in_order,
    drain,
    proxied,
    wait_until,
)
from tests.dialogs.run_checks import validating_warehouse
from tests.hostile import HostileBroker, cut, order_message

SHOP, WAREHOUSE = example.SHOP_SERVICE, example.WAREHOUSE_SERVICE


def _order(seq: int, length: int) -> bytes:
    """An order of ``length`` bytes whose every byte tells where it is."""
    head = f"<order>{seq}:".encode()
    tail = b"</order>"
    filler = bytes(48 + (i * 7 + seq) % 10 for i in range(length - len(head) - len(tail)))
    return head + filler + tail


async def test_held_fragments_of_another_cut_give_way_to_the_message_as_cut_now(
    tmp_path: Path,
) -> None:
    """A hostile peer holds part of three messages of one dialog at one cut, then sends
    them at another:

    - message 1: its second fragment of two is held, then the message comes whole. The
      held row must not swallow the whole message (a message lost, acknowledged);
    - message 2: its first fragment of two is held, then the message comes whole. By
      index alone the whole message is a duplicate of that fragment, forever;
    - message 3: two fragments of four are held, the receiver restarts (what it holds
      is read back from the file, with the size it was cut at), then the message comes
      in two fragments whose indexes are those held.

    Each is delivered once, in order, with its exact bytes."""
    d = example.shop_and_warehouse(tmp_path, FAST_RETRY)
    d.start("beta")
    instance, cid = uuid.uuid4(), uuid.uuid4()
    bodies = {1: _order(1, 6000), 2: _order(2, 6000), 3: _order(3, 10_000)}

    def message(seq: int, size: int) -> list[tuple[DialogHeader, bytes]]:
        header, body = order_message(instance, cid, seq, bodies[seq])
        return cut(header, body, size)

    peer = HostileBroker(d.cert_dir, "alpha")
    try:
        warehouse = await d.daemons["beta"].client()
        await peer.connect(d.daemons["beta"].host)
        one, two, three = message(1, 3000), message(2, 3000), message(3, 2500)
        await peer.send_fragments([one[1], two[0], three[0], three[2]])

        async def fragments(n: int) -> bool:
            (stats,) = await warehouse.view("stats")
            return bool(stats["fragments_received"] == n)

        await wait_until(lambda: fragments(4), 10)
        await peer.send_fragments([*message(1, 65536), *message(2, 65536)])
        got = await drain(warehouse, "OrderQueue", 2, timeout=30)
        assert [m.message_body for m in got] == [bodies[1], bodies[2]]
        (stats,) = await warehouse.view("stats")
        assert stats["recut_messages"] == 2, stats
        assert stats["duplicates"] == 0, stats
        await warehouse.close()
        await peer.close()

        d.stop("beta")
        d.start("beta")
        warehouse = await d.daemons["beta"].client()
        peer = HostileBroker(d.cert_dir, "alpha")
        await peer.connect(d.daemons["beta"].host)
        await peer.send_fragments(message(3, 5000))
        got += await drain(warehouse, "OrderQueue", 1, timeout=30)
        assert [m.message_body for m in got] == [bodies[1], bodies[2], bodies[3]]
        assert_exactly_once_in_order(got)
        (stats,) = await warehouse.view("stats")
        assert stats["recut_messages"] == 1, stats
        assert stats["duplicates"] == 0, stats
        assert await warehouse.receive("OrderQueue", timeout=0.3) == []
        await warehouse.close()
    finally:
        await peer.close()
        d.stop_all()


async def test_a_message_cut_again_while_its_whole_body_is_checked(tmp_path: Path) -> None:
    """The warehouse validates orders as XML, so the last fragment of an order of several
    waits for a check of the whole body before it is taken (R-OBJ-1). The first half of
    an order is held; one read brings the second half (its check starts) and then the
    first fragment of the same order cut at another size. The check's half is of the
    cut that was dropped: it is not taken into the new one, and the order is queued
    once, exact, when the new cut's last fragment comes."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("beta", "127.0.0.2", validating_warehouse("127.0.0.1"))
    d.start("beta")
    instance, cid = uuid.uuid4(), uuid.uuid4()
    header, body = order_message(instance, cid, 1, _order(1, 6000))
    old, new = cut(header, body, 3000), cut(header, body, 4000)
    peer = HostileBroker(d.cert_dir, "alpha")
    try:
        warehouse = await d.daemons["beta"].client()
        await peer.connect(d.daemons["beta"].host)
        await peer.send_fragments([old[0]])

        async def fragments(n: int) -> bool:
            (stats,) = await warehouse.view("stats")
            return bool(stats["fragments_received"] == n)

        await wait_until(lambda: fragments(1), 10)
        await peer.send_fragments([old[1], new[0]])
        await wait_until(lambda: fragments(3), 10)
        await asyncio.sleep(0.3)  # the check of old[1] has committed
        await peer.send_fragments([new[1]])
        got = await drain(warehouse, "OrderQueue", 1, timeout=30)
        assert [m.message_body for m in got] == [body]
        (stats,) = await warehouse.view("stats")
        assert stats["recut_messages"] == 1, stats
        drops = [r["reason"] for r in await warehouse.view("drops")]
        assert any("cut again while it was checked" in r for r in drops), drops
        assert await warehouse.receive("OrderQueue", timeout=0.3) == []
        await warehouse.close()
    finally:
        await peer.close()
        d.stop_all()


@pytest.mark.parametrize("held", [1, 2])
async def test_a_sender_restarted_with_another_fragment_size_completes_a_held_message(
    tmp_path: Path, held: int
) -> None:
    """The shop's broker sends a message of 20,000 bytes cut at 4 KiB (five fragments,
    one a frame); the fault proxy lets only the first ``held`` frames through, so the
    warehouse holds that many of five. The shop's broker restarts with a fragment size
    of 16 KiB and sends the message again in two fragments (the proxy still drops
    them); then the warehouse's reply brings it an acknowledgement of the old cut (the
    warehouse sends on the dialog it holds part of). Fragments of the new cut bear the
    same indexes, but the sender must not take them as held:

    - ``held`` 1: the reply names fragment 0; the warehouse later drops it for the new
      cut's fragment 1 and says it holds only that, so fragment 0 must be sent again
      (each acknowledgement tells all the receiver holds);
    - ``held`` 2: the reply names both fragments of the new cut, which cannot be true of
      a message not acknowledged whole: both must be sent.

    The message then arrives once, whole and exact, and the transmission queue empties."""
    d = example.shop_and_warehouse(
        tmp_path,
        FAST_RETRY,
        beta_route_host=PROXY_HOST,
        extra="[limits]\nfragment_size = 4096\n",
        endpoint_extra="fragments_per_frame = 1",
    )
    body = _order(1, 20_000)
    plan = FaultPlan(drop_fragments=set(range(held + 1, 100_000)))
    async with proxied(d, plan) as proxy:
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        handle = await shop.begin_dialog(SHOP, WAREHOUSE, example.CONTRACT)
        await shop.send(handle, example.ORDER, body)

        async def holds() -> bool:
            (stats,) = await warehouse.view("stats")
            return bool(stats["fragments_received"] == held and proxy.stats.fragments_dropped)

        await wait_until(holds, 20)
        await shop.close()
        d.kill("alpha")
        alpha = d.daemons["alpha"]
        alpha.config_path.write_text(
            alpha.config_path.read_text().replace("fragment_size = 4096", "fragment_size = 16384")
        )
        dropped = proxy.stats.fragments_dropped
        d.start("alpha")

        async def resent() -> bool:  # the new cut's two fragments, from the restarted sender
            return proxy.stats.fragments_dropped >= dropped + 2

        await wait_until(resent, 20)
        (target,) = await warehouse.view("conversation_endpoints")
        reply = b"<confirmation>held</confirmation>"
        await warehouse.send(uuid.UUID(target["conversation_handle"]), example.CONFIRMATION, reply)
        shop = await d.daemons["alpha"].client()
        assert [m.message_body for m in await drain(shop, "ClientQueue", 1)] == [reply]
        plan.drop_fragments.clear()
        got = await drain(warehouse, "OrderQueue", 1, timeout=30)
        assert [m.message_body for m in got] == [body]
        (stats,) = await warehouse.view("stats")
        assert stats["recut_messages"] == 1, stats

        async def acknowledged() -> bool:
            return not await shop.view("transmission_queue")

        await wait_until(acknowledged, 20)
        assert await warehouse.receive("OrderQueue", timeout=0.3) == []
        await shop.close()
        await warehouse.close()
