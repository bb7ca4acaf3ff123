"""Requests whose fields have the wrong shape, read off the client port, get typed errors
in their place and break nothing (SPEC §7: bad input gets a clear error; R-CLIENT-1).

The SDK never sends them; a client of its own may: an ``op`` that is a list or an
object, a ``withdraw`` naming no request id. Each is answered with ``invalid_request``
(the connection goes on), and the requests after it in the same read are answered too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from protocol.client_wire import ClientFrame, ClientFrameKind, ClientFrameReader, encode_frame
from tests.daemons import solo_broker
from tests.raw_client import logged_in

ODD: list[dict[str, Any]] = [
    {"op": ["receive"]},
    {"op": {"receive": 1}},
    {"op": None},
    {"op": "withdraw"},
    {"op": "withdraw", "request": "2"},
    {"op": "withdraw", "request": [2]},
    {"op": "withdraw", "request": True},
]


async def test_odd_requests_in_one_read_each_get_their_error(tmp_path: Path) -> None:
    """Every odd request of ODD, written at once with a ping after them, is answered in
    its place: ``invalid_request`` for each, then the ping's answer."""
    async with solo_broker(tmp_path, "127.0.0.1") as broker:
        reader, writer = await logged_in(broker)
        frames = [ClientFrame(ClientFrameKind.REQUEST, 2 + n, m) for n, m in enumerate(ODD)]
        frames.append(ClientFrame(ClientFrameKind.REQUEST, 2 + len(ODD), {"op": "ping"}))
        writer.write(b"".join(encode_frame(f) for f in frames))
        answers: list[ClientFrame] = []
        wire = ClientFrameReader()
        while len(answers) < len(frames):
            data = await reader.read(65536)
            assert data, f"closed after {len(answers)} answers: {answers}"
            answers += wire.feed(data)
        writer.close()
        by_id = {a.request_id: a for a in answers}
        for n, meta in enumerate(ODD):
            answer = by_id[2 + n]
            assert answer.kind is ClientFrameKind.ERROR, (meta, answer)
            assert answer.meta["code"] == "invalid_request", (meta, answer.meta)
        assert by_id[2 + len(ODD)].kind is ClientFrameKind.RESPONSE
