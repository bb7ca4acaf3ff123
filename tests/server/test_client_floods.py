"""Clients at the edges of what the client port and the admin port hold for them
(R-CLIENT-1, R-OPS-1; docs/design.md "Security defaults" and "The admin port"): a
client that never reads what the daemon writes to it, before its login or on the admin
port, a client that writes requests by the ten thousand without waiting for their
answers, and connections by the hundred that never log in.

Each daemon runs in the test's process on 127.0.0.120 (its admin port on
127.0.0.120:8022), so that the test sees its client sessions; the one whose open files
are limited runs in a process of its own on 127.0.0.121."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.server.daemon import Broker
from brokerd.tools.launcher import Deployment
from protocol.client_wire import (
    CLIENT_WIRE_VERSION,
    MAGIC,
    ClientFrame,
    ClientFrameKind,
    ClientFrameReader,
    encode_frame,
)
from protocol.errors import InvalidRequest
from tests.daemons import SOLO_DATABASE, in_process
from tests.raw_client import logged_in

HOST = "127.0.0.120"


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    daemon = Deployment(tmp_path).add("solo", HOST, SOLO_DATABASE, client_extra="login_timeout = 1")
    async with in_process(daemon.config_path) as running:
        yield running


def _unread_socket(host: str, port: int) -> socket.socket:
    """A connected non-blocking socket that takes little from the daemon (a small receive
    buffer) and that the test never reads."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, port))
    sock.setblocking(False)
    return sock


def _write_until_refused(sock: socket.socket, data: bytes, most: int) -> int:
    """Write ``data`` again and again, up to ``most`` bytes, until the socket takes no
    more; the bytes written."""
    written = 0
    while written < most:
        try:
            written += sock.send(data)
        except BlockingIOError:
            break
    return written


async def test_a_client_that_never_reads_is_closed_at_its_login_deadline(
    broker: Broker,
) -> None:
    """R-CLIENT-1 (docs/design.md "Security defaults"): a connection that has not logged
    in after ``client.login_timeout`` is closed, also one that asked for answers (frames
    that are not requests, each answered with an error) and never read them. It must not
    stay open holding the daemon's memory for its unread answers."""
    config = broker.config.client
    sock = _unread_socket(config.host, config.port)
    try:
        # a RESPONSE frame of meta {}: not a request, answered with an InvalidRequest
        frame = struct.pack(">2sBBIII", MAGIC, CLIENT_WIRE_VERSION, 3, 7, 2, 0) + b"{}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        written = 0
        while loop.time() < deadline:  # until the daemon stops reading
            more = _write_until_refused(sock, frame * 4096, 16 * 1024 * 1024)
            written += more
            await asyncio.sleep(0.2)
            if written and not more:
                break
        assert written > 100_000
        assert broker.client_sessions, "the connection is served"
        start = time.monotonic()
        while broker.client_sessions and time.monotonic() - start < 10:
            await asyncio.sleep(0.1)
        assert not broker.client_sessions, (
            "a connection that never logged in is still open "
            f"{time.monotonic() - start:.0f} s after its login deadline"
        )
    finally:
        sock.close()


ADMIN_PORT = 8022
FLOODS = 64
"""Connections that never read: as many as the admin port serves at once."""


def _unsent_bytes(host: str, port: int) -> list[int]:
    """The bytes each of the server's connections on ``host``:``port`` has queued for its
    peer and not sent (``/proc/net/tcp``'s tx_queue of each established socket)."""
    address = int.from_bytes(socket.inet_aton(host), "little")
    local = f"{address:08X}:{port:04X}"
    queued = []
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1] == local and fields[3] == "01":  # ESTABLISHED
                queued.append(int(fields[4].split(":")[0], 16))
    return queued


async def _get(host: str, path: str) -> bytes:
    """The answer to a GET of ``path`` on the admin port (b"" if the port hung up)."""
    reader, writer = await asyncio.open_connection(host, ADMIN_PORT)
    try:
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
        )
        async with asyncio.timeout(10):
            return await reader.read()
    except ConnectionError:
        return b""
    finally:
        writer.close()


async def test_clients_that_never_read_do_not_silence_the_health_checks(
    broker: Broker,
) -> None:
    """R-OPS-1: ``/healthz`` answers 200 while the process runs. Clients that ask for pages
    and never read the answers (each connection's answers fill the kernel's buffers and
    then the port's) must not take every connection the port serves for ever: the health
    check of a prober that reads its answer still gets it."""
    host = broker.config.admin.host
    assert host == HOST and broker.config.admin.port == ADMIN_PORT
    page = await _get(host, "/")
    assert page.startswith(b"HTTP/1.1 200")
    request = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"
    per_connection = (8 * 1024 * 1024) // len(page) + 1  # twice what the kernel holds
    socks = [_unread_socket(host, ADMIN_PORT) for _ in range(FLOODS)]
    try:
        pending = {sock: request * per_connection for sock in socks}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        before: list[int] = []
        while loop.time() < deadline:  # until every connection's answers stop leaving
            for sock, data in list(pending.items()):
                try:
                    sent = sock.send(data)
                except BlockingIOError:
                    continue
                if sent == len(data):
                    del pending[sock]
                else:
                    pending[sock] = data[sent:]
            await asyncio.sleep(0.5)
            queued = sorted(_unsent_bytes(host, ADMIN_PORT))
            full = [q for q in queued if q > 1024 * 1024]
            if len(full) >= FLOODS and queued == before:
                break
            before = queued
        else:
            raise AssertionError("the admin port did not fill its connections' buffers")
        answer = await _get(host, "/healthz")
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    finally:
        for sock in socks:
            sock.close()


PIPELINED = 160_000
"""Requests one client writes at once, without waiting for any answer."""


async def test_requests_pipelined_by_the_thousand_cost_their_number(broker: Broker) -> None:
    """R-CLIENT-1 (docs/design.md "Security defaults": every count read from the wire is
    bounded) and SPEC §6 (a connection's requests take effect in the order written): a
    client that
    writes tens of thousands of requests at once (each one run as a task, a ``ping``
    here) gets them all answered, in order, in a time that grows with their number. Each
    request handled must not cost the daemon a copy of every request still behind it,
    which made 10,000 pings take about a second and 80,000 from half a minute to well
    over one of the event loop that every other client and broker shares."""
    reader, writer = await logged_in(broker)
    try:
        ping = encode_frame(ClientFrame(ClientFrameKind.REQUEST, 0, {"op": "ping"}))
        head, tail = ping[:4], ping[8:]
        writer.write(b"".join(head + (2 + n).to_bytes(4, "big") + tail for n in range(PIPELINED)))
        frames = ClientFrameReader()
        answered: list[int] = []
        async with asyncio.timeout(40):
            while len(answered) < PIPELINED:
                data = await reader.read(1 << 20)
                assert data, "the daemon closed the connection"
                answered += [frame.request_id for frame in frames.feed(data)]
        assert answered == list(range(2, 2 + PIPELINED))
    finally:
        writer.close()


WAITING_AT_MOST = 1024
"""RECEIVEs and GET CONVERSATION GROUPs one connection may have under way at once (the
``brokerd.server.client_in_flight.MAX_WAITING``)."""
BEYOND = 50


async def test_the_receives_waiting_on_one_connection_are_bounded(broker: Broker) -> None:
    """R-CLIENT-1 (docs/design.md "Security defaults": every count read from the wire is
    bounded). RECEIVEs that wait for messages (WAITFOR, a negative timeout: until one comes, SPEC
    §6) each hold a task and the request of one connection, and every change of their
    queue wakes them all; a client writing them by the thousand must not make the daemon
    hold one per request without end. Beyond :data:`WAITING_AT_MOST` at once, one more is refused
    (``invalid_request``, docs/errors.md), and the connection still serves its other
    requests."""
    reader, writer = await logged_in(broker)
    try:
        receive = {"op": "receive", "queue": "Q1", "timeout": -1}
        count = WAITING_AT_MOST + BEYOND
        writer.write(
            b"".join(
                encode_frame(ClientFrame(ClientFrameKind.REQUEST, 2 + n, receive))
                for n in range(count)
            )
            + encode_frame(ClientFrame(ClientFrameKind.REQUEST, 2 + count, {"op": "ping"}))
        )
        frames = ClientFrameReader()
        answers: list[ClientFrame] = []
        async with asyncio.timeout(30):
            while not any(a.request_id == 2 + count for a in answers):
                data = await reader.read(1 << 20)
                assert data, "the daemon closed the connection"
                answers += frames.feed(data)
        refused = [a for a in answers if a.kind is ClientFrameKind.ERROR]
        assert len(refused) == BEYOND, (len(refused), answers[:3])
        assert {a.meta["code"] for a in refused} == {InvalidRequest.code}
        assert len(answers) == BEYOND + 1  # the ping; the others wait
    finally:
        writer.close()


FLOOD_HOST = "127.0.0.121"
DAEMON_FILES = 256
"""The daemon's limit of open files in the flood test (its soft RLIMIT_NOFILE)."""
FLOOD = {False: 400, True: 800}
"""Connections that never log in (on a TLS port, that never begin their handshake): more
than the daemon may have files open (with TLS, 400 did not lock an application out even
when handshakes were not counted)."""


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_connections_that_never_log_in_do_not_lock_applications_out(
    tmp_path: Path, tls: bool
) -> None:
    """R-CLIENT-1 (docs/design.md "Security defaults"): the client port requires a login,
    and a connection without one is closed after ``client.login_timeout``. Until then,
    connections that never log in (a flood of them, which needs no token) must not take
    every file the daemon may open: an application that connects and logs in meanwhile
    is served, as a broker's handshake on port 4022 goes through a flood of connections
    that never complete theirs (``endpoint.max_pending_handshakes``). On a TLS port the
    same holds for connections that never begin their TLS handshake (which needs no token,
    nor a certificate): they count among those not logged in from their TCP accept."""
    deployment = Deployment(tmp_path)
    daemon = deployment.add("solo", FLOOD_HOST, SOLO_DATABASE, client_tls=tls)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (DAEMON_FILES, hard))
    try:
        deployment.start("solo")  # the daemon inherits the limit
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    flood: list[socket.socket] = []
    try:
        for _ in range(FLOOD[tls]):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.connect((FLOOD_HOST, daemon.client_port))
            flood.append(sock)
        await asyncio.sleep(1)  # each accepted, or waiting in the listen queue
        client = await BrokerClient.connect(
            FLOOD_HOST,
            daemon.client_port,
            token_file=daemon.token_file,
            tls_ca_file=daemon.tls_ca_file if tls else None,
            timeout=3,
            reconnect=False,
        )
        try:
            assert (await client.ping())["instance"] == "solo"
        finally:
            await client.close()
    finally:
        for sock in flood:
            sock.close()
        deployment.stop_all()
