"""Outcomes the SDK reports across lost connections, and how long a request waits for
one (SPEC §6, outcomes; R-DLG-1). A real daemon; between the client and its client
port, where a test needs to hold back an answer or silence the daemon, a fault proxy
(``brokerd.tools.faultproxy``).

* A SEND with an idempotency key whose connection went after it was committed and
  before its answer is written again on the next connection. If it cannot be written
  again (no connection within ``give_up_after``, or the client is closed first), its
  outcome is still unknown: it fails with ``OutcomeUnknown``, never with
  ``NotConnected`` ("never sent: nothing happened").
* A request waiting for a connection fails with ``NotConnected`` once
  ``give_up_after`` has passed, also while an attempt to connect hangs (a daemon's
  host that accepts and then says nothing).
* Request ids are 32-bit on the wire and id 0 answers no request (a goodbye, a
  refusal of the connection): a connection that has carried 2**32 requests goes on
  answering each request, refusals included.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient, Dialog, Reconnect
from brokerd.tools.faultproxy import FaultProxy
from brokerd.tools.launcher import Daemon
from protocol.dialog import END_DIALOG
from protocol.errors import NotConnected, OutcomeUnknown, SystemMessageType
from tests.daemons import solo_daemon

HOST = "127.0.0.154"
PROXY = "127.0.0.155"
HELD = 4.0
"""Seconds the proxy holds each chunk while a SEND's answer must not reach the client."""


@contextlib.asynccontextmanager
async def _proxied_client(
    daemon: Daemon, reconnect: Reconnect
) -> AsyncIterator[tuple[FaultProxy, BrokerClient]]:
    """A client of ``daemon`` through a fault proxy in front of its client port."""
    proxy = FaultProxy(PROXY, daemon.client_port, daemon.client_host, daemon.client_port)
    await proxy.start()
    try:
        client = await BrokerClient.connect(
            PROXY, daemon.client_port, token_file=daemon.token_file, reconnect=reconnect
        )
        try:
            yield proxy, client
        finally:
            await client.close()
    finally:
        await proxy.stop()


async def _cut(proxy: FaultProxy, client: BrokerClient) -> None:
    """Cut the client's connection at the proxy, and wait until the client has seen it go."""
    proxy.cut()
    deadline = time.monotonic() + 10
    while client.connected:
        assert time.monotonic() < deadline, "the client did not see its connection go"
        await asyncio.sleep(0.01)


async def _committed_and_cut(
    proxy: FaultProxy, client: BrokerClient, direct: BrokerClient, dialog: Dialog
) -> asyncio.Future[int]:
    """A SEND with a key, committed by the daemon (its message is received on the far
    side, through ``direct``), whose answer the proxy holds; then the connection is cut
    and new ones are refused. Returns the SEND's future, still waiting."""
    proxy.plan.delay = HELD
    sending = client.send_nowait(dialog.handle, "DEFAULT", b"order 1", key="order-1")
    (got,) = await direct.receive("Q2", timeout=30)
    assert got.message_body == b"order 1"
    assert not sending.done(), "the proxy still holds the SEND's answer"
    proxy.plan.refuse = True
    await _cut(proxy, client)
    assert not sending.done(), "a SEND with a key is kept for the next connection"
    return sending


async def test_a_keyed_send_that_committed_is_not_called_never_sent_when_no_connection_comes(
    tmp_path: Path,
) -> None:
    """SPEC §6, outcomes (R-DLG-1): the SEND was written and committed, its answer lost
    with the connection, and no connection came within ``give_up_after``: its outcome
    is unknown to the client, so ``OutcomeUnknown``; ``NotConnected`` would tell the
    application that nothing happened while the message is on its way."""
    async with solo_daemon(tmp_path, HOST) as (deployment, direct):
        daemon = deployment.daemons["solo"]
        policy = Reconnect(initial=0.05, maximum=0.2, give_up_after=1.0)
        async with _proxied_client(daemon, policy) as (proxy, client):
            dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
            sending = await _committed_and_cut(proxy, client, direct, dialog)
            with pytest.raises(OutcomeUnknown):
                await asyncio.wait_for(sending, 30)


async def test_a_keyed_send_that_committed_is_not_called_never_sent_when_the_client_closes(
    tmp_path: Path,
) -> None:
    """SPEC §6, outcomes (R-DLG-1): as above, but the application closes the client
    while the SEND waits to be written again: still ``OutcomeUnknown``, not
    ``NotConnected``."""
    async with solo_daemon(tmp_path, HOST) as (deployment, direct):
        daemon = deployment.daemons["solo"]
        policy = Reconnect(initial=0.05, maximum=0.2, give_up_after=60.0)
        async with _proxied_client(daemon, policy) as (proxy, client):
            dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
            sending = await _committed_and_cut(proxy, client, direct, dialog)
            await client.close()
            with pytest.raises(OutcomeUnknown):
                await asyncio.wait_for(sending, 10)


async def test_a_request_waits_no_longer_than_give_up_after_while_a_login_hangs(
    tmp_path: Path,
) -> None:
    """SPEC §6, outcomes: a request that finds no connection fails with ``NotConnected``
    once ``give_up_after`` has passed, even while the attempt to connect waits for a
    daemon that accepted and says nothing (up to the client's ``timeout``, 10 s)."""
    async with solo_daemon(tmp_path, HOST) as (deployment, _):
        daemon = deployment.daemons["solo"]
        policy = Reconnect(initial=0.05, maximum=0.2, give_up_after=0.5)
        async with _proxied_client(daemon, policy) as (proxy, client):
            dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
            proxy.plan.blackhole = True
            await _cut(proxy, client)
            await asyncio.sleep(0.2)  # the next attempt to connect is under way, and hangs
            started = time.monotonic()
            with pytest.raises(NotConnected):
                await asyncio.wait_for(dialog.send("DEFAULT", b"nobody answers"), 30)
            waited = time.monotonic() - started
            assert waited < 3.0, f"waited {waited:.1f} s for a connection, give_up_after is 0.5 s"


async def test_a_refusal_at_the_request_id_wrap_reaches_its_caller(tmp_path: Path) -> None:
    """SPEC §6, outcomes: every request gets its answer. A connection that has carried
    2**32 - 2 requests (its id counter set there) writes on: the refusal of each SEND
    reaches its caller, none waits for ever (an ERROR for id 0 would read as the daemon
    refusing the whole connection), and the connection stays in use."""
    async with solo_daemon(tmp_path, HOST) as (_, client):
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        connection = client._keeper.connection
        assert connection is not None
        connection._ids = itertools.count(2**32 - 2)
        for _ in range(3):
            with pytest.raises(SystemMessageType):
                await asyncio.wait_for(dialog.send(END_DIALOG, b""), 10)
        assert await asyncio.wait_for(dialog.send("DEFAULT", b"after"), 10) == 1
        assert client.reconnects == 0
