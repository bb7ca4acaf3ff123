"""A request body over the daemon's ``limits.max_message_size`` gets a clear error and
loses nothing (SPEC §6, outcomes; R-OBJ-7).

The daemon reads no client frame whose body is over that limit: it says why in an ERROR
that answers no request and closes the connection. The login's answer carries the limit,
so the SDK refuses such a body before writing it (``MessageTooLarge``, not sent), keeps
its connection, and the application goes on. Should one be written all the same (a
daemon that does not say its limit), what the closed connection left unanswered fails
with the daemon's reason instead of being written again for ever, and the client
reconnects.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from protocol.errors import MessageTooLarge, OutcomeUnknown
from tests.daemons import drain, solo_daemon

HOST = "127.0.0.157"
LIMIT = 4000
LIMITS = f"[limits]\nmax_message_size = {LIMIT}\n"


async def test_a_body_over_the_limit_is_refused_before_it_is_sent(tmp_path: Path) -> None:
    """A SEND (with an idempotency key or without), a ``send_many`` whose bodies add up
    past the limit, and a SEND in a transaction fail at once with ``MessageTooLarge``; the
    connection stays up, the transaction goes on, and only the messages within the limit
    arrive, once each, in order (R-DLG-1)."""
    async with solo_daemon(tmp_path, HOST, extra=LIMITS) as (_, client):
        handle = await client.begin_dialog("//solo/S1", "//solo/S2")
        for key in (None, "order-1"):
            with pytest.raises(MessageTooLarge, match=r"5000 bytes.*max_message_size of 4000"):
                await asyncio.wait_for(client.send(handle, body=b"x" * 5000, key=key), 5)
        with pytest.raises(MessageTooLarge, match="send_many"):
            await client.send_many([(handle, "DEFAULT", b"y" * 3000)] * 2)
        assert await client.send(handle, body=b"first") == 1
        async with client.transaction() as tx:
            with pytest.raises(MessageTooLarge):
                await tx.send(handle, body=b"z" * (LIMIT + 1))
            await tx.send(handle, body=b"second")
        assert await client.send(handle, body=b"w" * LIMIT) == 3
        assert client.reconnects == 0
        got = await drain(client, "Q2", 3, timeout=10)
        assert [m.message_body[:6] for m in got] == [b"first", b"second", b"w" * 6]
        assert await client.receive("Q2", timeout=0.3) == []


async def test_a_body_the_daemon_refuses_fails_with_its_reason_and_is_not_repeated(
    tmp_path: Path,
) -> None:
    """Written all the same, an oversized SEND ends the connection; the daemon's reason
    reaches the application (``OutcomeUnknown`` naming the limit), a SEND with an
    idempotency key is not written again and again, and the client reconnects."""
    async with solo_daemon(tmp_path, HOST, extra=LIMITS) as (_, client):
        handle = await client.begin_dialog("//solo/S1", "//solo/S2")
        keeper = client._keeper
        for key in (None, "order-1"):
            await keeper.wait_connected(10)
            keeper.max_body = None  # as a daemon that does not say its limit leaves it
            with pytest.raises(OutcomeUnknown, match=r"closed the connection.*exceeds the limit"):
                await asyncio.wait_for(client.send(handle, body=b"x" * 5000, key=key), 10)
        assert await asyncio.wait_for(client.send(handle, body=b"after"), 10) == 1
        assert keeper.max_body == LIMIT  # learnt again at the new login
        assert client.reconnects >= 2
        (got,) = await drain(client, "Q2", 1, timeout=10)
        assert got.message_body == b"after"
