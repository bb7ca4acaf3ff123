"""Edges of the SDK's outcomes (SPEC §6, outcomes; docs/errors.md): a request that can
never be written, a producer's ``drain`` while its daemon is away, a transaction of a
client that does not reconnect, and activation readers (``serve``) that meet a daemon
gone for good, refused credentials, or a handler that ends its transaction itself.
Real daemons: ``Solo`` on 127.0.0.167:4022, ``//solo/S1`` (Q1) sends to ``//solo/S2``
(Q2)."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path

import pytest

from brokerd.sdk.client import ReceivedMessage, Reconnect, Transaction
from protocol.client_wire import MAX_META_BYTES
from protocol.errors import (
    AuthenticationFailed,
    LocalProtocolError,
    NotConnected,
    TransactionLost,
)
from tests.daemons import drain, solo_daemon

HOST = "127.0.0.167"
QUICK = Reconnect(initial=0.05, maximum=0.5, give_up_after=60)


async def test_a_request_too_long_to_write_leaves_the_others_going(tmp_path: Path) -> None:
    """A request whose meta exceeds the client wire's limit cannot be written: it fails at
    once, not sent, and is not kept as in flight, so a lost connection neither writes it
    again nor stalls the requests that wait for the next connection (they go, in order)."""
    async with solo_daemon(tmp_path, HOST) as (d, client):
        handle = await client.begin_dialog("//solo/S1", "//solo/S2")
        with pytest.raises(LocalProtocolError, match="exceeds the limit"):
            await client.send(handle, "T" * MAX_META_BYTES, b"x", key="too-long")
        await asyncio.to_thread(d.kill, "solo")
        later = asyncio.ensure_future(client.send(handle, body=b"after", key="after"))
        await asyncio.sleep(0.2)
        await asyncio.to_thread(d.start, "solo")
        assert await asyncio.wait_for(later, 15) == 1
        (got,) = await drain(client, "Q2", 1, timeout=10)
        assert got.message_body == b"after"


async def test_drain_gives_up_when_no_connection_comes(tmp_path: Path) -> None:
    """``drain`` waits for a connection as a request does, for at most
    ``Reconnect.give_up_after``: then NotConnected, as the SENDs it waited for get."""
    async with solo_daemon(tmp_path, HOST) as (d, _):
        client = await d.daemons["solo"].client(
            reconnect=Reconnect(initial=0.05, maximum=0.2, give_up_after=1.0)
        )
        handle = await client.begin_dialog("//solo/S1", "//solo/S2")
        await asyncio.to_thread(d.kill, "solo")
        await asyncio.sleep(0.1)
        future = client.send_nowait(handle, body=b"waits")
        started = time.monotonic()
        with pytest.raises(NotConnected):
            await asyncio.wait_for(client.drain(), 10)
        assert time.monotonic() - started < 5
        with pytest.raises(NotConnected):
            await asyncio.wait_for(future, 5)
        await client.close()


async def test_a_transaction_of_a_client_that_does_not_reconnect_is_lost(
    tmp_path: Path,
) -> None:
    """docs/errors.md: a transaction whose connection was lost fails every later call with
    TransactionLost, also for a client made with ``reconnect=False``; its ROLLBACK has
    nothing to do (the daemon rolled it back), and the messages it had received are in
    their queue again."""
    async with solo_daemon(tmp_path, HOST) as (d, admin):
        handle = await admin.begin_dialog("//solo/S1", "//solo/S2")
        await admin.send(handle, body=b"kept")
        await admin.close()
        for stop in (d.kill, d.stop):
            client = await d.daemons["solo"].client(reconnect=False)
            tx = await client.begin_transaction()
            assert len(await tx.receive("Q2", timeout=5)) == 1
            await tx.send(handle, body=b"never")
            await asyncio.to_thread(stop, "solo")
            await asyncio.sleep(0.2)
            with pytest.raises(TransactionLost):
                await tx.send(handle, body=b"never either")
            with pytest.raises(TransactionLost):
                await tx.commit()
            await tx.rollback()  # nothing to do
            await client.close()
            await asyncio.to_thread(d.start, "solo")
        client = await d.daemons["solo"].client()
        (got,) = await drain(client, "Q2", 1, timeout=10)
        assert got.message_body == b"kept"
        assert await client.receive("Q2", timeout=0.3) == []
        await client.close()


async def _handled_by(messages: list[ReceivedMessage]) -> None:
    await asyncio.sleep(0)


async def test_serve_until_idle_ends_once_its_daemon_is_gone_for_good(tmp_path: Path) -> None:
    """SPEC §6 (activation): a daemon gone for good makes the readers idle, so
    ``serve(until_idle=True)`` ends, also for a client that does not reconnect and whose
    daemon said it was stopping (every later request is refused with BrokerStopping)."""
    async with solo_daemon(tmp_path, HOST) as (d, _):
        client = await d.daemons["solo"].client(reconnect=False)

        async def handler(tx: Transaction, messages: list[ReceivedMessage]) -> None:
            await _handled_by(messages)

        activation = client.serve("Q2", handler, timeout=0.2, interval=0.2, until_idle=False)
        running = asyncio.ensure_future(activation.run())
        await asyncio.sleep(0.5)
        await asyncio.to_thread(d.stop, "solo")
        idle = client.serve("Q2", handler, timeout=0.2, interval=0.2, until_idle=True)
        assert await asyncio.wait_for(idle.run(), 15) == 0
        activation.stop.set()
        assert await asyncio.wait_for(running, 15) == 0
        await client.close()


async def test_serve_raises_refused_credentials(tmp_path: Path) -> None:
    """SPEC §6 (activation): an error no retry mends stops every reader and is raised by
    ``serve``: credentials refused when the client logs in again after a restart (the
    token was changed) are raised, not lost with a reader that silently went away."""
    async with solo_daemon(tmp_path, HOST) as (d, _):
        client = await d.daemons["solo"].client(reconnect=QUICK)

        async def handler(tx: Transaction, messages: list[ReceivedMessage]) -> None:
            await _handled_by(messages)

        activation = client.serve("Q2", handler, timeout=0.2, interval=0.2)
        running = asyncio.ensure_future(activation.run())
        await asyncio.sleep(0.5)
        await asyncio.to_thread(d.stop, "solo")
        d.daemons["solo"].token_file.write_text(secrets.token_hex(32))
        await asyncio.to_thread(d.start, "solo")
        with pytest.raises(AuthenticationFailed):
            await asyncio.wait_for(running, 20)
        await client.close()


async def test_serve_goes_on_when_the_handler_ends_the_transaction_itself(
    tmp_path: Path,
) -> None:
    """A handler may COMMIT (to learn its SENDs' sequence numbers) or ROLLBACK the batch's
    transaction itself, as the body of ``client.transaction()`` may: the reader does not
    end it a second time (which the daemon refuses), and goes on with the next batch."""
    async with solo_daemon(tmp_path, HOST) as (_, client):
        handle = await client.begin_dialog("//solo/S1", "//solo/S2")
        for n in range(4):
            await client.send(handle, body=b"%d" % n)
        seen: list[bytes] = []

        async def handler(tx: Transaction, messages: list[ReceivedMessage]) -> None:
            seen.extend(m.message_body for m in messages)
            if messages[0].message_body == b"1" and seen.count(b"1") == 1:
                await tx.rollback("not now")
                return
            await tx.send(messages[0].conversation_handle, body=b"reply")
            await tx.commit()

        activation = client.serve("Q2", handler, top=1, timeout=0.2, interval=0.2, until_idle=True)
        assert await asyncio.wait_for(activation.run(), 20) == 4
        assert seen == [b"0", b"1", b"1", b"2", b"3"]
        assert len(await drain(client, "Q1", 4, timeout=10)) == 4
