"""Frame format round trips and golden byte vectors (SPEC R-PROTO-1).

Every frame body round-trips through the interpreted and the compiled construct
codec; fixed byte vectors in tests/protocol/golden/frames_v1.json pin the wire format (a
change to them is a protocol change: bump the version). Regenerate only on
purpose: ``python -m tests.test_frames --regenerate``.
"""

from __future__ import annotations

import json
import random
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from protocol import RemoteProtocolError, frames
from protocol.events import Event, Fragment, Keepalive, PrincipalAnswer, PrincipalQuery
from protocol.frames import FrameType
from protocol.security import FrameOpener, FrameSealer
from tests.conftest import Pki, open_pair

GOLDEN = Path(__file__).parent / "golden" / "frames_v1.json"
KEY = bytes(range(32))
BROKER = uuid.UUID("6f9619ff-8b86-d011-b42d-00c04fc964ff")

SAMPLE_BODIES: dict[FrameType, dict[str, Any]] = {
    FrameType.HELLO: {
        "versions": [1],
        "instance_name": "alpha",
        "random": b"\x11" * 32,
        "ephemeral_key": b"\x22" * 32,
        "encryption": 1,
        "max_frame_size": 1_052_672,
        "certificate": b"DER certificate bytes",
    },
    FrameType.HELLO_REPLY: {"core": b"reply core bytes", "signature": b"\x33" * 64},
    FrameType.PROOF: {"signature": b"\x44" * 64},
    FrameType.WELCOME: {},
    FrameType.KEEPALIVE: {},
    FrameType.CLOSE: {"code": 1, "reason": "idle for 90 s"},
    FrameType.PRINCIPAL_QUERY: {
        "query_id": 7,
        "broker_instance": BROKER.bytes,
        "service": "Expenses",
        "epoch": 3,
    },
    FrameType.PRINCIPAL_ANSWER: {
        "query_id": 7,
        "role": 1,
        "broker_instance": BROKER.bytes,
        "service": "Expenses",
        "epoch": 4,
    },
}


def _clean(value: Any) -> dict[str, Any]:
    items = value._asdict() if hasattr(value, "_asdict") else dict(value)
    return {k: v for k, v in items.items() if not k.startswith("_")}


@pytest.mark.parametrize("frame_type", list(SAMPLE_BODIES), ids=lambda t: t.name)
def test_body_round_trip_interpreted_and_compiled(frame_type: FrameType) -> None:
    value = SAMPLE_BODIES[frame_type]
    interpreted = frames.BODY_CODECS[frame_type]
    compiled = interpreted.compile()
    data = interpreted.build(value)
    assert compiled.build(value) == data
    assert frames.encode_body(frame_type, value) == data
    assert _clean(interpreted.parse(data)) == value
    assert _clean(compiled.parse(data)) == value
    assert _clean(frames.decode_body(frame_type, data)) == value


@pytest.mark.parametrize("frame_type", list(SAMPLE_BODIES), ids=lambda t: t.name)
def test_body_with_trailing_data_is_rejected(frame_type: FrameType) -> None:
    data = frames.encode_body(frame_type, SAMPLE_BODIES[frame_type])
    with pytest.raises(RemoteProtocolError, match="malformed"):
        frames.decode_body(frame_type, data + b"\x00")


@pytest.mark.parametrize("frame_type", list(SAMPLE_BODIES), ids=lambda t: t.name)
def test_truncated_body_is_rejected(frame_type: FrameType) -> None:
    data = frames.encode_body(frame_type, SAMPLE_BODIES[frame_type])
    for cut in range(len(data)):
        with pytest.raises(RemoteProtocolError):
            frames.decode_body(frame_type, data[:cut])


def test_header_round_trip_against_construct() -> None:
    for args in [(1, 16, 3, 200, 5), (1, 1, 0, 0, 0), (255, 21, 1, 2**32 - 1, 2**64 - 1)]:
        data = frames.encode_header(*args)
        assert len(data) == frames.HEADER_SIZE
        for codec in (frames.FRAME_HEADER, frames.FRAME_HEADER.compile()):
            parsed = codec.parse(data)
            assert (
                parsed.version,
                parsed.frame_type,
                parsed.flags,
                parsed.length,
                parsed.counter,
            ) == args
            assert codec.build(_clean(parsed)) == data
        header = frames.decode_header(data, 2**32)
        assert (
            header.version,
            header.frame_type,
            header.flags,
            header.length,
            header.counter,
        ) == args


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b"XX" + b[2:], "magic"),
        (lambda b: b[:5] + b"\x01" + b[6:], "checksum"),
        (lambda b: b[:10] + b"\xff" + b[11:], "checksum"),
    ],
)
def test_header_damage_is_fatal(mutate: Any, message: str) -> None:
    data = frames.encode_header(1, 16, 3, 200, 5)
    with pytest.raises(RemoteProtocolError, match=message):
        frames.decode_header(mutate(data), 2**20)


def test_unknown_frame_type_and_reserved_byte_are_rejected() -> None:
    with pytest.raises(RemoteProtocolError, match="unknown frame type 99"):
        frames.decode_header(frames.encode_header(1, 99, 0, 0, 0), 2**20)
    raw = bytearray(frames.encode_header(1, 16, 0, 0, 0))
    raw[5] = 1  # reserved byte, then fix the CRC so only the reserved check can fire
    import zlib

    raw[18:22] = (zlib.crc32(bytes(raw[:18])) & 0xFFFFFFFF).to_bytes(4, "big")
    with pytest.raises(RemoteProtocolError, match="reserved"):
        frames.decode_header(bytes(raw), 2**20)


# ----------------------------------------------------------------- golden vectors


def golden_vectors() -> dict[str, bytes]:
    """Deterministic frames: fixed key, fixed counters, fixed bodies."""
    encrypted = FrameSealer(KEY, encrypt=True, version=1)
    signed = FrameSealer(KEY, encrypt=False, version=1)

    def clear(frame_type: FrameType, counter: int) -> bytes:
        body = frames.encode_body(frame_type, SAMPLE_BODIES[frame_type])
        return frames.encode_header(1, frame_type, 0, len(body), counter) + body

    query = frames.encode_body(FrameType.PRINCIPAL_QUERY, SAMPLE_BODIES[FrameType.PRINCIPAL_QUERY])
    answer = frames.encode_body(
        FrameType.PRINCIPAL_ANSWER, SAMPLE_BODIES[FrameType.PRINCIPAL_ANSWER]
    )
    return {
        "header_fragment": frames.encode_header(1, FrameType.FRAGMENT, 3, 200, 5),
        "hello_clear": clear(FrameType.HELLO, 0),
        "hello_reply_clear": clear(FrameType.HELLO_REPLY, 0),
        "close_clear": clear(FrameType.CLOSE, 1),
        "proof_encrypted": encrypted.seal(
            FrameType.PROOF, frames.encode_body(FrameType.PROOF, SAMPLE_BODIES[FrameType.PROOF]), 1
        ),
        "welcome_encrypted": encrypted.seal(FrameType.WELCOME, b"", 1),
        "keepalive_encrypted": encrypted.seal(FrameType.KEEPALIVE, b"", 7),
        "keepalive_signed": signed.seal(FrameType.KEEPALIVE, b"", 13),
        "fragment_encrypted": encrypted.seal(FrameType.FRAGMENT, b"hello broker", 8),
        "fragment_signed": signed.seal(FrameType.FRAGMENT, b"hello broker", 9),
        "ack_signed": signed.seal(FrameType.ACK, b"ack payload", 10),
        "principal_query_encrypted": encrypted.seal(FrameType.PRINCIPAL_QUERY, query, 11),
        "principal_answer_signed": signed.seal(FrameType.PRINCIPAL_ANSWER, answer, 12),
        "mirror_encrypted": encrypted.seal(FrameType.MIRROR, b"mirroring message", 14),
    }


def test_golden_vectors_match_the_checked_in_bytes() -> None:
    expected = {k: bytes.fromhex(v) for k, v in json.loads(GOLDEN.read_text()).items()}
    assert golden_vectors() == expected


def test_golden_vectors_parse_back() -> None:
    expected = {k: bytes.fromhex(v) for k, v in json.loads(GOLDEN.read_text()).items()}
    for name, data in expected.items():
        if name == "header_fragment":
            continue
        (header,) = frames.iter_frame_headers(data)
        body = data[frames.HEADER_SIZE :]
        frame_type = FrameType(header.frame_type)
        if header.flags:
            body = FrameOpener(KEY, encrypt=name.endswith("encrypted")).open(
                header, data[: frames.HEADER_SIZE], body
            )
        if frame_type in (FrameType.FRAGMENT, FrameType.ACK, FrameType.MIRROR):
            assert body in (b"hello broker", b"ack payload", b"mirroring message")
        else:
            assert _clean(frames.decode_body(frame_type, body)) == SAMPLE_BODIES[frame_type]


def test_principal_frames_carry_the_epoch_last_as_u64_big_endian() -> None:
    """R-ROUTE-15: the mirroring epoch is the last field of both principal bodies."""
    service = b"\x00\x08Expenses"
    query = frames.encode_body(FrameType.PRINCIPAL_QUERY, SAMPLE_BODIES[FrameType.PRINCIPAL_QUERY])
    assert query == bytes.fromhex("00000007") + BROKER.bytes + service + bytes.fromhex(
        "0000000000000003"
    )
    answer = frames.encode_body(
        FrameType.PRINCIPAL_ANSWER, SAMPLE_BODIES[FrameType.PRINCIPAL_ANSWER]
    )
    assert answer == bytes.fromhex("0000000701") + BROKER.bytes + service + bytes.fromhex(
        "0000000000000004"
    )
    with pytest.raises(RemoteProtocolError):
        frames.decode_body(FrameType.PRINCIPAL_ANSWER, answer[:-8])  # a body without it


# ------------------------------------------- streams: whole, byte by byte, chunks


def _stream(pki: Pki) -> tuple[Any, bytes, list[Event]]:
    i, a = open_pair(pki)
    sent: list[Event] = [
        Fragment(b"a" * 10),
        Keepalive(),
        Fragment(bytes(70_000)),
        PrincipalQuery(1, BROKER, "Expenses", 2),
        PrincipalAnswer(1, frames.MirrorRole.MIRROR, BROKER, "Expenses", 2**64 - 1),
        Fragment(b""),
    ]
    return a, b"".join(i.send(e) for e in sent), sent


def test_stream_fed_whole(pki: Pki) -> None:
    a, data, sent = _stream(pki)
    assert a.receive_data(data) == sent
    assert a.buffered_bytes == 0


def test_stream_fed_byte_by_byte(pki: Pki) -> None:
    a, data, sent = _stream(pki)
    got: list[Event] = []
    for k in range(len(data)):
        got += a.receive_data(data[k : k + 1])
    assert got == sent


def test_stream_fed_in_random_chunks_with_trailing_data(pki: Pki) -> None:
    a, data, sent = _stream(pki)
    rng = random.Random(4022)
    got: list[Event] = []
    pos = 0
    while pos < len(data):
        step = rng.randint(1, 5000)
        got += a.receive_data(data[pos : pos + step])
        pos += step
    assert got == sent
    # Trailing data: the start of a next frame stays buffered, nothing is emitted.
    assert a.receive_data(data[:30]) == []
    assert a.buffered_bytes == 30


if __name__ == "__main__" and "--regenerate" in sys.argv:
    GOLDEN.write_text(
        json.dumps({k: v.hex() for k, v in golden_vectors().items()}, indent=2) + "\n"
    )
    print(f"wrote {GOLDEN}")


def test_fragments_body_is_length_prefixed_payloads() -> None:
    body = frames.encode_fragments([b"ab", b"c"])
    assert body == b"\x00\x00\x00\x02ab\x00\x00\x00\x01c"
    assert frames.decode_fragments(body) == [b"ab", b"c"]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"", "no payload"),
        (b"\x00\x00", "truncated"),
        (b"\x00\x00\x00\x00", "empty payload"),
        (b"\x00\x00\x00\x05abc", "past the end"),
        (b"\x00\x00\x00\x01a\x00", "truncated"),
        (b"\x00\x00\x00\x01a" * (frames.MAX_FRAGMENTS_PER_FRAME + 1), "more than"),
    ],
)
def test_a_malformed_fragments_body_is_refused(body: bytes, problem: str) -> None:
    with pytest.raises(RemoteProtocolError, match=problem):
        frames.decode_fragments(body)


def test_fragments_encoder_bounds_its_count() -> None:
    with pytest.raises(ValueError):
        frames.encode_fragments([])
    with pytest.raises(ValueError):
        frames.encode_fragments([b"x"] * (frames.MAX_FRAGMENTS_PER_FRAME + 1))
