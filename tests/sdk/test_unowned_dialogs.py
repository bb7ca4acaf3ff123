"""A BEGIN DIALOG whose caller stopped waiting after it was written (SPEC §6, outcomes).

Its answer, when it comes, names a conversation no one has the handle of: without a
lifetime it would be kept for ever, listed in ``conversation_endpoints`` and counted in
``endpoint_ages`` as a leaked dialog. Nothing crosses the network before a
conversation's first SEND (SPEC §6), so the SDK ends it WITH CLEANUP, which tells no one,
as it rolls back a BEGIN TRANSACTION in the same case. One cancelled while it waits for
a connection is never written.

A real daemon runs in the test's process on 127.0.32.22.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from brokerd.server.daemon import Broker
from tests.daemons import client_of, solo_broker

HOST = "127.0.32.22"


async def _read(broker: Broker) -> None:
    """Until the daemon has read a request of its one client connection, not yet answered."""
    (session,) = broker.client_sessions
    while not session.unanswered:
        await asyncio.sleep(0)


async def test_a_dialog_begun_for_a_caller_that_stopped_waiting_is_ended(tmp_path: Path) -> None:
    """SPEC §6 (outcomes, END CONVERSATION WITH CLEANUP), R-PROTO-4: BEGIN DIALOG
    cancelled once the daemon has read it: the conversation it began leaves the
    ``conversation_endpoints`` view, and neither queue receives anything of it (no Error,
    no EndDialog: no one was told); a dialog begun by another call is kept."""
    async with solo_broker(tmp_path, HOST) as broker:
        client = await client_of(broker)
        try:
            kept = await client.begin_dialog("//solo/S1", "//solo/S2")
            cancelled = asyncio.ensure_future(client.begin_dialog("//solo/S1", "//solo/S2"))
            await _read(broker)
            cancelled.cancel()
            async with asyncio.timeout(5):
                while len(await client.conversation_endpoints()) > 1:
                    await asyncio.sleep(0.02)
            (endpoint,) = await client.conversation_endpoints()
            assert endpoint.conversation_handle == kept.handle
            assert cancelled.cancelled()
            assert not await client.receive("Q1", timeout=0)
            assert not await client.receive("Q2", timeout=0)
        finally:
            await client.close()


KEYED_HOST = "127.0.27.1"


async def test_a_dialog_a_caller_keyed_is_kept_for_the_calls_its_key_names_it_to(
    tmp_path: Path,
) -> None:
    """SPEC §6 (outcomes): a BEGIN DIALOG carrying the caller's own key, cancelled once the
    daemon has read it, is not ended by the SDK: its key names the dialog to every later
    call with that key (here the caller's retry, answered with the same handle), which
    must find it there and may send on it. Only a dialog whose key the SDK made up, which
    no one else can name, is ended WITH CLEANUP."""
    async with solo_broker(tmp_path, KEYED_HOST) as broker:
        client = await client_of(broker)
        try:
            cancelled = asyncio.ensure_future(
                client.begin_dialog("//solo/S1", "//solo/S2", key="order-9")
            )
            await _read(broker)
            cancelled.cancel()
            again = await client.begin_dialog("//solo/S1", "//solo/S2", key="order-9")
            connection = client._keeper.connection
            assert connection is not None
            async with asyncio.timeout(5):  # every answer in, and what the SDK made of each
                while connection._pending:
                    await asyncio.sleep(0.01)
            handles = [e.conversation_handle for e in await client.conversation_endpoints()]
            assert handles == [again.handle]
            await again.send(body=b"<order id='9'/>")
            (got,) = await client.receive("Q2", timeout=5)
            assert got.message_body == b"<order id='9'/>"
        finally:
            await client.close()
