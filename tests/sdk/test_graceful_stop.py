"""A daemon stopped with SIGTERM while a client pipelines SENDs answers every request it
read, and says which ones it did not read: every SEND's outcome is known.

Before, the daemon closed the application connections first and committed what it had
read while it stopped: every SEND in flight failed with "connection to brokerd lost",
yet was delivered, and an application that sent them again delivered them twice.

Now (SPEC §6, R-DLG-1), for a client that does not reconnect: a SEND either gets its
sequence number (it was committed and is delivered, once, in order) or fails with
``BrokerStopping`` (it was never read, never executed, and may be sent again); none
fails with ``OutcomeUnknown``. Real daemons: the shop on 127.0.0.1:4022 sends to the
warehouse on 127.0.0.2:4022. (A client that reconnects sends the unread ones again by
itself: ``test_reconnect.py``.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from brokerd.server.daemon import CLIENT_STOP_GRACE
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from protocol.errors import BrokerStopping
from tests.daemons import FAST_RETRY, drain, running, sends_through_a_stop


async def test_sigterm_during_pipelined_sends_answers_every_send_it_read(tmp_path: Path) -> None:
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    with running(d):
        shop = await d.daemons["alpha"].client(reconnect=False)
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        bodies, outcomes = await sends_through_a_stop(
            shop, handle, ORDER, "order", lambda: d.stop("alpha"), after=1000, burst=50, pause=0.002
        )
        committed = [body for body, o in zip(bodies, outcomes, strict=True) if type(o) is int]
        not_read = [o for o in outcomes if isinstance(o, BrokerStopping)]
        unknown = [o for o in outcomes if not isinstance(o, int | BrokerStopping)]
        assert unknown == [], unknown[:3]
        assert len(committed) >= 1000 and len(committed) + len(not_read) == len(bodies)
        seqs = [o for o in outcomes if type(o) is int]
        assert seqs == list(range(1, len(seqs) + 1))  # no gap, no repeat

        # Every SEND answered with a number arrives once, in order; nothing else does.
        d.start("alpha")
        warehouse = await d.daemons["beta"].client()
        received = await drain(warehouse, "OrderQueue", len(committed), timeout=60)
        assert [m.message_body for m in received] == committed
        assert await warehouse.receive("OrderQueue", timeout=1.0) == []
        await warehouse.close()


async def test_a_receive_waiting_when_the_daemon_stops_returns_nothing_taken(
    tmp_path: Path,
) -> None:
    """A RECEIVE that waits for messages (WAITFOR without end) when the daemon is stopped
    returns at once, empty: nothing was taken, so nothing is lost, and the daemon does
    not wait out its grace period for it. The message sent before the stop is still
    there after the restart."""
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    with running(d):
        warehouse = await d.daemons["beta"].client()
        waiting = asyncio.ensure_future(warehouse.receive("OrderQueue", timeout=-1))
        await asyncio.sleep(0.3)  # the RECEIVE waits in the daemon
        started = asyncio.get_running_loop().time()
        await asyncio.to_thread(d.stop, "beta")
        assert await asyncio.wait_for(waiting, 5) == []
        assert asyncio.get_running_loop().time() - started < CLIENT_STOP_GRACE / 2

        shop = await d.daemons["alpha"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(handle, ORDER, b"while the warehouse is away")
        d.start("beta")
        warehouse = await d.daemons["beta"].client()
        (got,) = await drain(warehouse, "OrderQueue", 1, timeout=30)
        assert got.message_body == b"while the warehouse is away"
        await shop.close()
        await warehouse.close()


async def test_a_send_after_the_stopped_daemon_closed_is_refused_as_not_sent(
    tmp_path: Path,
) -> None:
    """SPEC §6: a client that does not reconnect, whose daemon said goodbye (SIGTERM) and
    closed the connection, refuses a later SEND with ``BrokerStopping`` (never sent, safe to
    send again once the daemon is back), not a bare "not connected" that hides why."""
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    with running(d):
        shop = await d.daemons["alpha"].client(reconnect=False)
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await asyncio.to_thread(d.stop, "alpha")  # returns once the process has exited
        await asyncio.sleep(0.2)  # the goodbye, then the end of the connection, are read
        assert not shop.connected
        try:
            await shop.send(handle, ORDER, b"after the stop")
        except BrokerStopping as refused:
            assert "not sent" in str(refused)
        else:
            raise AssertionError("a SEND after the daemon closed was accepted")
        await shop.close()
