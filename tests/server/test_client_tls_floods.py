"""Connections that never finish their TLS handshake on a TLS client port (R-CLIENT-1;
docs/design.md "Security defaults"): they are among the at most 128 connections that
wait for their login (``MAX_PENDING_LOGINS``) from their TCP accept, so a newer one
closes the oldest, as on a plain port, and a flood of them cannot take every file the
daemon may open (the login timeout alone would let them hold one each for 10 s; that
flood is tested beside the plain port's, in test_client_floods.py).

The daemon runs in the test's process on 127.0.11.20 (its client port TLS, its login
timeout long enough that only the bound can close a connection during the test).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from brokerd.sdk.client import BrokerClient
from brokerd.server.client_listener import MAX_PENDING_LOGINS
from brokerd.tools.launcher import Deployment
from tests.daemons import SOLO_DATABASE, in_process

HOST = "127.0.11.20"


async def _closed_by_the_daemon(reader: asyncio.StreamReader) -> bool:
    try:
        return await reader.read(1) == b""
    except ConnectionError:
        return True


async def test_connections_in_their_tls_handshake_count_among_those_not_logged_in(
    tmp_path: Path,
) -> None:
    """R-CLIENT-1: :data:`MAX_PENDING_LOGINS` connections that never send a byte of
    their handshake, then one more: the oldest is closed at once (not after the login
    timeout of 60 s), and a TLS client that logs in meanwhile is served."""
    daemon = Deployment(tmp_path).add(
        "solo", HOST, SOLO_DATABASE, client_tls=True, client_extra="login_timeout = 60"
    )
    async with in_process(daemon.config_path) as broker:
        port = broker.config.client.port
        silent = [await asyncio.open_connection(HOST, port) for _ in range(MAX_PENDING_LOGINS)]
        try:
            newest = await asyncio.open_connection(HOST, port)
            silent.append(newest)
            async with asyncio.timeout(5):
                assert await _closed_by_the_daemon(silent[0][0])
            client = await BrokerClient.connect(
                HOST, port, token_file=daemon.token_file, tls_ca_file=daemon.tls_ca_file
            )
            try:
                assert (await client.ping())["instance"] == "solo"
            finally:
                await client.close()
            # the client's connection closed the next oldest
            async with asyncio.timeout(5):
                assert await _closed_by_the_daemon(silent[1][0])
        finally:
            for _, writer in silent:
                writer.close()
