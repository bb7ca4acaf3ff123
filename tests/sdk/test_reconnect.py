"""The SDK reconnects by itself and every call says whether its outcome is known
(SPEC §6, outcomes). Real daemons: the shop on 127.0.0.1:4022 sends to the warehouse on
127.0.0.2:4022; the shop daemon is stopped (SIGTERM) or killed (SIGKILL) under a
client that pipelines SENDs, and started again.

* SENDs the stopping daemon never read are written again on the new connection;
* SENDs with idempotency keys whose outcome the kill hid are written again too, and
  the daemon answers a key it has seen with the first answer;
* any other request in flight fails with OutcomeUnknown, a client transaction's with
  TransactionLost; requests made while the daemon is away wait for it, or fail with
  NotConnected (never sent) once ``give_up_after`` passes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from brokerd.sdk.client import BrokerClient, Dialog, Reconnect
from brokerd.tools.example import (
    CONFIRMATION,
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from brokerd.tools.launcher import Deployment
from protocol.errors import NotConnected, OutcomeUnknown, TransactionLost
from tests.daemons import FAST_RETRY, drain, running

QUICK = Reconnect(initial=0.05, maximum=0.5, give_up_after=60)


async def _pipeline_through(
    d: Deployment,
    dialog: Dialog,
    total: int,
    interrupt: Callable[[], object],
    *,
    keys: bool,
) -> tuple[list[bytes], list[object]]:
    """Pipeline ``total`` SENDs on ``dialog``, 50 every 2 ms; ``interrupt`` (a stop or a
    kill) runs in a thread after the first half, and the daemon starts again 0.5 s after
    it. Returns the bodies and each SEND's outcome."""
    bodies = [f"order {n}".encode() for n in range(total)]
    futures: list[asyncio.Future[int]] = []
    interrupting: asyncio.Future[object] | None = None
    for n, body in enumerate(bodies):
        futures.append(dialog.send_nowait(ORDER, body, key=f"order-{n}" if keys else None))
        if n == total // 2:
            interrupting = asyncio.ensure_future(asyncio.to_thread(interrupt))
        if n % 50 == 49:
            await asyncio.sleep(0.002)
    assert interrupting is not None
    await interrupting
    await asyncio.sleep(0.5)
    await asyncio.to_thread(d.start, "alpha")
    outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 90)
    return bodies, list(outcomes)


async def test_a_sigterm_during_pipelined_sends_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """Every SEND gets its number, 1 to N without gap or repeat, and arrives once, in
    order: the ones the daemon read were answered before it closed, the others were
    written again on the connection made after the restart."""
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    with running(d):
        shop = await BrokerClient.connect(
            "127.0.0.1",
            d.daemons["alpha"].client_port,
            token_file=d.daemons["alpha"].token_file,
            reconnect=QUICK,
        )
        dialog = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        bodies, outcomes = await _pipeline_through(
            d, dialog, 3000, lambda: d.stop("alpha"), keys=True
        )
        assert outcomes == list(range(1, len(bodies) + 1)), [
            o for o in outcomes if type(o) is not int
        ][:3]
        assert shop.reconnects == 1 and shop.connected

        warehouse = await d.daemons["beta"].client()
        received = await drain(warehouse, "OrderQueue", len(bodies), timeout=60)
        assert [m.message_body for m in received] == bodies
        assert await warehouse.receive("OrderQueue", timeout=1.0) == []
        await dialog.end()
        await shop.close()
        await warehouse.close()


async def test_sends_with_keys_survive_a_kill_exactly_once(tmp_path: Path) -> None:
    """SIGKILL hides the outcome of the SENDs in flight; each carries a key, so the SDK
    writes it again after reconnecting and the daemon commits it once."""
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    with running(d):
        shop = await d.daemons["alpha"].client(reconnect=QUICK)
        dialog = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        bodies, outcomes = await _pipeline_through(
            d, dialog, 3000, lambda: d.kill("alpha"), keys=True
        )
        assert outcomes == list(range(1, len(bodies) + 1)), [
            o for o in outcomes if type(o) is not int
        ][:3]
        warehouse = await d.daemons["beta"].client()
        received = await drain(warehouse, "OrderQueue", len(bodies), timeout=60)
        assert [m.message_body for m in received] == bodies
        assert await warehouse.receive("OrderQueue", timeout=1.0) == []
        await shop.close()
        await warehouse.close()


async def test_a_kill_fails_unkeyed_sends_in_flight_as_unknown_and_the_client_goes_on(
    tmp_path: Path,
) -> None:
    """Without keys, a SEND in flight at a kill is OutcomeUnknown (it may have been
    committed): the SDK does not repeat it. Every SEND answered with a number arrives;
    the client reconnects and later SENDs work without a new ``connect``."""
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    with running(d):
        shop = await d.daemons["alpha"].client(reconnect=QUICK)
        dialog = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        bodies, outcomes = await _pipeline_through(
            d, dialog, 3000, lambda: d.kill("alpha"), keys=False
        )
        unknown = [n for n, o in enumerate(outcomes) if isinstance(o, OutcomeUnknown)]
        answered = [n for n, o in enumerate(outcomes) if type(o) is int]
        assert len(unknown) + len(answered) == len(bodies), [
            o for o in outcomes if not isinstance(o, int | OutcomeUnknown)
        ][:3]
        assert unknown, "SENDs were in flight when the daemon was killed"
        last = await dialog.send(ORDER, b"after the restart")
        assert shop.reconnects == 1

        warehouse = await d.daemons["beta"].client()
        got: dict[bytes, int] = {}
        for message in await drain(warehouse, "OrderQueue", last, timeout=60):
            got[message.message_body] = got.get(message.message_body, 0) + 1
        assert all(got.get(bodies[n]) == 1 for n in answered)
        assert all(got.get(bodies[n], 0) <= 1 for n in unknown)
        assert got[b"after the restart"] == 1
        await shop.close()
        await warehouse.close()


async def test_a_transaction_does_not_survive_its_connection(tmp_path: Path) -> None:
    """The daemon rolls a transaction back when its connection goes: the SDK says so
    (TransactionLost) instead of sending its verbs on the new connection, where the
    transaction does not exist. The message it had received is receivable again."""
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    with running(d):
        shop = await d.daemons["alpha"].client(reconnect=QUICK)
        dialog = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await dialog.send(ORDER, b"one")
        warehouse = await d.daemons["beta"].client(reconnect=QUICK)
        tx = await warehouse.begin_transaction()
        (message,) = await tx.receive("OrderQueue", timeout=30)
        await asyncio.to_thread(d.stop, "beta")
        await asyncio.to_thread(d.start, "beta")
        await warehouse.wait_connected(30)
        for verb in (tx.send(message.conversation_handle, ORDER, b"reply"), tx.commit()):
            try:
                await verb
            except TransactionLost:
                pass
            else:
                raise AssertionError("a transaction's verb went on a new connection")
        await tx.rollback()  # nothing to do: the daemon rolled it back
        assert warehouse.reconnects == 1
        (again,) = await warehouse.receive("OrderQueue", timeout=30)
        assert again.message_body == b"one"
        await shop.close()
        await warehouse.close()


async def test_requests_wait_for_the_daemon_then_give_up_as_never_sent(tmp_path: Path) -> None:
    """A call made while the daemon is away waits for the connection and completes once
    the daemon is back; with no daemon within ``give_up_after`` it fails with
    NotConnected: never sent."""
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    with running(d):
        hasty = await d.daemons["alpha"].client(
            reconnect=Reconnect(initial=0.05, maximum=0.2, give_up_after=1.0)
        )
        patient = await d.daemons["alpha"].client(reconnect=QUICK)
        dialog = await hasty.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await asyncio.to_thread(d.stop, "alpha")
        try:
            await dialog.send(ORDER, b"nobody home")
        except NotConnected as exc:
            assert "not sent" in str(exc)
        else:
            raise AssertionError("a SEND with no daemon for 1 s must fail as never sent")
        assert not hasty.connected

        waiting = asyncio.ensure_future(patient.send(dialog, ORDER, b"back soon"))
        await asyncio.sleep(1.5)
        assert not waiting.done()
        await asyncio.to_thread(d.start, "alpha")
        assert await asyncio.wait_for(waiting, 30) == 1
        warehouse = await d.daemons["beta"].client()
        (got,) = await drain(warehouse, "OrderQueue", 1, timeout=30)
        assert got.message_body == b"back soon"
        for client in (hasty, patient, warehouse):
            await client.close()


async def test_connect_as_a_context_and_dialog_objects(tmp_path: Path) -> None:
    """``async with BrokerClient.connect(...)``; ``begin_dialog`` gives a Dialog whose
    verbs act on its conversation and that stands for its handle."""
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    with running(d):
        alpha, beta = d.daemons["alpha"], d.daemons["beta"]
        async with (
            BrokerClient.connect(
                alpha.client_host, alpha.client_port, token_file=alpha.token_file
            ) as shop,
            BrokerClient.connect(
                beta.client_host, beta.client_port, token_file=beta.token_file
            ) as warehouse,
        ):
            dialog = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
            assert await dialog.send(ORDER, b"<order/>") == 1
            (order,) = await drain(warehouse, "OrderQueue", 1)
            await warehouse.send(order.conversation_handle, CONFIRMATION, b"<ack/>")
            await warehouse.end_conversation(order.conversation_handle)
            replies = []
            while len(replies) < 2:
                replies += await dialog.receive("ClientQueue", top=10, timeout=10)
            assert all(r.conversation_handle == dialog for r in replies)
            assert replies[0].message_body == b"<ack/>" and replies[1].is_end_dialog
            await dialog.end()
            endpoints = {
                str(e["conversation_handle"]) for e in await shop.view("conversation_endpoints")
            }
            assert str(dialog) in endpoints
        assert not shop.connected
