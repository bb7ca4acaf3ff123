"""What a client connection's requests awaiting their replies hold in the daemon, metas
included (R-CLIENT-1; docs/design.md "Security defaults": every size and count read from
the wire is bounded against a hostile client).

A connection's requests awaiting replies may carry ``limits.client_pending_mb`` of
bodies and metas before the daemon stops reading it. A RECEIVE or GET CONVERSATION GROUP
may wait for ever, so those waiting may hold half of that at most: one more is refused
(``invalid_request``) rather than taken. A meta may be up to 1 MiB, so without it 1,024
waiting RECEIVEs with padded metas would hold a gigabyte; and waiting requests alone
never hold the reading, where the withdraw that ends them could not be read.

The daemon runs in the test's process on 127.0.32.1, with ``client_pending_mb = 1``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokerd.server.daemon import Broker
from brokerd.tools.launcher import Deployment
from protocol.client_wire import ClientFrame, ClientFrameKind, ClientFrameReader
from protocol.errors import InvalidRequest
from tests.daemons import SOLO_DATABASE, in_process
from tests.raw_client import logged_in, request

HOST = "127.0.32.1"
WAIT_FOR_EVER = {"op": "receive", "queue": "Q1", "timeout": -1}


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    limits = "[limits]\nclient_pending_mb = 1\n"
    daemon = Deployment(tmp_path).add("solo", HOST, SOLO_DATABASE, extra=limits)
    async with in_process(daemon.config_path) as running:
        yield running


async def _until(
    reader: asyncio.StreamReader,
    wire: ClientFrameReader,
    answers: dict[int, ClientFrame],
    request_id: int,
) -> None:
    """Read into ``answers`` (by request id) until the answer of ``request_id`` is in it
    (5 s at most)."""
    async with asyncio.timeout(5):
        while request_id not in answers:
            data = await reader.read(1 << 20)
            assert data, f"the daemon closed the connection; answered: {sorted(answers)}"
            answers.update((frame.request_id, frame) for frame in wire.feed(data))


async def test_waiting_receives_count_their_metas(broker: Broker) -> None:
    """R-CLIENT-1: eight RECEIVEs that wait for ever, each with a meta padded to 300 KiB
    (2.4 MB, more than the connection's 1 MiB): the first is taken, the seven after it
    would pass half the bound and are refused with ``invalid_request`` at once; a ping
    written after them is answered, and a withdraw ends the one that waits (SPEC §6)."""
    reader, writer = await logged_in(broker)
    wire = ClientFrameReader()
    padded = {**WAIT_FOR_EVER, "padding": "x" * (300 * 1024)}
    try:
        receives = b"".join(request(i, padded) for i in range(10, 18))
        writer.write(receives + request(30, {"op": "ping"}))
        answers: dict[int, ClientFrame] = {}
        await _until(reader, wire, answers, 30)
        refused = sorted(i for i, a in answers.items() if a.kind is ClientFrameKind.ERROR)
        assert refused == list(range(11, 18)), sorted(answers)
        assert all(answers[i].meta["code"] == InvalidRequest.code for i in refused)
        assert "waiting" in answers[11].meta["message"], answers[11].meta
        writer.write(request(31, {"op": "withdraw", "request": 10}))
        await _until(reader, wire, answers, 31)
        assert answers[31].meta == {"withdrawn": True}
        await _until(reader, wire, answers, 10)
        assert answers[10].kind is ClientFrameKind.RESPONSE
    finally:
        writer.close()


async def test_a_connection_whose_receives_wait_still_reads_its_withdraw(broker: Broker) -> None:
    """R-CLIENT-1, SPEC §6 (withdraw): a RECEIVE that waits for ever with a body of
    400 KiB, then one with a body of 900 KiB: both waiting would hold 1.3 MB, past the
    connection's 1 MiB, and the daemon would stop reading it while nothing it holds can
    end, so that the withdraw written next would never be read. The second is refused
    (``invalid_request``); the withdraw is read and ends the first."""
    reader, writer = await logged_in(broker)
    wire = ClientFrameReader()
    try:
        writer.write(
            request(10, WAIT_FOR_EVER, b"x" * (400 * 1024))
            + request(11, WAIT_FOR_EVER, b"x" * (900 * 1024))
            + request(12, {"op": "withdraw", "request": 10})
        )
        answers: dict[int, ClientFrame] = {}
        await _until(reader, wire, answers, 12)
        assert answers[12].meta == {"withdrawn": True}
        assert answers[11].kind is ClientFrameKind.ERROR
        assert answers[11].meta["code"] == InvalidRequest.code
        await _until(reader, wire, answers, 10)
        assert answers[10].kind is ClientFrameKind.RESPONSE
    finally:
        writer.close()
