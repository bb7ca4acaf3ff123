"""The SDK's receive loops with real daemons: ``consume`` is exactly once, ``messages``
at most once (brokerd/sdk/client.py says which is which).

SPEC R-DLG-1 (every message to the application exactly once, in sequence order) and §6
(SEND and RECEIVE in one client transaction: commit makes them permanent together,
rollback puts the received messages back). The consumer that dies is a separate
process, SIGKILLed between its RECEIVE and its COMMIT.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient, ReceivedMessage, Transaction
from brokerd.tools.example import CONFIRMATION
from brokerd.tools.launcher import Daemon, Deployment
from tests.daemons import assert_exactly_once_in_order
from tests.sdk.orders import order_dialogs, ready_count

REPO = Path(__file__).resolve().parents[2]

CONSUMER = """
import asyncio, sys
from brokerd.sdk.client import BrokerClient

async def main(mode, host, port, token_file, reply_type):
    client = await BrokerClient.connect(host, int(port), token_file=token_file)

    async def handler(tx, messages):
        for m in messages:
            await tx.send(m.conversation_handle, reply_type, b"<from-a-killed-consumer/>")
        print("HOLDING", len(messages), flush=True)
        await asyncio.sleep(300)  # killed here: after RECEIVE, before COMMIT

    if mode == "consume":
        await client.consume("OrderQueue", handler, top=100, timeout=5)
    else:
        async for m in client.messages("OrderQueue", top=100, timeout=5):
            print("HOLDING", 1, flush=True)
            await asyncio.sleep(300)  # killed here, the batch already removed

asyncio.run(main(*sys.argv[1:]))
"""


async def _run_and_kill(mode: str, daemon: Daemon, tmp_path: Path) -> None:
    """Start a consumer process, wait until it holds a batch, SIGKILL it."""
    script = tmp_path / "consumer.py"
    script.write_text(CONSUMER)
    err_path = tmp_path / f"{mode}.err"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    with err_path.open("wb") as stderr:
        consumer = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            mode,
            daemon.host,
            str(daemon.client_port),
            str(daemon.token_file),
            CONFIRMATION,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=str(REPO),
        )
    try:
        assert consumer.stdout is not None
        line = await asyncio.wait_for(consumer.stdout.readline(), 30)
        assert line.startswith(b"HOLDING"), err_path.read_text()
        consumer.kill()  # SIGKILL, that one process only
        assert await asyncio.wait_for(consumer.wait(), 10) == -9
    finally:
        if consumer.returncode is None:
            consumer.kill()
            await consumer.wait()


async def _consume_all(client: BrokerClient, expected: int) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    stop = asyncio.Event()

    async def keep(tx: Transaction, messages: list[ReceivedMessage]) -> None:
        got.extend(messages)
        if len(got) >= expected:
            stop.set()

    await asyncio.wait_for(client.consume("OrderQueue", keep, timeout=1, stop=stop), 60)
    return got


async def test_a_consumer_killed_between_receive_and_commit_loses_nothing(
    deployment: Deployment, tmp_path: Path
) -> None:
    alpha, beta = deployment.daemons["alpha"], deployment.daemons["beta"]
    shop = await alpha.client()
    warehouse = await beta.client()
    sent = await order_dialogs(shop, warehouse, dialogs=3, per_dialog=5)

    await _run_and_kill("consume", beta, tmp_path)

    fresh = await beta.client()
    again = await _consume_all(fresh, 15)
    per = assert_exactly_once_in_order(again, sent)
    assert sorted(len(s) for s in per.values()) == [5, 5, 5]
    assert await fresh.receive("OrderQueue", top=10, timeout=0.3) == []
    # The killed handler's replies were never committed, so never sent.
    assert await fresh.view("transmission_queue") == []
    assert await shop.receive("ClientQueue", top=10, timeout=1.0) == []
    for client in (shop, warehouse, fresh):
        await client.close()


async def test_the_autocommit_loop_is_at_most_once(deployment: Deployment, tmp_path: Path) -> None:
    """The documented difference: a batch taken by ``messages`` is gone with its reader."""
    alpha, beta = deployment.daemons["alpha"], deployment.daemons["beta"]
    shop = await alpha.client()
    warehouse = await beta.client()
    await order_dialogs(shop, warehouse, dialogs=1, per_dialog=5)
    await _run_and_kill("messages", beta, tmp_path)
    assert await ready_count(warehouse) == 0
    await shop.close()
    await warehouse.close()


async def test_consume_commits_the_handlers_sends_with_the_batch(deployment: Deployment) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    sent = await order_dialogs(shop, warehouse, dialogs=2, per_dialog=3)
    got: list[ReceivedMessage] = []
    stop = asyncio.Event()

    async def reply(tx: Transaction, messages: list[ReceivedMessage]) -> None:
        for m in messages:
            await tx.send(m.conversation_handle, CONFIRMATION, m.message_body)
        got.extend(messages)
        if len(got) >= 6:
            stop.set()

    assert await warehouse.consume("OrderQueue", reply, timeout=1, stop=stop) == 6
    assert_exactly_once_in_order(got, sent)
    replies: list[ReceivedMessage] = []
    async for m in shop.messages("ClientQueue", timeout=1):
        replies.append(m)
        if len(replies) == 6:
            break
    assert sorted(m.message_body for m in replies) == sorted(b for v in sent.values() for b in v)
    await shop.close()
    await warehouse.close()


async def test_a_handler_that_raises_puts_its_batch_back_in_order(
    deployment: Deployment,
) -> None:
    shop = await deployment.daemons["alpha"].client()
    warehouse = await deployment.daemons["beta"].client()
    sent = await order_dialogs(shop, warehouse, dialogs=1, per_dialog=4)

    async def fail(tx: Transaction, messages: list[ReceivedMessage]) -> None:
        await tx.send(messages[0].conversation_handle, CONFIRMATION, b"<never/>")
        raise RuntimeError("the application failed")

    with pytest.raises(RuntimeError, match="application failed"):
        await warehouse.consume("OrderQueue", fail, top=2, timeout=5)
    assert await ready_count(warehouse) == 4
    again = await _consume_all(warehouse, 4)
    assert_exactly_once_in_order(again, sent)
    assert await shop.receive("ClientQueue", timeout=0.5) == []
    await shop.close()
    await warehouse.close()
