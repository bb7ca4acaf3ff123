"""Two real daemons on 127.0.0.1:4022 and 127.0.0.2:4022: dialogs end to end.

SPEC ids: R-DLG-1 (exactly once, in order), R-DLG-3 (contract checks at SEND),
R-DLG-4 (duplicates), R-DLG-5 (acknowledge after commit; the transmission
queue drains), R-DLG-6 (a peer that is down is not an error; retransmission),
R-DLG-7 (fragments interleaved with small messages), R-DLG-8 (an altered frame
is not acknowledged), R-DLG-10 and §5 (ending, states), R-PROTO-3 (the
broker_connections view).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.tools.example import (
    CONFIRMATION,
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
    shop_database,
    warehouse_database,
)
from brokerd.tools.faultproxy import FaultPlan, FaultProxy
from brokerd.tools.launcher import Deployment
from brokerd.traces.writer import read_events, segment_files
from protocol.errors import AuthenticationFailed, RemoteError
from tests.commands import brokerd
from tests.daemons import FAST_RETRY, assert_exactly_once_in_order, drain, wait_until


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = shop_and_warehouse(tmp_path, FAST_RETRY)
    try:
        yield d
    finally:
        d.stop_all()


def start_both(d: Deployment) -> None:
    d.start("alpha")
    d.start("beta")


async def clients(d: Deployment) -> tuple[BrokerClient, BrokerClient]:
    return await d.daemons["alpha"].client(), await d.daemons["beta"].client()


async def tq_empty(client: BrokerClient) -> bool:
    return not await client.view("transmission_queue")


async def test_request_reply_both_sides_end_and_reach_cd(deployment: Deployment) -> None:
    start_both(deployment)
    shop, warehouse = await clients(deployment)
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    (row,) = await shop.view("conversation_endpoints")
    assert row["state"] == "SO"
    await shop.send(handle, ORDER, b"<order id='1'/>")
    (request,) = await drain(warehouse, "OrderQueue", 1)
    assert request.message_body == b"<order id='1'/>"
    assert request.message_type_name == ORDER and request.service_contract_name == CONTRACT
    await warehouse.send(request.conversation_handle, CONFIRMATION, b"<ok/>")
    (reply,) = await drain(shop, "ClientQueue", 1)
    assert reply.conversation_handle == handle and reply.message_body == b"<ok/>"
    await shop.end_conversation(handle)
    (end,) = await drain(warehouse, "OrderQueue", 1)
    assert end.is_end_dialog
    (target_row,) = await warehouse.view("conversation_endpoints")
    assert target_row["state"] == "DI"
    await warehouse.end_conversation(end.conversation_handle)
    # R-DLG-10: the shop has ended; the warehouse's EndDialog only closes its endpoint

    async def both_closed() -> bool:
        # SPEC §5: the initiator's closed endpoint is removed at once, the target's kept
        shop_states = [r["state"] for r in await shop.view("conversation_endpoints")]
        warehouse_states = [r["state"] for r in await warehouse.view("conversation_endpoints")]
        return shop_states in ([], ["CD"]) and warehouse_states == ["CD"]

    await wait_until(both_closed, 10)
    assert await shop.receive("ClientQueue", timeout=0.5) == []
    assert await shop.view("transmission_queue") == []
    assert await warehouse.view("transmission_queue") == [], await warehouse.view(
        "transmission_queue"
    )
    connections = await shop.view("broker_connections")
    assert {c["peer"] for c in connections} == {"beta"}
    assert all(c["encrypted"] and c["state"] == "open" for c in connections)
    await shop.close()
    await warehouse.close()


async def test_contract_refuses_a_message_type_at_send(deployment: Deployment) -> None:
    start_both(deployment)
    shop, warehouse = await clients(deployment)
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    with pytest.raises(RemoteError) as refused:
        await shop.send(handle, CONFIRMATION, b"<not-mine/>")
    text = str(refused.value)
    assert CONTRACT in text and CONFIRMATION in text and "target" in text
    with pytest.raises(RemoteError, match="not part of contract"):
        await shop.send(handle, "//unknown/Type", b"")
    assert await tq_empty(shop)
    await shop.close()
    await warehouse.close()


async def test_client_without_credentials_is_refused(deployment: Deployment) -> None:
    deployment.start("alpha")
    with pytest.raises(AuthenticationFailed, match="credentials refused"):
        await BrokerClient.connect("127.0.0.1", 4023, token="not-the-token")
    with pytest.raises(AuthenticationFailed, match="no credentials"):
        await BrokerClient.connect("127.0.0.1", 4023)


async def test_ten_thousand_messages_over_a_hundred_dialogs(deployment: Deployment) -> None:
    start_both(deployment)
    senders = [await deployment.daemons["alpha"].client() for _ in range(4)]
    warehouse = await deployment.daemons["beta"].client()
    handles = [
        await senders[0].begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(100)
    ]
    sent: dict[uuid.UUID, list[bytes]] = {h: [] for h in handles}

    async def send_dialogs(client: BrokerClient, mine: list[uuid.UUID]) -> None:
        for n in range(100):
            for h in mine:
                body = f"{h}:{n}".encode()
                sent[h].append(body)
                await client.send(h, ORDER, body)

    receiving = asyncio.create_task(drain(warehouse, "OrderQueue", 10_000, timeout=240))
    await asyncio.gather(*(send_dialogs(c, handles[i::4]) for i, c in enumerate(senders)))
    received = await receiving
    per = assert_exactly_once_in_order(received, sent)
    assert len(per) == 100 and all(len(s) == 100 for s in per.values())
    assert await warehouse.receive("OrderQueue", timeout=0.3) == []
    await wait_until(lambda: tq_empty(senders[0]), 30)
    for c in [*senders, warehouse]:
        await c.close()


async def test_large_message_fragments_while_small_messages_flow(deployment: Deployment) -> None:
    start_both(deployment)
    shop, warehouse = await clients(deployment)
    big_dialog = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    small_dialog = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    big = os.urandom(10 * 1024 * 1024)
    await shop.send(big_dialog, ORDER, big)
    for n in range(20):
        await shop.send(small_dialog, ORDER, f"small {n}".encode())
    received = await drain(warehouse, "OrderQueue", 21, timeout=120)
    order = [m.message_body[:6] if len(m.message_body) < 100 else b"BIG" for m in received]
    assert order.index(b"BIG") > 0, "small messages waited behind the 10 MiB message"
    (whole,) = [m for m in received if len(m.message_body) > 100]
    assert hashlib.sha256(whole.message_body).digest() == hashlib.sha256(big).digest()
    assert_exactly_once_in_order(received)
    await wait_until(lambda: tq_empty(shop), 30)
    await shop.close()
    await warehouse.close()


async def test_partial_message_is_never_received(deployment: Deployment) -> None:
    """While fragments are still arriving, RECEIVE sees nothing (status 2, R-DLG-7)."""
    start_both(deployment)
    shop, warehouse = await clients(deployment)
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    big = os.urandom(10 * 1024 * 1024)
    send = asyncio.create_task(shop.send(handle, ORDER, big))
    seen: list[int] = []
    while not seen:
        got = await warehouse.receive("OrderQueue", top=10, timeout=0.05)
        seen += [len(m.message_body) for m in got]
    await send
    assert seen == [len(big)]
    await shop.close()
    await warehouse.close()


async def test_peer_down_messages_wait_with_readable_status(deployment: Deployment) -> None:
    deployment.start("alpha")
    shop = await deployment.daemons["alpha"].client()
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    for n in range(5):
        await shop.send(handle, ORDER, f"order {n}".encode())

    async def refused() -> bool:
        rows = await shop.view("transmission_queue")
        return len(rows) == 5 and all(
            "connection refused by 127.0.0.2:4022" in r["transmission_status"] for r in rows
        )

    await wait_until(refused, 10)
    deployment.start("beta")
    warehouse = await deployment.daemons["beta"].client()
    received = await drain(warehouse, "OrderQueue", 5, timeout=30)
    assert [m.message_body for m in received] == [f"order {n}".encode() for n in range(5)]
    await wait_until(lambda: tq_empty(shop), 10)
    await shop.close()
    await warehouse.close()


async def test_no_route_waits_with_status(tmp_path: Path) -> None:
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("alpha", "127.0.0.1", shop_database(None))
    try:
        d.start("alpha")
        shop = await d.daemons["alpha"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(handle, ORDER, b"x")

        async def delayed() -> bool:
            rows = await shop.view("transmission_queue")
            return len(rows) == 1 and "no route" in rows[0]["transmission_status"]

        await wait_until(delayed, 5)
        await shop.close()
    finally:
        d.stop_all()


async def send_stream(client: BrokerClient, handles: list[uuid.UUID], per_dialog: int) -> None:
    for n in range(per_dialog):
        for h in handles:
            await client.send(h, ORDER, f"{h}:{n}".encode())


async def test_kill_9_of_the_receiver_mid_stream(deployment: Deployment) -> None:
    start_both(deployment)
    shop = await deployment.daemons["alpha"].client()
    handles = [
        await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(10)
    ]
    stream = asyncio.create_task(send_stream(shop, handles, 200))
    await asyncio.sleep(0.4)
    deployment.kill("beta")
    await asyncio.sleep(0.3)
    deployment.start("beta")
    await stream
    warehouse = await deployment.daemons["beta"].client()
    received = await drain(warehouse, "OrderQueue", 2000, timeout=120)
    per = assert_exactly_once_in_order(received)
    assert sorted(len(v) for v in per.values()) == [200] * 10
    for m in received:
        _, n = m.message_body.decode().split(":")
        assert int(n) == m.message_sequence_number - 1
    assert await warehouse.receive("OrderQueue", timeout=0.5) == []
    await wait_until(lambda: tq_empty(shop), 30)
    await shop.close()
    await warehouse.close()


async def test_kill_9_of_the_sender_then_restart(deployment: Deployment) -> None:
    start_both(deployment)
    shop = await deployment.daemons["alpha"].client()
    handles = [
        await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(10)
    ]
    await send_stream(shop, handles, 100)  # every SEND returned: all 1,000 are committed
    deployment.kill("alpha")
    await shop.close()
    deployment.start("alpha")
    shop = await deployment.daemons["alpha"].client()
    for h in handles:  # the dialogs survived the crash and go on
        await shop.send(h, ORDER, f"{h}:100".encode())
    warehouse = await deployment.daemons["beta"].client()
    received = await drain(warehouse, "OrderQueue", 1010, timeout=120)
    per = assert_exactly_once_in_order(received)
    assert sorted(len(v) for v in per.values()) == [101] * 10
    assert await warehouse.receive("OrderQueue", timeout=0.5) == []
    await wait_until(lambda: tq_empty(shop), 30)
    await shop.close()
    await warehouse.close()


async def test_altered_frame_is_not_acknowledged_and_retransmitted(tmp_path: Path) -> None:
    # One fragment per frame: the plan's second frame is the second message.
    d = shop_and_warehouse(
        tmp_path,
        FAST_RETRY,
        beta_route_host="127.0.0.3",
        endpoint_extra="fragments_per_frame = 1",
    )
    proxy = FaultProxy("127.0.0.3", 4022, "127.0.0.2", 4022, FaultPlan(corrupt_fragments={2}))
    await proxy.start()
    try:
        start_both(d)
        shop, warehouse = await clients(d)
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        bodies = [f"order {n}".encode() for n in range(5)]
        for body in bodies:
            await shop.send(handle, ORDER, body)
        received = await drain(warehouse, "OrderQueue", 5, timeout=30)
        assert [m.message_body for m in received] == bodies
        assert proxy.stats.fragments_corrupted == 1
        (beta_stats,) = await warehouse.view("stats")
        assert beta_stats["corrupted_messages"] == 1
        (alpha_stats,) = await shop.view("stats")
        assert alpha_stats["retransmissions"] >= 1
        await wait_until(lambda: tq_empty(shop), 10)
        await shop.close()
        await warehouse.close()
        d.stop_all()
        traced = read_events(segment_files([d.daemons["beta"].directory / "data" / "traces"]))
        corrupted = [e for e in traced if e["event"] == "corrupted_message"]  # R-DLG-8
        assert len(corrupted) == 1 and corrupted[0]["peer"]
    finally:
        d.stop_all()
        await proxy.stop()


def test_wrong_configuration_stops_start_up(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(
        'data_dir = "data"\n[endpoint]\ncertificate = "a.pem"\nprivate_key = "a.key"\n'
        'ca_certificate = "ca.pem"\nport = 70000\n'
    )
    done = brokerd("run", "--config", str(config), timeout=30)
    assert done.returncode == 2
    assert str(config) in done.stderr and "endpoint.port" in done.stderr


async def test_queue_off_holds_messages_until_turned_on(deployment: Deployment) -> None:
    """R-DLG-12: arriving messages are kept (and acknowledged) while the queue is off."""
    start_both(deployment)
    shop, warehouse = await clients(deployment)
    await warehouse.alter_queue("OrderQueue", False)
    handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
    for n in range(3):
        await shop.send(handle, ORDER, f"order {n}".encode())
    await wait_until(lambda: tq_empty(shop), 10)
    with pytest.raises(RemoteError) as refused:
        await warehouse.receive("OrderQueue", timeout=0.1)
    assert refused.value.kind == "QueueDisabled" and "OrderQueue" in str(refused.value)
    (queue,) = await warehouse.view("queues")
    assert queue["status"] == "off" and queue["ready_messages"] == 3
    await warehouse.alter_queue("OrderQueue", True)
    received = await drain(warehouse, "OrderQueue", 3)
    assert [m.message_body for m in received] == [f"order {n}".encode() for n in range(3)]
    await shop.close()
    await warehouse.close()


async def test_idle_connection_closes_and_the_dialog_outlives_it(tmp_path: Path) -> None:
    """R-PROTO-3: a quiet connection is closed; the next message opens a new one."""
    d = Deployment(tmp_path, FAST_RETRY)
    idle = "idle_timeout = 0.5"
    d.add("alpha", "127.0.0.1", shop_database("127.0.0.2"), endpoint_extra=idle)
    d.add("beta", "127.0.0.2", warehouse_database("127.0.0.1"), endpoint_extra=idle)
    try:
        start_both(d)
        shop, warehouse = await clients(d)
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(handle, ORDER, b"first")
        await drain(warehouse, "OrderQueue", 1)
        assert await shop.view("broker_connections")

        async def no_connections() -> bool:
            return not await shop.view("broker_connections")

        await wait_until(no_connections, 10)
        await shop.send(handle, ORDER, b"second")
        (second,) = await drain(warehouse, "OrderQueue", 1)
        assert second.message_body == b"second" and second.message_sequence_number == 2
        await shop.close()
        await warehouse.close()
    finally:
        d.stop_all()


async def test_receiver_refusals_come_back_as_broker_errors(tmp_path: Path) -> None:
    """R-DLG-2: a refused message is answered with an unsequenced Error, never stored.

    Beta's warehouse service does not accept the DEFAULT contract, and beta takes
    messages of at most 4,000 bytes. A message for a service beta does not have at
    all is dropped and not acknowledged (R-ROUTE-13), so it waits at the sender.
    """
    d = Deployment(tmp_path, FAST_RETRY)
    catch_all = '\n[[database.route]]\nname = "Anything"\naddress = "tcp://127.0.0.2:4022"\n'
    d.add("alpha", "127.0.0.1", shop_database("127.0.0.2") + catch_all)
    d.add(
        "beta",
        "127.0.0.2",
        warehouse_database("127.0.0.1"),
        extra="[limits]\nmax_message_size = 4000\n",
    )
    try:
        start_both(d)
        shop, warehouse = await clients(d)
        wrong_contract = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, "DEFAULT")
        await shop.send(wrong_contract, "DEFAULT", b"<order/>")
        big = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        await shop.send(big, ORDER, b"x" * 5000)
        lost = await shop.begin_dialog(SHOP_SERVICE, "//warehouse/Nowhere", CONTRACT)
        await shop.send(lost, ORDER, b"<order/>")
        errors = {m.conversation_handle: m for m in await drain(shop, "ClientQueue", 2)}
        assert errors[wrong_contract].is_error and errors[big].is_error
        assert b"<Code>-8408</Code>" in errors[wrong_contract].message_body
        assert b"<Code>-9617</Code>" in errors[big].message_body
        states = {
            r["conversation_handle"]: r["state"] for r in await shop.view("conversation_endpoints")
        }
        assert states == {str(wrong_contract): "ER", str(big): "ER", str(lost): "CO"}
        (waiting,) = await shop.view("transmission_queue")
        assert waiting["conversation_handle"] == str(lost)
        drops = [r["reason"] for r in await warehouse.view("drops")]
        assert any("//warehouse/Nowhere" in r and "R-ROUTE-13" in r for r in drops)
        assert await warehouse.view("conversation_endpoints") == []
        assert await warehouse.receive("OrderQueue", timeout=0.3) == []
        await shop.end_conversation(big)
        states = {
            r["conversation_handle"]: r["state"] for r in await shop.view("conversation_endpoints")
        }
        assert states.get(str(big), "removed") in ("CD", "removed")  # closed (SPEC §5)
        await shop.close()
        await warehouse.close()
    finally:
        d.stop_all()


async def test_client_listener_refuses_large_frames_before_login(deployment: Deployment) -> None:
    """An unauthenticated peer cannot make the daemon buffer a large body."""
    from protocol.client_wire import ClientFrame, ClientFrameKind, ClientFrameReader, encode_frame

    deployment.start("alpha")
    reader, writer = await asyncio.open_connection("127.0.0.1", 4023)
    frames = ClientFrameReader()
    (challenge,) = frames.feed(await reader.read(4096))
    assert challenge.kind is ClientFrameKind.CHALLENGE
    frame = encode_frame(ClientFrame(ClientFrameKind.REQUEST, 1, {"op": "login"}, b"x" * 8192))
    writer.write(frame[:64])  # the header alone says how large the body is
    await writer.drain()
    reply = await asyncio.wait_for(reader.read(), 10)  # read() to EOF: the daemon closes
    (error,) = frames.feed(reply)
    assert error.kind is ClientFrameKind.ERROR and "exceeds" in error.meta["message"]
    writer.close()
