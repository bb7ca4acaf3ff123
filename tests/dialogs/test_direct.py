"""Direct delivery inside one database (R-DLG-13): a SEND whose far endpoint is in the
same database goes straight into its queue, bypassing the transmission queue, and the
dialog stays exactly once and in order (R-DLG-1) across the paths, a queue turned off,
and a SIGKILL. Real daemons; the paths are told apart by their delivery traces (a
message through the transmission queue has an ``enqueued`` event, a direct one has
not)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path

from brokerd.errors import ContractViolation, ConversationNotFound
from brokerd.sdk.client import BrokerClient
from brokerd.tools import example
from brokerd.tools.launcher import Deployment
from brokerd.traces.writer import read_events, segment_files
from tests.daemons import assert_exactly_once_in_order, drain, running

HOST = "127.0.0.247"
ONE_DATABASE = example.two_services_database("shop")
TWO_DATABASES = example.shop_database(None) + example.warehouse_database(None)
SHOP, WAREHOUSE = example.SHOP_SERVICE, example.WAREHOUSE_SERVICE


def _events(d: Deployment) -> Counter[str]:
    """Event names of the daemon's traces (each test has one dialog)."""
    traced = read_events(segment_files([d.daemons["solo"].directory / "data" / "traces"]))
    return Counter(e["event"] for e in traced)


def _solo(tmp_path: Path, databases: str = ONE_DATABASE) -> Deployment:
    d = Deployment(tmp_path)
    d.add("solo", HOST, databases)
    return d


def _bodies(first: int, last: int, what: str = "order") -> list[bytes]:
    return [f"{what} {n}".encode() for n in range(first, last + 1)]


async def _orders(client: BrokerClient, handle: uuid.UUID, first: int, last: int) -> None:
    for body in _bodies(first, last):
        await client.send(handle, example.ORDER, body)


async def test_messages_after_the_first_go_straight_into_the_target_queue(
    tmp_path: Path,
) -> None:
    """R-DLG-13: the first message creates the target endpoint through the transmission
    queue; the next ones, and the target's replies, go directly."""
    d = _solo(tmp_path)
    with running(d):
        client = await d.daemons["solo"].client()
        try:
            handle = await client.begin_dialog(SHOP, WAREHOUSE, example.CONTRACT)
            await _orders(client, handle, 1, 200)
            orders = await drain(client, "OrderQueue", 200)
            assert [m.message_body for m in orders] == _bodies(1, 200)
            assert_exactly_once_in_order(orders)
            target = orders[0].conversation_handle
            for body in _bodies(1, 50, "confirmed"):
                await client.send(target, example.CONFIRMATION, body)
            replies = await drain(client, "ClientQueue", 50)
            assert [m.message_body for m in replies] == _bodies(1, 50, "confirmed")
            assert await client.view("transmission_queue") == []
        finally:
            await client.close()
    events = _events(d)
    assert events["message_sent"] == 250
    assert events["delivered"] == 250
    assert events["received"] == 250
    # Only what was sent before the target endpoint existed took the transmission queue.
    assert 1 <= events["enqueued"] < 200, events


async def test_direct_messages_survive_sigkill_and_numbering_goes_on(tmp_path: Path) -> None:
    """R-DLG-1, R-DLG-13: a committed direct SEND is in the target queue after kill -9,
    and both endpoints' numbers were committed with it: the dialog goes on in order."""
    d = _solo(tmp_path)
    with running(d):
        client = await d.daemons["solo"].client()
        handle = await client.begin_dialog(SHOP, WAREHOUSE, example.CONTRACT)
        await _orders(client, handle, 1, 1)
        first = await drain(client, "OrderQueue", 1)
        await _orders(client, handle, 2, 300)  # each SEND returned: committed
        await client.close()
        d.kill("solo")
        d.start("solo")
        client = await d.daemons["solo"].client()
        try:
            after_restart = await drain(client, "OrderQueue", 299)
            await _orders(client, handle, 301, 400)
            rest = await drain(client, "OrderQueue", 100)
            received = first + after_restart + rest
            assert [m.message_body for m in received] == _bodies(1, 400)
            assert_exactly_once_in_order(received)
            assert await client.receive("OrderQueue", timeout=0.5) == []
        finally:
            await client.close()


async def test_a_queue_turned_off_sends_through_the_transmission_queue_in_order(
    tmp_path: Path,
) -> None:
    """R-DLG-12, R-DLG-13: while the target queue is off a SEND takes the transmission
    queue (the target holds the message); once it is on, SENDs go directly again, after
    the held ones, and RECEIVE returns them all in order."""
    d = _solo(tmp_path)
    with running(d):
        client = await d.daemons["solo"].client()
        try:
            handle = await client.begin_dialog(SHOP, WAREHOUSE, example.CONTRACT)
            await _orders(client, handle, 1, 10)
            received = await drain(client, "OrderQueue", 10)
            await client.alter_queue("OrderQueue", False)
            await _orders(client, handle, 11, 20)
            await client.alter_queue("OrderQueue", True)
            await _orders(client, handle, 21, 40)
            received += await drain(client, "OrderQueue", 30)
            assert [m.message_body for m in received] == _bodies(1, 40)
            assert_exactly_once_in_order(received)
        finally:
            await client.close()
    events = _events(d)
    assert events["enqueued"] >= 11  # the first message and the ten sent while it was off
    assert events["enqueued"] < 40
    assert events["delivered"] == 40


async def test_two_databases_of_one_instance_still_use_the_transmission_queue(
    tmp_path: Path,
) -> None:
    """The decision in brokerd.dialogs.verbs.direct: two databases are two files, whose commits
    cannot be one transaction, so every message goes through the transmission queue and
    the local link, acknowledged."""
    d = _solo(tmp_path, TWO_DATABASES)
    with running(d):
        client = await d.daemons["solo"].client()
        try:
            handle = await client.begin_dialog(SHOP, WAREHOUSE, example.CONTRACT)
            await _orders(client, handle, 1, 50)
            received = await drain(client, "OrderQueue", 50)
            assert_exactly_once_in_order(received)
        finally:
            await client.close()
    events = _events(d)
    assert events["enqueued"] == 50
    assert events["delivered"] == 50


async def test_pipelined_sends_go_together_and_a_refused_one_goes_alone(
    tmp_path: Path,
) -> None:
    """The client listener hands a run of pipelined SENDs on one conversation to the
    engine at once, and they go directly in one job. A SEND in the run that fails its
    checks (a type its contract does not allow, a conversation that does not exist) is
    refused alone: the others are numbered on, in order, and all arrive (R-DLG-1,
    R-DLG-13)."""
    d = _solo(tmp_path)
    with running(d):
        client = await d.daemons["solo"].client()
        try:
            first = await client.begin_dialog(SHOP, WAREHOUSE, example.CONTRACT)
            second = await client.begin_dialog(SHOP, WAREHOUSE, example.CONTRACT)
            await client.send(first, example.ORDER, b"opens the first")
            await client.send(second, example.ORDER, b"opens the second")
            await drain(client, "OrderQueue", 2)  # both far endpoints exist: direct from now
            futures = []
            for n in range(1, 301):  # one turn of the client's loop: one write
                handle = first if n % 100 else second
                message_type = example.CONFIRMATION if n == 50 else example.ORDER
                if n == 150:
                    handle = uuid.uuid4()
                futures.append(client.send_nowait(handle, message_type, b"order %d" % n))
            results = [await _outcome(f) for f in futures]
        finally:
            received = await drain(client, "OrderQueue", 297)
            await client.close()
    refused = {n + 1: r for n, r in enumerate(results) if isinstance(r, Exception)}
    assert sorted(refused) == [50, 150], refused
    assert isinstance(refused[50], ContractViolation)
    assert isinstance(refused[150], ConversationNotFound)
    on_first = [r for n, r in enumerate(results, 1) if n % 100 and n not in refused]
    assert on_first == list(range(2, 2 + len(on_first)))  # numbered on, past the refused
    assert results[99] == 2 and results[199] == 3 and results[299] == 4  # the second's
    for handle in {m.conversation_handle for m in received}:  # each dialog's first drained
        seqs = [m.message_sequence_number for m in received if m.conversation_handle == handle]
        assert seqs == list(range(2, 2 + len(seqs)))
    assert sorted(m.message_body for m in received) == sorted(
        b"order %d" % n for n in range(1, 301) if n not in refused
    )
    assert _events(d)["enqueued"] == 2  # only each dialog's first message was queued


async def _outcome(future: asyncio.Future[int]) -> int | Exception:
    try:
        return await future
    except Exception as exc:
        return exc
