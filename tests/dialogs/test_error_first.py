"""An Error that ends a dialog is received before the dialog's other waiting messages
(R-DLG-10), also by a RECEIVE that races its arrival.

The endpoint's state becomes ER when the Error is accepted; the Error becomes receivable
when the commit that stores it is done, a moment later. A RECEIVE in between used to
hand out the messages that waited, then the Error. Now the conversation group waits for
the Error's commit, so whatever a RECEIVE takes from it comes after (SPEC §5: ER means
the Error is in the queue).

The broker runs in this process (``Broker``, as ``brokerd run`` builds it) so that the
test can RECEIVE the moment the state changes. Inside one database, END CONVERSATION
WITH ERROR still travels as a message through the local link and arrives as one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from brokerd.dialogs.endpoints.states import State
from brokerd.server.daemon import Broker
from protocol.dialog import ERROR
from tests.daemons import client_of, solo_broker

HOST = "127.0.0.246"


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    async with solo_broker(tmp_path, HOST) as broker:
        yield broker


@pytest.mark.parametrize("waiting", [1, 2, 5])
async def test_a_receive_racing_an_arriving_error_gets_the_error_first(
    broker: Broker, waiting: int
) -> None:
    client = await client_of(broker)
    try:
        handle = await client.begin_dialog("//solo/S1", "//solo/S2")
        for n in range(waiting):
            await client.send(handle, body=f"before the error {n}".encode())
    finally:
        await client.close()
    engine = broker.engine
    db, initiator = engine.directory.endpoint(handle)
    target = db.by_key[(initiator.conversation_id, False)]
    index = db.ready["Q2"]
    await _until(lambda: index.count >= waiting, 0.01)  # the messages wait, ready

    ending = asyncio.ensure_future(
        engine.conversation_verbs.end_conversation(handle, 7, "the order was cancelled")
    )
    await _until(lambda: target.state is State.ERROR)  # the Error is accepted: RECEIVE now
    first = await engine.receive_verbs.receive("Q2", top=100, timeout=5)
    await ending
    rest = await engine.receive_verbs.receive("Q2", top=100, timeout=0)
    types = [row["message_type_name"] for row in [*first, *rest]]
    assert types[0] == ERROR, types
    assert sorted(types[1:]) == ["DEFAULT"] * waiting


async def test_a_receive_racing_the_lifetimes_error_gets_the_error_first(broker: Broker) -> None:
    """R-DLG-9: the lifetime passes while two messages wait; the broker queues its own
    Error (state ER at once, the Error ready at its commit). A RECEIVE in between takes
    nothing of the group before it."""
    client = await client_of(broker)
    try:
        handle = await client.begin_dialog("//solo/S1", "//solo/S2", lifetime=2)
        for n in range(2):
            await client.send(handle, body=f"before the lifetime {n}".encode())
    finally:
        await client.close()
    engine = broker.engine
    db, initiator = engine.directory.endpoint(handle)
    target = db.by_key[(initiator.conversation_id, False)]
    await _until(lambda: db.ready["Q2"].count >= 2, 0.01)
    await _until(lambda: target.state is State.ERROR, timeout=10)
    first = await engine.receive_verbs.receive("Q2", top=100, timeout=5)
    rest = await engine.receive_verbs.receive("Q2", top=100, timeout=0)
    types = [row["message_type_name"] for row in [*first, *rest]]
    assert types == [ERROR, "DEFAULT", "DEFAULT"], types


async def _until(condition: Callable[[], bool], pause: float = 0, timeout: float = 5) -> None:
    """Wait until ``condition`` holds, looking again every ``pause`` s (0: every turn of the
    event loop, so that the test acts in the very turn it changes); fail after ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(pause)
