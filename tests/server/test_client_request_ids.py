"""Request ids on the client port (R-CLIENT-1; docs/design.md "Security defaults": what
a client may hold in the daemon is bounded against a hostile client).

A reply names its request by the id the client chose, so two requests in flight with
one id could not be told apart by their replies, and the bytes a connection's requests
hold until their replies (``limits.client_pending_mb``) would be released for both at
the first reply: a client reusing ids would hold bodies beyond the bound. The SDK never reuses an
id in flight; a client that does is refused (``invalid_request``, in an ERROR frame of
id 0, which answers no request) and its connection closed. An id whose request was
answered may be used again.

The daemon runs in the test's process on 127.0.11.1, with ``client_pending_mb = 1``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokerd.server.daemon import Broker
from brokerd.tools.launcher import Deployment
from protocol.client_wire import ClientFrame, ClientFrameKind, ClientFrameReader, encode_frame
from protocol.errors import InvalidRequest
from tests.daemons import SOLO_DATABASE, in_process
from tests.raw_client import logged_in, request

HOST = "127.0.11.1"
BODY = b"x" * (400 * 1024)
"""Less than half of ``client_pending_mb``: a RECEIVE of it may wait (those waiting may
hold half of it), and does not hold the reading."""


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    limits = "[limits]\nclient_pending_mb = 1\n"
    daemon = Deployment(tmp_path).add("solo", HOST, SOLO_DATABASE, extra=limits)
    async with in_process(daemon.config_path) as running:
        yield running


async def _answers(
    reader: asyncio.StreamReader, wire: ClientFrameReader, count: int
) -> tuple[list[ClientFrame], bool]:
    """Frames read until ``count`` came or the daemon closed (True then)."""
    answers: list[ClientFrame] = []
    async with asyncio.timeout(10):
        while len(answers) < count:
            data = await reader.read(1 << 20)
            if not data:
                return answers, True
            answers += wire.feed(data)
    return answers, False


@pytest.mark.parametrize("kind", [ClientFrameKind.REQUEST, ClientFrameKind.RESPONSE])
async def test_an_id_reused_while_its_request_is_in_flight_is_refused(
    broker: Broker, kind: ClientFrameKind
) -> None:
    """A RECEIVE that waits, with a body of 400 KiB (the daemon holds it until the
    answer), then another frame with its id (a ping, or a frame that is not a request):
    answering that one would release the RECEIVE's bytes, so RECEIVEs written so, one
    after another, would hold 400 KiB each while the connection counted none. It is
    refused with
    ``invalid_request`` in an ERROR of id 0 and the connection closed, nothing of it
    answered; an id answered already may be used again."""
    reader, writer = await logged_in(broker)
    wire = ClientFrameReader()
    try:
        for _ in range(2):
            writer.write(request(5, {"op": "ping"}))
            answers, closed = await _answers(reader, wire, 1)
            assert [(a.kind, a.request_id) for a in answers] == [(ClientFrameKind.RESPONSE, 5)]
        receive = {"op": "receive", "queue": "Q1", "timeout": -1}
        writer.write(
            request(7, receive, BODY)
            + encode_frame(ClientFrame(kind, 7, {"op": "ping"}))
            + request(8, {"op": "ping"})
        )
        answers, closed = await _answers(reader, wire, 2)
        assert [(a.kind, a.request_id) for a in answers] == [(ClientFrameKind.ERROR, 0)], answers
        assert answers[0].meta["code"] == InvalidRequest.code
        assert "request id 7" in answers[0].meta["message"]
        rest, closed = await _answers(reader, wire, 1)
        assert closed and not rest, rest
        async with asyncio.timeout(5):
            while broker.client_sessions:
                await asyncio.sleep(0.01)
    finally:
        writer.close()
