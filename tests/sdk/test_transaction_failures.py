"""Client transactions when things fail, with real daemons and real files (SPEC §6).

SPEC §6: RECEIVE returns messages of one conversation group and locks that group until
the transaction ends; commit makes the receive and the sends permanent together,
rollback puts the received messages back. R-DLG-1: the application gets every message
exactly once and in sequence order. These tests check both when the reader process is
SIGKILLed, when the daemon is SIGKILLed, when the client closes its connection, when two
readers compete for groups, after rollbacks that interleave with new messages, and that
the refusals arrive as typed errors.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.tools.example import (
    CONFIRMATION,
    ORDER,
)
from brokerd.tools.launcher import Deployment
from protocol.errors import ClientError, QueueDisabled, TransactionError
from tests.daemons import assert_exactly_once_in_order, drain
from tests.sdk.orders import order_dialogs, ready_count, seqs, wait_ready

REPO = Path(__file__).resolve().parents[2]


def dialog_of(message: ReceivedMessage) -> str:
    """The ``dialog`` attribute of an order body (which shop dialog sent it)."""
    return message.message_body.decode().split("dialog='")[1].split("'")[0]


async def assert_nothing_was_sent(shop: BrokerClient, warehouse: BrokerClient) -> None:
    """No reply of a lost transaction: beta queued nothing, alpha's queue stays empty."""
    assert await warehouse.view("transmission_queue") == []
    assert await shop.receive("ClientQueue", top=10, timeout=1.0) == []
    assert await warehouse.view("transmission_queue") == []


READER = """
import asyncio, sys
from brokerd.sdk.client import BrokerClient

async def main(host, port, token_file, expected, reply_type):
    client = await BrokerClient.connect(host, int(port), token_file=token_file)
    tx = await client.begin_transaction()
    got = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while len(got) < int(expected) and loop.time() < deadline:
        got += await tx.receive("OrderQueue", top=100, timeout=1)
    for handle in dict.fromkeys(m.conversation_handle for m in got):
        await tx.send(handle, reply_type, b"<from-a-killed-transaction/>")
    print("HOLDING", " ".join(
        f"{m.conversation_handle}:{m.message_sequence_number}" for m in got), flush=True)
    await asyncio.sleep(300)

asyncio.run(main(*sys.argv[1:]))
"""


async def test_a_reader_killed_mid_transaction_loses_nothing_and_sends_nothing(
    deployment: Deployment, tmp_path: Path
) -> None:
    alpha, beta = deployment.daemons["alpha"], deployment.daemons["beta"]
    shop = await alpha.client()
    warehouse = await beta.client()
    sent = await order_dialogs(shop, warehouse, dialogs=2, per_dialog=4)

    script = tmp_path / "reader.py"
    script.write_text(READER)
    stderr = (tmp_path / "reader.err").open("wb")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    reader = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        beta.host,
        str(beta.client_port),
        str(beta.token_file),
        "8",
        CONFIRMATION,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
        env=env,
        cwd=str(REPO),
    )
    stderr.close()
    try:
        assert reader.stdout is not None
        line = await asyncio.wait_for(reader.stdout.readline(), 20)
        assert line.startswith(b"HOLDING"), (tmp_path / "reader.err").read_text()
        held = line.split()[1:]
        assert len(held) == 8
        # the reader holds both groups: nobody else gets anything
        assert await warehouse.receive("OrderQueue", top=10, timeout=0.3) == []
        reader.kill()  # SIGKILL, that one process only
        assert await asyncio.wait_for(reader.wait(), 10) == -9
    finally:
        if reader.returncode is None:
            reader.kill()
            await reader.wait()

    fresh = await beta.client()
    again = await drain(fresh, "OrderQueue", 8, timeout=15)
    per = assert_exactly_once_in_order(again, sent)
    assert sorted(seqs for seqs in per.values()) == [[1, 2, 3, 4], [1, 2, 3, 4]]
    assert await fresh.receive("OrderQueue", top=10, timeout=0.3) == []
    await assert_nothing_was_sent(shop, fresh)
    for client in (shop, warehouse, fresh):
        await client.close()


async def test_a_daemon_killed_mid_transaction_loses_nothing_and_sends_nothing(
    deployment: Deployment,
) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    sent = await order_dialogs(shop, warehouse, dialogs=2, per_dialog=3)
    tx = await warehouse.begin_transaction()
    got: list[ReceivedMessage] = []
    while len(got) < 6:
        got += await tx.receive("OrderQueue", top=100, timeout=5)
    for handle in dict.fromkeys(m.conversation_handle for m in got):
        await tx.send(handle, CONFIRMATION, b"<from-a-crashed-daemon/>")

    deployment.kill("beta")
    await asyncio.to_thread(deployment.start, "beta")
    with pytest.raises(ClientError):
        await tx.commit()

    fresh = await deployment.daemons["beta"].client()
    again = await drain(fresh, "OrderQueue", 6, timeout=15)
    per = assert_exactly_once_in_order(again, sent)
    assert sorted(per.values()) == [[1, 2, 3], [1, 2, 3]]
    assert await fresh.receive("OrderQueue", top=10, timeout=0.3) == []
    await assert_nothing_was_sent(shop, fresh)
    for client in (shop, warehouse, fresh):
        await client.close()


async def test_two_readers_never_hold_the_same_conversation_group(
    deployment: Deployment,
) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    sent = await order_dialogs(shop, warehouse, dialogs=6, per_dialog=20)
    total = 6 * 20
    readers = {name: await deployment.daemons["beta"].client() for name in ("A", "B")}

    # group -> reader, from the moment its RECEIVE returned until just before its COMMIT
    # is sent: within the daemon's lock, so another reader must never get that group then
    held: dict[uuid.UUID, str] = {}
    received: list[ReceivedMessage] = []
    by_reader: dict[str, int] = {"A": 0, "B": 0}
    most_held = 0
    violations: list[str] = []

    async def read(name: str, client: BrokerClient) -> None:
        nonlocal most_held
        deadline = time.monotonic() + 20
        while len(received) < total and time.monotonic() < deadline:
            async with client.transaction() as tx:
                got = await tx.receive("OrderQueue", top=5, timeout=1)
                if not got:
                    continue
                groups = {m.conversation_group_id for m in got}
                assert len(groups) == 1, "one RECEIVE returns one conversation group"
                (group,) = groups
                if group in held:
                    violations.append(f"{name} got group {group} held by {held[group]}")
                held[group] = name
                most_held = max(most_held, len(held))
                received.extend(got)  # in the order the daemon handed them out
                by_reader[name] += len(got)
                await asyncio.sleep(0.05)  # keep the group while the other reader polls
                del held[group]

    await asyncio.gather(*(read(n, c) for n, c in readers.items()))
    assert violations == []
    assert len(received) == total
    per = assert_exactly_once_in_order(received, sent)
    assert sorted(len(s) for s in per.values()) == [20] * 6
    assert by_reader["A"] > 0 and by_reader["B"] > 0
    assert most_held == 2, "the readers should have held two groups at once"
    assert await warehouse.receive("OrderQueue", top=10, timeout=0.3) == []
    for client in (shop, warehouse, *readers.values()):
        await client.close()


async def test_rollback_restores_order_with_interleaved_groups_and_new_messages(
    deployment: Deployment,
) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    other = await deployment.daemons["beta"].client()
    sent = await order_dialogs(shop, warehouse, dialogs=2, per_dialog=4)

    tx = await warehouse.begin_transaction()
    first = await tx.receive("OrderQueue", top=2, timeout=5)
    second = await tx.receive("OrderQueue", top=2, timeout=5)  # the same group again
    taken = first + second
    assert seqs(taken) == [1, 2, 3, 4]
    assert len({m.conversation_handle for m in taken}) == 1
    locked = dialog_of(taken[0])

    # the other group is free; the locked one is not handed out
    rest = await other.receive("OrderQueue", top=10, timeout=5)
    assert seqs(rest) == [1, 2, 3, 4]
    assert {dialog_of(m) for m in rest} != {locked}

    # new messages for the locked conversation arrive while it is held
    shop_handle = next(
        h for h, bodies in sent.items() if f"dialog='{locked}'" in bodies[0].decode()
    )
    for n in (4, 5):
        body = f"<order dialog='{locked}' n='{n}'/>".encode()
        await shop.send(shop_handle, ORDER, body)
        sent[shop_handle].append(body)
    await wait_ready(warehouse, 2)
    assert await other.receive("OrderQueue", top=10, timeout=0.3) == []

    await tx.rollback()
    again = await warehouse.receive("OrderQueue", top=10, timeout=5)
    assert seqs(again) == [1, 2, 3, 4, 5, 6]
    assert [m.message_body for m in again] == sent[shop_handle]
    assert_exactly_once_in_order(rest + again, sent)
    assert await other.receive("OrderQueue", top=10, timeout=0.3) == []
    for client in (shop, warehouse, other):
        await client.close()


async def test_closing_the_connection_mid_transaction_releases_the_lock(
    deployment: Deployment,
) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    sent = await order_dialogs(shop, warehouse, dialogs=1, per_dialog=5)
    leaving = await deployment.daemons["beta"].client()
    tx = await leaving.begin_transaction()
    got = await tx.receive("OrderQueue", top=3, timeout=5)
    assert seqs(got) == [1, 2, 3]
    await tx.send(got[0].conversation_handle, CONFIRMATION, b"<from-a-closed-client/>")
    assert await warehouse.receive("OrderQueue", top=10, timeout=0.3) == []

    await leaving.close()
    again = await drain(warehouse, "OrderQueue", 5, timeout=15)
    assert seqs(again) == [1, 2, 3, 4, 5]
    assert_exactly_once_in_order(again, sent)
    with pytest.raises(ClientError):
        await tx.commit()
    await assert_nothing_was_sent(shop, warehouse)
    for client in (shop, warehouse):
        await client.close()


async def test_closing_the_connection_while_a_transactional_receive_waits(
    deployment: Deployment,
) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    leaving = await deployment.daemons["beta"].client()
    tx = await leaving.begin_transaction()
    waiting = asyncio.create_task(tx.receive("OrderQueue", top=10, timeout=10))
    await asyncio.sleep(0.3)  # the RECEIVE is waiting in the daemon
    await leaving.close()
    with pytest.raises(ClientError):
        await waiting
    sent = await order_dialogs(shop, warehouse, dialogs=1, per_dialog=4)
    again = await drain(warehouse, "OrderQueue", 4, timeout=15)
    assert seqs(again) == [1, 2, 3, 4]
    assert_exactly_once_in_order(again, sent)
    for client in (shop, warehouse):
        await client.close()


async def test_refusals_are_typed_errors(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    sent = await order_dialogs(shop, warehouse, dialogs=1, per_dialog=2)

    await warehouse.alter_queue("OrderQueue", False)
    with pytest.raises(QueueDisabled) as refused:
        await warehouse.receive("OrderQueue", top=10, timeout=0.2)
    assert refused.value.retriable
    async with warehouse.transaction() as tx:
        with pytest.raises(QueueDisabled):
            await tx.receive("OrderQueue", top=10, timeout=0.2)
    await warehouse.alter_queue("OrderQueue", True)

    tx = await warehouse.begin_transaction()
    got = await tx.receive("OrderQueue", top=10, timeout=5)
    assert seqs(got) == [1, 2]
    assert_exactly_once_in_order(got, sent)
    await tx.commit()
    for finished in (tx.commit(), tx.rollback(), tx.receive("OrderQueue", timeout=0.1)):
        with pytest.raises(TransactionError) as error:
            await finished
        assert type(error.value) is TransactionError  # not TransactionRolledBack
    rolled = await warehouse.begin_transaction()
    await rolled.rollback()
    with pytest.raises(TransactionError):
        await rolled.send(got[0].conversation_handle, CONFIRMATION, b"<late/>")
    assert await warehouse.receive("OrderQueue", top=10, timeout=0.3) == []
    for client in (shop, warehouse):
        await client.close()


async def test_move_conversation_of_a_group_the_transaction_itself_holds(
    deployment: Deployment,
) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    sent = await order_dialogs(shop, warehouse, dialogs=1, per_dialog=2)
    (shop_handle,) = sent
    new_group = uuid.uuid4()
    async with warehouse.transaction() as tx:
        got = await tx.receive("OrderQueue", top=10, timeout=5)
        assert seqs(got) == [1, 2]
        await tx.move_conversation(got[0].conversation_handle, new_group)
    await shop.send(shop_handle, ORDER, b"<order dialog='0' n='2'/>")
    later = await drain(warehouse, "OrderQueue", 1, timeout=15)
    assert seqs(later) == [3]
    assert later[0].conversation_group_id == new_group


ENDINGS: dict[str, dict[str, Any]] = {
    "end": {},
    "with_error": {"error_code": 50001, "description": "cancelled"},
    "with_cleanup": {"cleanup": True},
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
async def test_an_end_of_a_conversation_held_by_a_transaction_leaves_no_ghosts(
    deployment: Deployment, ending: str
) -> None:
    """SPEC §6, R-DLG-10: END CONVERSATION (plain, WITH ERROR or WITH CLEANUP) removes what
    waits of its conversation in this side's queue. Ended from another connection while a
    transaction holds that conversation's messages (the END does not wait for the group's
    lock, as SQL Server's does; the outcome is the same), then rolled back: the messages
    the rollback puts back are not handed out again, and the other dialog's are, whole
    and in order."""
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    other = await deployment.daemons["beta"].client()
    sent = await order_dialogs(shop, warehouse, dialogs=2, per_dialog=3)
    tx = await warehouse.begin_transaction()
    got = await tx.receive("OrderQueue", top=10, timeout=5)
    assert seqs(got) == [1, 2, 3]
    handle = got[0].conversation_handle
    await other.end_conversation(handle, **ENDINGS[ending])
    await tx.rollback()
    assert await ready_count(other) == 3
    first = await other.receive("OrderQueue", top=10, timeout=2)
    assert len(first) == 3, "a RECEIVE with messages ready returns them"
    assert handle not in {m.conversation_handle for m in first}
    bodies = [m.message_body for m in first]
    assert any(bodies == orders for orders in sent.values()), "one whole dialog, in order"
    assert_exactly_once_in_order(first)
    assert await other.receive("OrderQueue", top=10, timeout=1) == []
