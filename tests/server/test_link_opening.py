"""A link whose connection is lost, or whose wait times out, as its handshake completes
(R-PROTO-5, R-DLG-6): alpha runs in the test's process on 127.0.34.1 and dials beta
(127.0.34.2, a process of its own) through a relay of the test's own on 127.0.34.3, in
the test's event loop, which holds back beta's WELCOME (the handshake's last message)
on the first connection until the test lets it go. The retransmission wait is 30 s:
a message that arrives in seconds went on the connection the link opened, or on the
one it dialled at once after losing it, not on a retransmission.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from brokerd.sdk.client import BrokerClient
from brokerd.tools.launcher import Deployment
from protocol.frames import HEADER_SIZE, decode_header
from tests.daemons import client_of, drain, in_process
from tests.routing.deploy import R, addr, database, queue_of

A, B, RELAY = "127.0.34.1", "127.0.34.2", "127.0.34.3"
SENDER = "//opening/Sender"
TARGET = "//opening/Target"
SLOW_RETRY = {"initial": 30.0, "maximum": 60.0, "ack_delay": 0.005, "delayed_retry": 30.0}
CONNECT_TIMEOUT = 1.0


class WelcomeRelay:
    """TCP from 127.0.34.3:4022 to beta. On the first connection, what beta sends after
    its first frame (HELLO_REPLY) is held until :meth:`release`; :attr:`held` is set
    once a whole frame (WELCOME) waits. Later connections pass everything."""

    def __init__(self) -> None:
        self.held = asyncio.Event()
        self.connections = 0
        self._pending = bytearray()
        self._holding = True
        self._to_alpha: asyncio.StreamWriter | None = None
        self._to_beta: asyncio.StreamWriter | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, RELAY, 4022)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def release(self, *, then_close: bool) -> None:
        """Write the held bytes to alpha at once; ``then_close``: and end both sides of
        that connection right after them (alpha reads WELCOME, then the end of stream)."""
        assert self._to_alpha is not None and self._to_beta is not None
        self._holding = False
        self._to_alpha.write(bytes(self._pending))
        self._pending.clear()
        if then_close:
            self._to_alpha.write_eof()
            self._to_alpha.close()
            self._to_beta.transport.abort()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        first = self.connections == 1
        beta_reader, beta_writer = await asyncio.open_connection(B, 4022)
        self._writers += [writer, beta_writer]
        if first:
            self._to_alpha, self._to_beta = writer, beta_writer
        for task in (
            self._pass(reader, beta_writer, hold=False),
            self._pass(beta_reader, writer, hold=first),
        ):
            t = asyncio.get_running_loop().create_task(task)
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _pass(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, hold: bool
    ) -> None:
        passed_first = False
        first = bytearray()
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if not (hold and self._holding):
                    writer.write(data)
                    continue
                if not passed_first:
                    first += data
                    end = _frame_end(first)
                    if end is None:
                        continue
                    writer.write(bytes(first[:end]))
                    passed_first = True
                    data = bytes(first[end:])
                self._pending += data
                if _frame_end(self._pending) is not None:
                    self.held.set()
            if writer.can_write_eof() and not writer.is_closing():
                writer.write_eof()


def _frame_end(data: bytearray) -> int | None:
    """Where the first frame of ``data`` ends, once it is whole."""
    if len(data) < HEADER_SIZE:
        return None
    end = HEADER_SIZE + decode_header(bytes(data[:HEADER_SIZE]), 1 << 26).length
    return end if len(data) >= end else None


@contextlib.asynccontextmanager
async def alpha_beta_relay(
    root: Path,
) -> AsyncIterator[tuple[WelcomeRelay, BrokerClient, BrokerClient]]:
    """Beta started, the relay listening, alpha in this process; clients of both."""
    deployment = Deployment(root, SLOW_RETRY)
    deployment.add(
        "alpha",
        A,
        database("A", [SENDER], [R("ToTarget", addr(RELAY), TARGET)]),
        endpoint_extra=f"connect_timeout = {CONNECT_TIMEOUT}\n",
    )
    deployment.add("beta", B, database("B", [TARGET], [R("Back", addr(A), SENDER)]))
    relay = WelcomeRelay()
    try:
        deployment.start("beta")
        await relay.start()
        async with in_process(deployment.daemons["alpha"].config_path) as alpha:
            a = await client_of(alpha)
            b = await deployment.daemons["beta"].client()
            try:
                yield relay, a, b
            finally:
                await a.close()
                await b.close()
    finally:
        await relay.stop()
        deployment.stop_all()


async def test_a_connection_lost_as_its_handshake_completes_is_dialled_again_at_once(
    tmp_path: Path,
) -> None:
    """R-PROTO-5, R-DLG-6: the first connection ends right after beta's WELCOME, before
    alpha's dial has returned: the link dials again at once, and the message goes on the
    second connection, not after its 30 s retransmission wait."""
    async with alpha_beta_relay(tmp_path) as (relay, a, b):
        handle = await a.begin_dialog(SENDER, TARGET, database="A")
        await a.send(handle, body=b"through a lost connection")
        await asyncio.wait_for(relay.held.wait(), 10)
        relay.release(then_close=True)
        got = await b.receive(queue_of(TARGET), timeout=10.0)
        assert [m.message_body for m in got] == [b"through a lost connection"]
        assert relay.connections == 2


async def test_a_handshake_that_completes_as_its_wait_times_out_keeps_its_connection(
    tmp_path: Path,
) -> None:
    """R-PROTO-5, R-DLG-6: alpha's wait for the handshake (``connect_timeout``, 1 s)
    expires in the loop turn before beta's WELCOME is read, so the handshake completes
    and the link starts sending its three messages of 1 MiB (sixteen fragments each,
    written some per turn) while the wait ends in a timeout: the connection, open, is
    kept and carries them all, at once."""
    bodies = [bytes([n]) * (1 << 20) for n in range(1, 4)]
    async with alpha_beta_relay(tmp_path) as (relay, a, b):
        handle = await a.begin_dialog(SENDER, TARGET, database="A")
        for body in bodies:
            await a.send(handle, body=body)
        await asyncio.wait_for(relay.held.wait(), 10)
        # Block the loop past the handshake's deadline (the timer runs in the next turn),
        # then write WELCOME from a timer due after it, in that same turn: alpha reads it
        # one turn after its wait was released by the timeout.
        time.sleep(CONNECT_TIMEOUT + 0.1)
        loop = asyncio.get_running_loop()
        loop.call_at(loop.time(), lambda: relay.release(then_close=False))
        got = await drain(b, queue_of(TARGET), 3, timeout=10.0)
        assert [m.message_body for m in got] == bodies
        assert relay.connections == 1
