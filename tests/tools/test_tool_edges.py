"""Edges of the test tools the reliability guarantees are proved with (SPEC R-DLG-1,
R-DLG-6, R-PROTO-5): the fault proxy (brokerd/tools/faultproxy.py) between real sockets,
and the launcher (brokerd/tools/launcher.py) with real daemons.

A blackholed connection must stay silent both ways: neither peer's close (FIN or reset)
may cross it, or a peer learns from the proxy what only its liveness check should find.
A stall or a blackhole set while the proxy is waiting in a read or sleeping a delay
must hold back the chunk it is handling. The launcher's ``start`` must return only
once the daemon listens, and never run two processes of one daemon.

Loopback addresses 127.0.0.194-196 only; run in a network namespace of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokerd.tools.faultproxy import FaultPlan, FaultProxy
from brokerd.tools.launcher import Deployment
from protocol.frames import FrameType, encode_header
from tests.daemons import SOLO_DATABASE

PROXY_HOST = "127.0.0.194"
SERVER_HOST = "127.0.0.195"
DAEMON_HOST = "127.0.0.196"
QUIET = 0.5
"""How long a peer must see nothing for a fault to count as holding."""


def frame(frame_type: FrameType, counter: int, body: bytes) -> bytes:
    return encode_header(1, frame_type, 3, len(body), counter) + body


class Server:
    """The 'server broker': records every connection's bytes and how it ended."""

    def __init__(self) -> None:
        self.received: list[bytearray] = []
        self.ended: list[asyncio.Future[str]] = []
        self.writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, SERVER_HOST, 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        assert self._server is not None
        for writer in self.writers:
            writer.transport.abort()
        self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = bytearray()
        ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.received.append(data)
        self.ended.append(ended)
        self.writers.append(writer)
        try:
            while chunk := await reader.read(4096):
                data += chunk
            ended.set_result("eof")
        except OSError as exc:
            ended.set_result(f"error {exc!r}")


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    s = Server()
    await s.start()
    yield s
    await s.stop()


@pytest.fixture
async def proxy(server: Server) -> AsyncIterator[FaultProxy]:
    assert server._server is not None
    target = int(server._server.sockets[0].getsockname()[1])
    async with FaultProxy(PROXY_HOST, 0, SERVER_HOST, target, FaultPlan()) as p:
        yield p


async def connected(
    proxy: FaultProxy, server: Server
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client connection through the proxy, proved live by one frame reaching the server."""
    reader, writer = await asyncio.open_connection(PROXY_HOST, proxy.port)
    hello = frame(FrameType.KEEPALIVE, 0, b"")
    writer.write(hello)
    await writer.drain()
    deadline = time.monotonic() + 2.0
    while not (server.received and bytes(server.received[-1]) == hello):
        assert time.monotonic() < deadline, "the proxy does not forward"
        await asyncio.sleep(0.01)
    return reader, writer


def reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# -- the fault proxy -------------------------------------------------------------------


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_client_closing_a_blackholed_connection_is_not_seen_by_the_server(
    proxy: FaultProxy, server: Server, how: str
) -> None:
    """The server of a blackholed connection must find it silent by its own heartbeats
    (R-PROTO-5): the client's FIN or reset must not cross the blackhole."""
    _, writer = await connected(proxy, server)
    proxy.plan.blackhole = True
    if how == "close":
        writer.close()
    else:
        reset(writer)
    await asyncio.sleep(QUIET)
    assert not server.ended[0].done(), server.ended[0].result()
    assert proxy.stats.bytes_up == len(frame(FrameType.KEEPALIVE, 0, b""))


async def test_a_client_closing_after_sending_into_a_blackhole_is_not_seen_by_the_server(
    proxy: FaultProxy, server: Server
) -> None:
    _, writer = await connected(proxy, server)
    proxy.plan.blackhole = True
    writer.write(frame(FrameType.FRAGMENT, 1, b"into the void"))
    await writer.drain()
    await asyncio.sleep(0.1)
    writer.close()
    await asyncio.sleep(QUIET)
    assert not server.ended[0].done(), server.ended[0].result()
    assert len(server.received[0]) == len(frame(FrameType.KEEPALIVE, 0, b""))


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_server_closing_a_blackholed_connection_is_not_seen_by_the_client(
    proxy: FaultProxy, server: Server, how: str
) -> None:
    reader, _ = await connected(proxy, server)
    proxy.plan.blackhole = True
    if how == "close":
        server.writers[0].close()
    else:
        reset(server.writers[0])
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(1), QUIET)


async def test_cut_still_resets_a_blackholed_connection(proxy: FaultProxy, server: Server) -> None:
    reader, writer = await connected(proxy, server)
    proxy.plan.blackhole = True
    writer.write(b"x")
    await writer.drain()
    await asyncio.sleep(0.1)
    proxy.cut()
    with contextlib.suppress(ConnectionResetError):
        assert await asyncio.wait_for(reader.read(), 2.0) == b""
    assert await asyncio.wait_for(server.ended[0], 2.0) != ""
    writer.close()


async def test_a_stall_holds_the_next_chunk_of_an_idle_connection(
    proxy: FaultProxy, server: Server
) -> None:
    """The proxy waits in a read on an idle connection; a stall set meanwhile must hold
    what the client sends next, not forward it and stall after."""
    _, writer = await connected(proxy, server)
    before = len(server.received[0])
    proxy.plan.stall = True
    one = frame(FrameType.FRAGMENT, 1, b"held back")
    writer.write(one)
    await writer.drain()
    await asyncio.sleep(QUIET)
    assert len(server.received[0]) == before, "a stalled direction forwarded a chunk"
    proxy.plan.stall = False
    deadline = time.monotonic() + 2.0
    while len(server.received[0]) < before + len(one):
        assert time.monotonic() < deadline, "the chunk held by the stall never came"
        await asyncio.sleep(0.01)
    assert bytes(server.received[0][before:]) == one
    writer.close()


async def test_a_blackhole_set_during_a_delay_swallows_the_delayed_chunk(
    proxy: FaultProxy, server: Server
) -> None:
    _, writer = await connected(proxy, server)
    before = len(server.received[0])
    proxy.plan.delay = 0.4
    writer.write(frame(FrameType.FRAGMENT, 1, b"delayed"))
    await writer.drain()
    await asyncio.sleep(0.1)  # the proxy sleeps the delay with the chunk in hand
    proxy.plan.blackhole = True
    await asyncio.sleep(0.4 + QUIET)
    assert len(server.received[0]) == before, "a blackholed connection forwarded a chunk"
    writer.close()


async def test_a_blackhole_cleared_again_leaves_the_connection_silent(
    proxy: FaultProxy, server: Server
) -> None:
    reader, writer = await connected(proxy, server)
    proxy.plan.blackhole = True
    writer.write(b"lost")
    await writer.drain()
    await asyncio.sleep(0.1)
    proxy.plan.blackhole = False
    writer.write(frame(FrameType.FRAGMENT, 2, b"still lost"))
    await writer.drain()
    server.writers[0].write(b"nor this")
    await asyncio.sleep(QUIET)
    assert len(server.received[0]) == len(frame(FrameType.KEEPALIVE, 0, b""))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(1), 0.1)
    writer.close()


# -- the launcher ------------------------------------------------------------------------


def _processes_of(config: Path) -> list[int]:
    """PIDs of the live processes whose command line names ``config``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(config).encode() in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def _listens(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def test_start_of_a_daemon_already_starting_waits_until_it_listens(tmp_path: Path) -> None:
    """A second ``start`` while the first still waits for the daemon (a restart cancelled
    and started again, as the soak's heal does) must not return before it listens."""
    d = Deployment(tmp_path)
    daemon = d.add("solo", DAEMON_HOST, SOLO_DATABASE)
    errors: list[BaseException] = []

    def first() -> None:
        try:
            d.start("solo")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=first)
    try:
        thread.start()
        deadline = time.monotonic() + 10
        while daemon.process is None:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert not (daemon.directory / "ready").exists(), "started too fast to test"
        d.start("solo")
        assert (daemon.directory / "ready").exists(), "start returned before the daemon listened"
        assert _listens(DAEMON_HOST, 4022)
        thread.join(30)
        assert not errors, errors
        assert _processes_of(daemon.config_path) == [daemon.process.pid]
    finally:
        thread.join(30)
        d.stop_all()
    assert _processes_of(daemon.config_path) == []


def test_concurrent_starts_run_one_process_and_leave_none_behind(tmp_path: Path) -> None:
    d = Deployment(tmp_path)
    daemon = d.add("solo", DAEMON_HOST, SOLO_DATABASE)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def start() -> None:
        barrier.wait()
        try:
            d.start("solo")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert daemon.running
        assert daemon.process is not None
        assert _processes_of(daemon.config_path) == [daemon.process.pid]
    finally:
        for t in threads:
            t.join(60)
        d.stop_all()
        leftover = _processes_of(daemon.config_path)
        for pid in leftover:  # do not leave the defect's orphan running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
    assert leftover == []
