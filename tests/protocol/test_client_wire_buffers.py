"""Client wire format (protocol/client_wire.py): where a frame's bytes are read to.

A large body read in place into a buffer of its own, in any chunking, and the same
frames as bytes fed whole; bodies given back and the next read into them; the
per-thread read buffer readers share; a closed reader letting its buffers go; a body
there is no memory for refused as too large.
"""

from __future__ import annotations

import random

import pytest

from protocol import LocalProtocolError, RemoteProtocolError
from protocol.client_wire import (
    HEADER_SIZE,
    LARGE_BODY,
    READ_SIZE,
    ClientFrame,
    ClientFrameKind,
    ClientFrameReader,
    encode_frame,
    encode_meta,
    read_buffer_in,
)
from tests.protocol.client_samples import SAMPLES, STREAM


def test_large_body_in_small_chunks_is_linear() -> None:
    body = bytes(range(256)) * (16 * 1024)  # 4 MiB in 4096 chunks: quadratic would crawl
    data = encode_frame(ClientFrame(ClientFrameKind.REQUEST, 9, {"op": "send"}, body))
    reader = ClientFrameReader()
    chunk = 1024
    for pos in range(0, len(data) - chunk, chunk):
        assert reader.feed(data[pos : pos + chunk]) == []
        assert reader.buffered_bytes == pos + chunk
    tail = len(data) - len(data) % chunk if len(data) % chunk else len(data) - chunk
    (frame,) = reader.feed(data[tail:])
    assert frame.body == body
    assert reader.buffered_bytes == 0


LARGE_FRAMES = [
    ClientFrame(ClientFrameKind.REQUEST, 1, {"op": "send"}, bytes(range(256)) * 1024),
    SAMPLES[1],
    ClientFrame(ClientFrameKind.RESPONSE, 2, {"ok": True}, b"\x00" * LARGE_BODY),
    ClientFrame(ClientFrameKind.REQUEST, 3, {"op": "send"}, b"x" * (LARGE_BODY - 1)),
    SAMPLES[0],
]
LARGE_STREAM = b"".join(encode_frame(f) for f in LARGE_FRAMES)
READ = memoryview(bytearray(READ_SIZE))
"""A read buffer as a caller gives ``get_buffer`` (one may serve many readers)."""


def _meta_lengths(frames: list[ClientFrame]) -> list[int]:
    """The bytes each frame's meta takes on the wire."""
    return [len(encode_meta(frame.meta)) for frame in frames]


@pytest.mark.parametrize("seed", range(6))
def test_large_bodies_gathered_in_pieces_in_any_chunking(seed: int) -> None:
    """Bodies of at least LARGE_BODY bytes are gathered into a buffer of their own as they
    arrive; in whatever chunks the stream comes (ending inside a header, the meta, the
    body, or several frames at once), the frames are the same and nothing stays
    buffered; ``meta_lengths`` gives the wire size of each frame's meta, for the frames
    of each call (what a server counts against a connection's bound, R-CLIENT-1)."""
    rng = random.Random(seed)
    reader = ClientFrameReader()
    got: list[ClientFrame] = []
    pos = 0
    while pos < len(LARGE_STREAM):
        step = rng.choice([1, 7, HEADER_SIZE, 5000, 70_000, 300_000])
        chunk = LARGE_STREAM[pos : pos + step]
        new = reader.feed(rng.choice([bytes, bytearray, memoryview])(chunk))
        assert reader.meta_lengths == _meta_lengths(new)
        got += new
        pos += len(chunk)
        assert reader.buffered_bytes == pos - sum(len(encode_frame(f)) for f in got)
    assert got == LARGE_FRAMES
    # a body that came whole within one chunk is bytes; one gathered, a bytearray
    assert all(type(f.body) is bytes or len(f.body) >= LARGE_BODY for f in got)
    assert reader.buffered_bytes == 0


def _read_in_place(
    reader: ClientFrameReader, stream: bytes, rng: random.Random
) -> list[ClientFrame]:
    """``stream`` given to ``reader`` as an asyncio.BufferedProtocol's socket would: each
    read writes at most what ``get_buffer`` offers, and at most a random count."""
    got: list[ClientFrame] = []
    pos = 0
    while pos < len(stream):
        buffer = reader.get_buffer(READ)
        assert len(buffer) > 0
        count = min(len(buffer), rng.choice([1, 7, HEADER_SIZE, 5000, 70_000, 300_000]))
        count = min(count, len(stream) - pos)
        buffer[:count] = stream[pos : pos + count]
        new = reader.buffer_updated(count)
        assert reader.meta_lengths == _meta_lengths(new)
        got += new
        pos += count
        assert reader.buffered_bytes == pos - sum(len(encode_frame(f)) for f in got)
    return got


@pytest.mark.parametrize("seed", range(6))
def test_frames_read_in_place_equal_frames_fed(seed: int) -> None:
    """Read through ``get_buffer`` / ``buffer_updated`` the stream gives the same frames
    as fed, whatever the reads' sizes."""
    rng = random.Random(seed)
    reader = ClientFrameReader()
    assert _read_in_place(reader, LARGE_STREAM + STREAM, rng) == LARGE_FRAMES + SAMPLES
    assert reader.buffered_bytes == 0


def test_a_large_body_is_read_into_its_own_buffer() -> None:
    """Once a large body's frame has begun, ``get_buffer`` offers the rest of the body
    itself: what the socket writes there is the frame's body, not a copy of it."""
    frame = LARGE_FRAMES[0]
    data = encode_frame(frame)
    reader = ClientFrameReader()
    first = 1000
    assert reader.feed(data[:first]) == []
    view = reader.get_buffer(READ)
    assert len(view) == len(data) - first  # exactly the body's rest: no next frame's bytes
    view[:] = data[first:]
    (got,) = reader.buffer_updated(len(view))
    assert got == frame
    assert type(got.body) is bytearray
    view[0:1] = b"!"  # the view was the body's own memory
    assert got.body[first - (len(data) - len(frame.body))] == ord("!")


def test_buffer_updated_needs_its_get_buffer() -> None:
    reader = ClientFrameReader()
    with pytest.raises(LocalProtocolError, match="get_buffer"):
        reader.buffer_updated(1)
    view = reader.get_buffer(READ)
    with pytest.raises(LocalProtocolError, match="get_buffer"):
        reader.buffer_updated(len(view) + 1)


def test_a_bad_frame_read_in_place_fails_the_reader() -> None:
    reader = ClientFrameReader()
    bad = b"XX" + encode_frame(SAMPLES[0])[2:]
    view = reader.get_buffer(READ)
    view[: len(bad)] = bad
    with pytest.raises(RemoteProtocolError, match="magic"):
        reader.buffer_updated(len(bad))
    assert reader.failed
    reader.get_buffer(READ)
    with pytest.raises(RemoteProtocolError, match="already failed"):
        reader.buffer_updated(1)


def test_a_large_body_with_a_bad_meta_fails_before_its_body() -> None:
    frame = encode_frame(LARGE_FRAMES[0])
    bad = bytearray(frame[: HEADER_SIZE + 100])
    meta = encode_meta(LARGE_FRAMES[0].meta)
    bad[HEADER_SIZE : HEADER_SIZE + len(meta)] = b"[" + b" " * (len(meta) - 2) + b"]"
    reader = ClientFrameReader()
    with pytest.raises(RemoteProtocolError, match="JSON object"):
        reader.feed(bytes(bad))
    assert reader.failed


def test_a_large_body_given_back_takes_the_next_of_about_its_size() -> None:
    """``reuse``: the next large body of at most its size and more than half of it is read
    into the same buffer, and is still the right bytes; a much smaller one is not."""
    size = 4 * LARGE_BODY
    frames = [
        ClientFrame(ClientFrameKind.RESPONSE, n, {"n": n}, bytes([n]) * length)
        for n, length in enumerate([size, size - 5, size // 2 - 10], 1)
    ]
    reader = ClientFrameReader()
    rng = random.Random(7)
    (first,) = _read_in_place(reader, encode_frame(frames[0]), rng)
    assert first == frames[0] and type(first.body) is bytearray
    reader.reuse(first.body)
    (second,) = _read_in_place(reader, encode_frame(frames[1]), rng)
    assert second.body is first.body
    assert second == frames[1]
    reader.reuse(second.body)
    (third,) = _read_in_place(reader, encode_frame(frames[2]), rng)
    assert third.body is not second.body
    assert third == frames[2]


def test_get_buffer_may_be_asked_again_and_buffer_updated_may_be_zero() -> None:
    """An event loop asks for a buffer and then finds nothing to read (asyncio's selector
    loop on EAGAIN, uvloop's TLS on every read): the next ``get_buffer`` is the one that
    counts, and a read of zero bytes changes nothing, inside a large body or not."""
    frame = LARGE_FRAMES[0]
    data = encode_frame(frame)
    reader = ClientFrameReader()
    for _ in range(3):
        reader.get_buffer(READ)
    assert reader.buffer_updated(0) == []
    head = reader.get_buffer(READ)
    head[:1000] = data[:1000]
    assert reader.buffer_updated(1000) == []
    reader.get_buffer(READ)
    rest = reader.get_buffer(READ)  # asked twice: the same place, the body's rest
    assert len(rest) == len(data) - 1000
    assert reader.buffer_updated(0) == []
    rest = reader.get_buffer(READ)
    rest[:] = data[1000:]
    assert reader.buffer_updated(len(rest)) == [frame]
    assert reader.buffered_bytes == 0


def test_readers_may_share_a_read_buffer_and_keep_their_bytes() -> None:
    """Two connections' readers read through the same buffer, one read at a time, and
    each keeps only its own bytes (what the buffer held is copied out at once)."""
    one, two = ClientFrameReader(), ClientFrameReader()
    first, second = encode_frame(SAMPLES[0]), encode_frame(SAMPLES[1])
    view = one.get_buffer(READ)
    view[:5] = first[:5]
    assert one.buffer_updated(5) == []
    other = two.get_buffer(READ)
    assert other is view
    other[: len(second)] = second
    assert two.buffer_updated(len(second)) == [SAMPLES[1]]
    view = one.get_buffer(READ)
    view[: len(first) - 5] = first[5:]
    assert one.buffer_updated(len(first) - 5) == [SAMPLES[0]]


def test_a_threads_read_buffer_is_made_once_in_its_store_and_each_store_has_its_own() -> None:
    """What the SDK's connections and the daemon's client sessions read through: one
    buffer of READ_SIZE per store (their thread's ``threading.local()``)."""

    class Store:
        pass

    first, second = Store(), Store()
    view = read_buffer_in(first)
    assert len(view) == READ_SIZE and not view.readonly
    assert read_buffer_in(first) is view
    assert read_buffer_in(second) is not view


def test_a_buffer_given_back_fits_only_bodies_of_more_than_half_its_size() -> None:
    size = 4 * LARGE_BODY
    rng = random.Random(3)
    for length, taken in [
        (size, True),
        (size // 2 + 1, True),
        (size // 2, False),
        (size + 1, False),
    ]:
        reader = ClientFrameReader()
        spare = bytearray(size)
        reader.reuse(spare)
        frame = ClientFrame(ClientFrameKind.RESPONSE, 1, {}, bytes([length % 251]) * length)
        (got,) = _read_in_place(reader, encode_frame(frame), rng)
        assert got == frame
        assert (got.body is spare) is taken, (length, taken)


def test_a_buffer_given_back_while_a_view_of_it_is_held_is_not_reused() -> None:
    """Given back too early (a view of it still held, so it cannot shrink): the next body
    gets a buffer of its own, and the view still sees the old bytes."""
    size = 4 * LARGE_BODY
    reader = ClientFrameReader()
    spare = bytearray(b"a" * size)
    held = memoryview(spare)
    reader.reuse(spare)
    frame = ClientFrame(ClientFrameKind.RESPONSE, 1, {}, b"b" * (size - 10))
    (got,) = _read_in_place(reader, encode_frame(frame), random.Random(4))
    assert got == frame and got.body is not spare
    assert held[0] == ord("a")
    held.release()


def test_two_bodies_after_one_given_back_are_two_buffers() -> None:
    size = 4 * LARGE_BODY
    reader = ClientFrameReader()
    frames = [ClientFrame(ClientFrameKind.RESPONSE, n, {}, bytes([n]) * size) for n in (1, 2, 3)]
    rng = random.Random(5)
    (first,) = _read_in_place(reader, encode_frame(frames[0]), rng)
    reader.reuse(first.body)
    second, third = _read_in_place(reader, encode_frame(frames[1]) + encode_frame(frames[2]), rng)
    assert second.body is first.body and third.body is not second.body
    assert [second, third] == frames[1:]


def test_a_closed_reader_lets_its_buffers_go_and_reads_no_more() -> None:
    frame = LARGE_FRAMES[0]
    data = encode_frame(frame)
    reader = ClientFrameReader()
    reader.reuse(bytearray(8 * LARGE_BODY))
    assert reader.feed(data[:5000]) == []
    reader.close()
    assert reader.failed and reader.buffered_bytes == 0
    reader.get_buffer(READ)
    with pytest.raises(RemoteProtocolError, match="closed"):
        reader.buffer_updated(1)


_NO_MEMORY_SCRIPT = """
import resource
from protocol.client_wire import (
    CLIENT_FRAME_HEADER, CLIENT_WIRE_VERSION, ClientFrameKind, ClientFrameReader, encode_meta,
)
from protocol.errors import CloseCode, RemoteProtocolError

meta = encode_meta({"op": "send"})
announced = 768 * 1024 * 1024
header = CLIENT_FRAME_HEADER.build({
    "version": CLIENT_WIRE_VERSION, "kind": int(ClientFrameKind.REQUEST), "request_id": 1,
    "meta_length": len(meta), "body_length": announced,
})
reader = ClientFrameReader(max_body=announced)
with open("/proc/self/status") as status:
    size = next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmSize:"))
limit = size + 256 * 1024 * 1024
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    reader.feed(header + meta + b"x" * 1000)
except RemoteProtocolError as exc:
    assert exc.close_code == CloseCode.FRAME_TOO_LARGE, exc
    assert "no memory" in str(exc), exc
    assert reader.failed
    print("refused")
"""


def test_a_body_there_is_no_memory_for_is_refused_as_too_large() -> None:
    """A logged-in client may announce a body within the limit that this process cannot
    hold now (its address space capped, as a container's may be): the reader refuses it
    as a frame over the limit (its frame named in a RemoteProtocolError, which the
    listener answers), not with a MemoryError in the event loop."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _NO_MEMORY_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "refused", done.stderr
