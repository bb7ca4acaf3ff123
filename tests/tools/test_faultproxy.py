"""The fault-injecting proxy (brokerd/tools/faultproxy.py) over real TCP on 127.0.0.1."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator

import pytest

from brokerd.tools.faultproxy import FaultPlan, FaultProxy, _FrameFilter, parse_endpoint
from protocol.frames import HEADER_SIZE, FrameType, encode_header

HOST = "127.0.0.1"
TIMEOUT = 2.0


def frame(frame_type: FrameType, counter: int, body: bytes) -> bytes:
    return encode_header(1, frame_type, 3, len(body), counter) + body


def stream_of(kinds: list[FrameType], rng: random.Random) -> tuple[bytes, list[tuple[int, int]]]:
    """Frames of the given types with random bodies; returns the bytes and each
    frame's (start, end) span."""
    out = bytearray()
    spans = []
    for counter, kind in enumerate(kinds):
        body = rng.randbytes(rng.randrange(1, 300))
        start = len(out)
        out += frame(kind, counter, body)
        spans.append((start, len(out)))
    return bytes(out), spans


class Peer:
    """The 'server broker': records what each connection sends; echoes it back in
    random chunks if ``echo``; closes its side after the client's EOF."""

    def __init__(self, echo: bool = True) -> None:
        self.echo = echo
        self.received: list[bytearray] = []
        self.closed: list[asyncio.Event] = []
        self.errors: list[BaseException] = []
        self._server: asyncio.Server | None = None
        self._rng = random.Random(7)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, HOST, 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = bytearray()
        closed = asyncio.Event()
        self.received.append(data)
        self.closed.append(closed)
        try:
            while chunk := await reader.read(4096):
                data += chunk
                if self.echo:
                    await write_chunked(writer, chunk, self._rng)
            writer.close()
        except OSError as exc:
            self.errors.append(exc)
            writer.close()
        finally:
            closed.set()


async def write_chunked(writer: asyncio.StreamWriter, data: bytes, rng: random.Random) -> None:
    pos = 0
    while pos < len(data):
        step = rng.randrange(1, 40)
        writer.write(data[pos : pos + step])
        await writer.drain()
        await asyncio.sleep(0)  # let the other end read this piece on its own
        pos += step


async def read_all(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), TIMEOUT)


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    p = Peer()
    await p.start()
    yield p
    await p.stop()


@pytest.fixture
async def proxy(peer: Peer) -> AsyncIterator[FaultProxy]:
    assert peer._server is not None
    target = int(peer._server.sockets[0].getsockname()[1])
    async with FaultProxy(HOST, 0, HOST, target) as p:
        yield p


async def roundtrip(proxy: FaultProxy, data: bytes, seed: int = 1) -> bytes:
    """Send ``data`` in random chunks, half-close, return everything echoed back."""
    reader, writer = await asyncio.open_connection(HOST, proxy.port)
    await write_chunked(writer, data, random.Random(seed))
    writer.write_eof()
    echoed = await read_all(reader)
    writer.close()
    return echoed


KINDS = [
    FrameType.FRAGMENT,
    FrameType.ACK,
    FrameType.FRAGMENT,
    FrameType.KEEPALIVE,
    FrameType.FRAGMENT,
]


async def test_pass_through_is_byte_exact_both_ways(proxy: FaultProxy, peer: Peer) -> None:
    data, _ = stream_of(KINDS * 4, random.Random(1))
    echoed = await roundtrip(proxy, data)
    assert bytes(peer.received[0]) == data
    assert echoed == data
    assert proxy.stats.connections == 1
    assert proxy.stats.fragments_seen == 12
    assert proxy.stats.fragments_corrupted == proxy.stats.fragments_dropped == 0
    assert proxy.stats.bytes_up == proxy.stats.bytes_down == len(data)


def test_frame_cutter_handles_every_split() -> None:
    data, spans = stream_of(KINDS, random.Random(2))
    proxy = FaultProxy(HOST, 0, HOST, 1, FaultPlan(corrupt_fragments={2}))
    for cut in range(len(data) + 1):
        cutter = _FrameFilter(proxy, 1, up=True)
        out = cutter.feed(data[:cut]) + cutter.feed(data[cut:]) + cutter.flush()
        assert len(out) == len(data)
        diff = [i for i in range(len(data)) if out[i] != data[i]]
        assert len(diff) == 1
        assert spans[2][0] + HEADER_SIZE <= diff[0] < spans[2][1]
        proxy.stats.fragments_seen = 0
    byte_by_byte = _FrameFilter(proxy, 1, up=True)
    out = b"".join(byte_by_byte.feed(data[i : i + 1]) for i in range(len(data)))
    assert len(out) == len(data)


async def test_corrupting_fragment_2_flips_one_body_byte(proxy: FaultProxy, peer: Peer) -> None:
    proxy.plan.corrupt_fragments.add(2)  # the plan may change while the proxy runs
    data, spans = stream_of(KINDS, random.Random(3))
    await roundtrip(proxy, data)
    got = bytes(peer.received[0])
    assert len(got) == len(data)
    diff = [i for i in range(len(data)) if got[i] != data[i]]
    assert len(diff) == 1
    start, end = spans[2]  # KINDS[2] is the second FRAGMENT
    assert start + HEADER_SIZE <= diff[0] < end
    assert proxy.stats.fragments_corrupted == 1
    assert proxy.stats.fragments_seen == 3
    assert any("corrupted FRAGMENT #2 (counter 2) at body byte" in e for e in proxy.events)


async def test_dropping_removes_exactly_that_frame(proxy: FaultProxy, peer: Peer) -> None:
    proxy.plan.drop_fragments.add(3)
    data, spans = stream_of(KINDS, random.Random(4))
    echoed = await roundtrip(proxy, data)
    start, end = spans[4]  # the third FRAGMENT
    expected = data[:start] + data[end:]
    assert bytes(peer.received[0]) == expected
    assert echoed == expected
    assert proxy.stats.fragments_dropped == 1
    assert proxy.stats.bytes_up == len(expected)


async def test_fragments_are_counted_across_connections(proxy: FaultProxy, peer: Peer) -> None:
    proxy.plan.drop_fragments.add(4)
    data, spans = stream_of(KINDS, random.Random(5))  # 3 fragments each
    await roundtrip(proxy, data, seed=1)
    await roundtrip(proxy, data, seed=2)
    assert bytes(peer.received[0]) == data
    start, end = spans[0]  # #4 overall is the first FRAGMENT of the second connection
    assert bytes(peer.received[1]) == data[:start] + data[end:]
    assert proxy.stats.connections == 2
    assert proxy.stats.fragments_seen == 6


async def test_unparseable_header_passes_the_rest_through(proxy: FaultProxy, peer: Peer) -> None:
    proxy.plan.corrupt_fragments.update({1, 2, 3})
    good, _ = stream_of([FrameType.ACK], random.Random(6))
    tail, _ = stream_of(KINDS, random.Random(7))
    data = good + b"XX garbage, not a header......" + tail
    echoed = await roundtrip(proxy, data)
    assert bytes(peer.received[0]) == data == echoed
    assert proxy.stats.fragments_seen == 0
    assert any("unparseable frame header" in e for e in proxy.events)


async def test_refuse_closes_new_connections(proxy: FaultProxy, peer: Peer) -> None:
    proxy.plan.refuse = True
    reader, writer = await asyncio.open_connection(HOST, proxy.port)
    with contextlib.suppress(ConnectionResetError):
        assert await read_all(reader) == b""
    writer.close()
    assert peer.received == []
    proxy.plan.refuse = False
    data, _ = stream_of(KINDS, random.Random(8))
    assert await roundtrip(proxy, data) == data
    assert proxy.stats.connections == 2


async def test_blackhole_swallows_everything(proxy: FaultProxy, peer: Peer) -> None:
    proxy.plan.blackhole = True
    reader, writer = await asyncio.open_connection(HOST, proxy.port)
    writer.write(frame(FrameType.FRAGMENT, 0, b"hello"))
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(1), 0.1)
    assert peer.received == []
    assert proxy.stats.bytes_up == 0
    writer.close()


async def test_cut_resets_live_connections(proxy: FaultProxy, peer: Peer) -> None:
    clients = [await asyncio.open_connection(HOST, proxy.port) for _ in range(2)]
    one = frame(FrameType.FRAGMENT, 0, b"ping")
    for reader, writer in clients:
        writer.write(one)
        await writer.drain()
        assert await asyncio.wait_for(reader.readexactly(len(one)), TIMEOUT) == one
    proxy.cut()
    for reader, writer in clients:
        with contextlib.suppress(ConnectionResetError):
            assert await read_all(reader) == b""
        writer.close()
    for closed in peer.closed:
        await asyncio.wait_for(closed.wait(), TIMEOUT)
    assert len(peer.closed) == 2
    assert "cut 2 connection(s)" in proxy.events


async def test_delay_adds_latency_both_ways(proxy: FaultProxy) -> None:
    proxy.plan.delay = 0.05
    reader, writer = await asyncio.open_connection(HOST, proxy.port)
    one = frame(FrameType.KEEPALIVE, 0, b"")
    started = time.monotonic()
    writer.write(one)
    await writer.drain()
    assert await asyncio.wait_for(reader.readexactly(len(one)), TIMEOUT) == one
    elapsed = time.monotonic() - started
    assert elapsed >= 2 * 0.05 * 0.99  # one delay up, one down (timer slack only)
    writer.close()


async def test_stop_is_idempotent_and_port_needs_start(peer: Peer) -> None:
    p = FaultProxy(HOST, 0, HOST, 1)
    with pytest.raises(RuntimeError):
        _ = p.port
    await p.stop()  # never started: nothing to do
    await p.start()
    reader, writer = await asyncio.open_connection(HOST, p.port)
    await p.stop()
    await p.stop()
    with contextlib.suppress(ConnectionResetError):
        assert await read_all(reader) == b""
    writer.close()


def test_parse_endpoint() -> None:
    assert parse_endpoint("127.0.0.3:4022") == ("127.0.0.3", 4022)
    assert parse_endpoint("[::1]:9") == ("::1", 9)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_endpoint("4022")


async def test_dropping_an_ack_removes_it_from_the_down_direction_only(
    proxy: FaultProxy, peer: Peer
) -> None:
    """A lost acknowledgement (the sender retransmits, the receiver sees a duplicate)."""
    proxy.plan.drop_acks.add(1)
    data, spans = stream_of(KINDS * 2, random.Random(5))
    echoed = await roundtrip(proxy, data)
    assert bytes(peer.received[0]) == data  # the up direction is untouched
    start, end = spans[1]  # KINDS[1] is the first ACK
    assert echoed == data[:start] + data[end:]
    assert proxy.stats.acks_seen == 2
    assert proxy.stats.acks_dropped == 1
    assert proxy.stats.fragments_seen == 6  # FRAGMENTs are counted going up only
    assert any("dropped ACK #1" in e for e in proxy.events)
