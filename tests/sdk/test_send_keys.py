"""A SEND with an idempotency key is committed once, however often it is sent (SPEC §6,
R-DLG-1). Real daemons: the shop on 127.0.0.1:4022 sends to the warehouse on
127.0.0.2:4022.

* Sent twice on a live daemon, and again after a restart: one message, one number.
* The shop's daemon is killed (SIGKILL) while SENDs are pipelined: the ones in flight
  fail with ``OutcomeUnknown``. After the restart the application sends every SEND
  that has no number again, in order, with the same keys, on a new connection: the
  ones the killed daemon had committed get their first number back and are not
  queued again; the others are sent now. Every message arrives exactly once, in
  order.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from protocol.errors import ClientError, InvalidRequest, OutcomeUnknown
from tests.daemons import FAST_RETRY, drain, running


async def test_a_key_sent_again_gets_its_first_number_and_is_queued_once(tmp_path: Path) -> None:
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    with running(d):
        shop = await d.daemons["alpha"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        first = await shop.send(handle, ORDER, b"order 1", key="order-1")
        # Twice in one turn (the second waits for the first's commit), then again.
        again = await asyncio.gather(
            shop.send_nowait(handle, ORDER, b"order 1", key="order-1"),
            shop.send_nowait(handle, ORDER, b"order 2", key="order-2"),
            shop.send_nowait(handle, ORDER, b"order 2", key="order-2"),
        )
        assert again == [first, first + 1, first + 1]
        assert await shop.send_many(
            [(handle, ORDER, b"order 2"), (handle, ORDER, b"order 3")], ["order-2", "order-3"]
        ) == [first + 1, first + 2]
        await shop.close()

        d.stop("alpha")
        d.start("alpha")
        shop = await d.daemons["alpha"].client()
        assert await shop.send(handle, ORDER, b"order 3", key="order-3") == first + 2
        assert await shop.send(handle, ORDER, b"order 4", key="order-4") == first + 3
        warehouse = await d.daemons["beta"].client()
        received = await drain(warehouse, "OrderQueue", 4, timeout=30)
        assert [m.message_body for m in received] == [b"order %d" % n for n in range(1, 5)]
        assert await warehouse.receive("OrderQueue", timeout=1.0) == []
        try:
            await shop.send(handle, ORDER, b"x", key="")
        except InvalidRequest as exc:
            assert "key" in str(exc)
        else:
            raise AssertionError("an empty key is refused")
        await shop.close()
        await warehouse.close()


async def test_sends_retried_by_key_after_a_kill_arrive_exactly_once(tmp_path: Path) -> None:
    """The application's own retry: a client that does not reconnect sees each SEND in
    flight at the kill fail with OutcomeUnknown, and sends those again by key on a new
    connection. (A reconnecting client does it by itself: ``test_reconnect.py``.)"""
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    with running(d):
        shop = await d.daemons["alpha"].client(reconnect=False)
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        total = 3000
        bodies = [f"order {n}".encode() for n in range(total)]
        futures: list[asyncio.Future[int] | None] = [None] * total
        killing = asyncio.ensure_future(asyncio.sleep(0))

        async def produce() -> None:
            nonlocal killing
            for n, body in enumerate(bodies):
                try:
                    futures[n] = shop.send_nowait(handle, ORDER, body, key=f"order-{n}")
                except ClientError:
                    return  # the connection is gone: the rest was never sent
                if n == 1500:
                    killing = asyncio.ensure_future(asyncio.to_thread(d.kill, "alpha"))
                if n % 50 == 49:
                    await asyncio.sleep(0.002)

        await asyncio.wait_for(produce(), 60)
        await killing
        outcomes = [
            None if f is None else (await asyncio.gather(f, return_exceptions=True))[0]
            for f in futures
        ]
        unknown = [n for n, o in enumerate(outcomes) if isinstance(o, OutcomeUnknown)]
        assert unknown, "SENDs were in flight when the daemon was killed"
        assert all(type(o) is int or o is None or n in unknown for n, o in enumerate(outcomes))

        d.start("alpha")
        shop = await d.daemons["alpha"].client()
        retried = [n for n, o in enumerate(outcomes) if type(o) is not int]
        numbers = await asyncio.gather(
            *(shop.send_nowait(handle, ORDER, bodies[n], key=f"order-{n}") for n in retried)
        )
        final = [o if type(o) is int else 0 for o in outcomes]
        for n, seq in zip(retried, numbers, strict=True):
            final[n] = seq
        assert final == list(range(1, total + 1))  # one number each, no gap, no repeat

        warehouse = await d.daemons["beta"].client()
        received = await drain(warehouse, "OrderQueue", total, timeout=60)
        assert [m.message_body for m in received] == bodies
        assert await warehouse.receive("OrderQueue", timeout=1.0) == []
        await shop.close()
        await warehouse.close()
