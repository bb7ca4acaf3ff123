"""The requests a connection leaves unanswered when it ends after a newer one was made
(SPEC §6, outcomes).

A daemon that stops says which request it read last and stops reading; it closes each
client connection once it has answered what it read. A client that makes a request
meanwhile connects again, and when a new connection is up before the old one ends, the
old one's unanswered requests are settled as any lost connection's are: those the
goodbye said were never read, and SENDs with idempotency keys, are written again on the
new connection, not failed with a bare ``ClientError``; a client closed meanwhile
closes the old connection too, and they fail with ``BrokerStopping`` (never executed).

A real daemon runs in the test's process on 127.0.32.12; its session of the old
connection is told to stop reading and closed, as its graceful stop does, while its
client port still takes the new connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient, Reconnect
from brokerd.server.client_listener import ClientSession
from brokerd.server.daemon import Broker
from protocol.errors import BrokerStopping
from tests.daemons import solo_broker

HOST = "127.0.32.12"


@contextlib.asynccontextmanager
async def _replaced(
    broker: Broker,
) -> AsyncIterator[tuple[BrokerClient, ClientSession, list[asyncio.Future[int]]]]:
    """A client whose connection's daemon session stopped reading (as a stopping daemon
    does) just before a SEND with a key and one without were written, and which made a
    new connection since (for a ping); the old session, still open, and the two SENDs."""
    port = broker.config.client
    client = await BrokerClient.connect(
        port.host,
        port.port,
        token_file=port.token_file,
        reconnect=Reconnect(initial=0.02, maximum=0.05, give_up_after=5),
    )
    try:
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        (old,) = broker.client_sessions
        keyed = client.send_nowait(dialog.handle, "DEFAULT", b"keyed", key="k-1")
        plain = client.send_nowait(dialog.handle, "DEFAULT", b"plain")
        old.stop_reading()  # before the two are written: neither is read
        async with asyncio.timeout(5):
            while client.connected:  # until the goodbye has come
                await asyncio.sleep(0.01)
            await client.ping()  # on a new connection: the old one said it stops
        assert len(broker.client_sessions) == 2
        yield client, old, [keyed, plain]
    finally:
        await client.close()


async def test_requests_left_by_a_replaced_connection_are_written_again(tmp_path: Path) -> None:
    """SPEC §6 (outcomes): the old connection closes after the new one is up: both SENDs
    are written again on the new one and answered, and each message is received once,
    in order."""
    async with solo_broker(tmp_path, HOST) as broker, _replaced(broker) as (client, old, sends):
        old.close()
        async with asyncio.timeout(5):
            sequence_numbers = [await send for send in sends]
            received = [m for _ in range(2) for m in await client.receive("Q2", timeout=5)]
        assert sequence_numbers == [1, 2]
        assert [m.message_body for m in received] == [b"keyed", b"plain"]
        assert not await client.receive("Q2", timeout=0)


async def test_a_client_closed_with_a_replaced_connection_closes_it(tmp_path: Path) -> None:
    """SPEC §6 (outcomes): the client is closed while the old connection is still open
    (its daemon session, which reads it no more, would keep it open): it is closed too,
    and both SENDs, which the daemon said it never read, fail with ``BrokerStopping``
    (safe to send again) at once; nothing was queued."""
    async with solo_broker(tmp_path, HOST) as broker:
        async with _replaced(broker) as (client, _, sends):
            await client.close()
            async with asyncio.timeout(5):  # the daemon, not reading it, never closes it
                for send in sends:
                    with pytest.raises(BrokerStopping, match="not executed"):
                        await send
        checker = await BrokerClient.connect(
            broker.config.client.host,
            broker.config.client.port,
            token_file=broker.config.client.token_file,
        )
        assert not await checker.receive("Q2", timeout=0)
        await checker.close()
