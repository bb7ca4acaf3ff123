"""``BrokerClient.drain``: a producer that pipelines ``send_nowait`` without awaiting each
reply waits in ``drain`` while the socket takes nothing, so what it holds stays bounded by
the kernel's buffers; once the daemon reads again, every message arrives once, in order
(SPEC §6, R-DLG-1)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from brokerd.tools.launcher import Deployment
from tests.daemons import SOLO_DATABASE, drain, running

HOST = "127.0.0.151"
MB = 1024 * 1024
BODY = 64 * 1024


async def test_drain_holds_a_producer_while_the_daemon_reads_nothing(tmp_path: Path) -> None:
    """While the daemon is stopped (SIGSTOP), ``send_nowait`` followed by ``drain`` stops
    returning within a few megabytes (the kernel's socket buffers), where a loop without
    it would queue all 256 MiB in the producer's memory; after SIGCONT every SEND
    completes with its sequence number and arrives in order."""
    d = Deployment(tmp_path)
    daemon = d.add("solo", HOST, SOLO_DATABASE)
    with running(d):
        assert daemon.process is not None
        client = await daemon.client()
        try:
            handle = await client.begin_dialog("//solo/S1", "//solo/S2")
            futures: list[asyncio.Future[int]] = []
            blocked = False
            os.kill(daemon.process.pid, signal.SIGSTOP)
            try:
                for n in range(4096):  # 256 MiB at most
                    body = n.to_bytes(4, "big") + bytes(BODY - 4)
                    futures.append(client.send_nowait(handle, body=body))
                    try:
                        await asyncio.wait_for(client.drain(), 1.0)
                    except TimeoutError:
                        blocked = True
                        break
            finally:
                os.kill(daemon.process.pid, signal.SIGCONT)
            assert blocked, "drain never waited while the daemon read nothing"
            assert len(futures) * BODY < 64 * MB, len(futures)
            await client.drain()
            assert await asyncio.gather(*futures) == list(range(1, len(futures) + 1))
            got = await drain(client, "Q2", len(futures), timeout=60)
            assert [int.from_bytes(m.message_body[:4], "big") for m in got] == list(
                range(len(futures))
            )
        finally:
            await client.close()
