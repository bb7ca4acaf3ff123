"""A client that writes requests and never reads the replies holds a bounded amount of
the daemon's memory.

The design's security defaults: "every size and count read from the wire is bounded
before memory is allocated" (SPEC §7, R-CLIENT-1's client port; R-PROTO-4's pages are
each bounded, 1 MiB). A ``view`` request of a hundred bytes asks for a reply of up to
a page; a client that pipelines many of them and leaves the replies unread must not make
the daemon keep every page in its write buffer: the listener stops reading the client's
requests, and answering them, while its replies wait to leave. The daemon runs in the
test's process so that the test can read what it holds for the connection.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from brokerd.server.client_listener import ClientSession
from brokerd.server.daemon import Broker
from protocol.client_wire import ClientFrame, ClientFrameKind, ClientFrameReader, encode_frame
from tests.daemons import client_of, solo_broker, wait_until
from tests.raw_client import logged_in

DIALOGS = 400
REQUESTS = 400
HELD_AT_MOST = 16 * 1024 * 1024


def _held(broker: Broker, others: set[ClientSession]) -> int:
    """Bytes the daemon holds to write to the connections not in ``others``."""
    held = 0
    for session in broker.client_sessions - others:
        if session.transport is not None:
            held += session.transport.get_write_buffer_size()
    return held


async def test_a_client_that_never_reads_its_replies_holds_bounded_memory(
    tmp_path: Path,
) -> None:
    """R-PROTO-4, R-CLIENT-1: REQUESTS view pages of DIALOGS endpoints asked for and never
    read; what the daemon holds for the connection stays under HELD_AT_MOST, and the
    daemon goes on answering everyone else."""
    async with solo_broker(tmp_path, "127.0.0.1") as broker:
        client = await client_of(broker)
        for _ in range(DIALOGS):
            await client.begin_dialog("//solo/S1", "//solo/S2")
        rows, _ = await client.view_page("conversation_endpoints", limit=1000)
        assert len(rows) == DIALOGS
        others = set(broker.client_sessions)

        reader, writer = await logged_in(broker)
        request = {"op": "view", "name": "conversation_endpoints", "limit": 1000}
        for n in range(REQUESTS):
            writer.write(encode_frame(ClientFrame(ClientFrameKind.REQUEST, 2 + n, request)))
        await writer.drain()

        most = 0
        for _ in range(60):  # three seconds to answer what it will
            await asyncio.sleep(0.05)
            most = max(most, _held(broker, others))
        assert most < HELD_AT_MOST, f"held {most >> 20} MiB for a client that reads nothing"

        # Everyone else is answered meanwhile, and the reader's requests once it reads.
        assert (await client.ping())["instance"]
        frames = ClientFrameReader()
        answered: list[ClientFrame] = []
        while len(answered) < REQUESTS:
            data = await asyncio.wait_for(reader.read(1 << 20), 30)
            assert data, f"closed after {len(answered)} of {REQUESTS} replies"
            answered += frames.feed(data)
        # each once (replies come as requests complete, not necessarily in their order)
        assert sorted(f.request_id for f in answered) == [2 + n for n in range(REQUESTS)]
        assert {f.meta.get("rows_in_body") for f in answered} == {DIALOGS}
        writer.close()
        await wait_until(lambda: _no_session_but(broker, others))
        await client.close()


async def _no_session_but(broker: Broker, others: set[ClientSession]) -> bool:
    return not (broker.client_sessions - others)
