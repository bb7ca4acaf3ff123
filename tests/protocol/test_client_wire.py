"""Client wire format (protocol/client_wire.py): SDK <-> daemon client listener.

Round trips of every kind, every way of splitting the stream, rejection of bad
headers from the header alone, meta validation, encode errors, the
authentication proof, and a fuzz property: any bytes yield frames or
RemoteProtocolError, and the buffer stays bounded.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import LocalProtocolError, RemoteProtocolError
from protocol.client_wire import (
    CLIENT_FRAME_HEADER,
    CLIENT_WIRE_VERSION,
    DEFAULT_MAX_BODY,
    HEADER_SIZE,
    MAX_META_BYTES,
    ClientFrame,
    ClientFrameKind,
    ClientFrameReader,
    auth_proof,
    check_proof,
    encode_frame,
    encode_frame_parts,
    encode_meta,
    encode_request_parts,
    encode_response_parts,
    encode_sequence_reply,
    new_nonce,
)
from protocol.errors import CloseCode
from tests.protocol.client_samples import SAMPLES, STREAM


def _header(
    *,
    magic: bytes = b"BC",
    version: int = CLIENT_WIRE_VERSION,
    kind: int = ClientFrameKind.REQUEST,
    request_id: int = 7,
    meta_length: int = 2,
    body_length: int = 0,
) -> bytes:
    """A header built by construct (bypassing the Const for bad-magic tests)."""
    raw = CLIENT_FRAME_HEADER.build(
        {
            "version": version,
            "kind": kind,
            "request_id": request_id,
            "meta_length": meta_length,
            "body_length": body_length,
        }
    )
    return magic + raw[2:]


def _raw_frame(meta: bytes, body: bytes = b"", kind: int = ClientFrameKind.REQUEST) -> bytes:
    return _header(kind=kind, meta_length=len(meta), body_length=len(body)) + meta + body


# --- layout -----------------------------------------------------------------


def test_golden_bytes() -> None:
    frame = ClientFrame(ClientFrameKind.REQUEST, 0x01020304, {"op": "send"}, b"hi")
    assert encode_frame(frame) == (
        b"BC\x01\x02\x01\x02\x03\x04\x00\x00\x00\x0d\x00\x00\x00\x02" + b'{"op":"send"}' + b"hi"
    )


@pytest.mark.parametrize("frame", SAMPLES, ids=lambda f: f.kind.name)
def test_header_matches_construct_declaration(frame: ClientFrame) -> None:
    data = encode_frame(frame)
    parsed = CLIENT_FRAME_HEADER.parse(data[:HEADER_SIZE])
    assert parsed.version == CLIENT_WIRE_VERSION
    assert parsed.kind == frame.kind
    assert parsed.request_id == frame.request_id
    meta = json.dumps(frame.meta, separators=(",", ":"), ensure_ascii=False).encode()
    assert parsed.meta_length == len(meta)
    assert parsed.body_length == len(frame.body)
    assert data[:HEADER_SIZE] == _header(
        kind=frame.kind,
        request_id=frame.request_id,
        meta_length=len(meta),
        body_length=len(frame.body),
    )
    assert data[HEADER_SIZE:] == meta + frame.body


@pytest.mark.parametrize("frame", SAMPLES, ids=lambda f: f.kind.name)
def test_round_trip_every_kind(frame: ClientFrame) -> None:
    reader = ClientFrameReader()
    (got,) = reader.feed(encode_frame(frame))
    assert got == frame
    assert type(got.kind) is ClientFrameKind
    assert type(got.body) is bytes
    assert reader.buffered_bytes == 0


def test_every_kind_is_sampled() -> None:
    assert {f.kind for f in SAMPLES} == set(ClientFrameKind)


# --- stream splitting --------------------------------------------------------


def test_stream_fed_whole() -> None:
    assert ClientFrameReader().feed(STREAM) == SAMPLES


def test_stream_fed_byte_by_byte() -> None:
    reader = ClientFrameReader()
    got: list[ClientFrame] = []
    for i in range(len(STREAM)):
        got += reader.feed(STREAM[i : i + 1])
        assert reader.buffered_bytes <= HEADER_SIZE + 2000
    assert got == SAMPLES
    assert reader.buffered_bytes == 0


@pytest.mark.parametrize("seed", range(5))
def test_stream_fed_in_random_chunks(seed: int) -> None:
    rng = random.Random(seed)
    reader = ClientFrameReader()
    got: list[ClientFrame] = []
    pos = 0
    while pos < len(STREAM):
        step = rng.randint(0, 300)
        got += reader.feed(bytearray(STREAM[pos : pos + step]))
        pos += step
    assert got == SAMPLES
    assert reader.buffered_bytes == 0


def test_several_frames_in_one_chunk_with_a_partial_tail() -> None:
    reader = ClientFrameReader()
    cut = len(STREAM) - 5
    assert reader.feed(memoryview(STREAM)[:cut]) == SAMPLES[:-1]
    assert reader.buffered_bytes == len(encode_frame(SAMPLES[-1])) - 5
    assert reader.feed(STREAM[cut:]) == SAMPLES[-1:]
    assert reader.buffered_bytes == 0


@pytest.mark.parametrize("cut", [1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 5, -1])
def test_truncation_is_need_data(cut: int) -> None:
    data = encode_frame(SAMPLES[1])
    reader = ClientFrameReader()
    assert reader.feed(data[:cut]) == []
    assert reader.buffered_bytes == len(data[:cut])
    assert not reader.failed
    assert reader.feed(data[cut:]) == [SAMPLES[1]]


def test_empty_feed() -> None:
    reader = ClientFrameReader()
    assert reader.feed(b"") == []
    assert reader.buffered_bytes == 0


def test_body_limit_is_inclusive() -> None:
    frame = ClientFrame(ClientFrameKind.REQUEST, 1, {}, b"z" * 10)
    assert ClientFrameReader(max_body=10).feed(encode_frame(frame)) == [frame]
    with pytest.raises(RemoteProtocolError, match="body of 10 bytes exceeds the limit of 9"):
        ClientFrameReader(max_body=9).feed(encode_frame(frame))


# --- rejected from the header alone -----------------------------------------


@pytest.mark.parametrize(
    ("header", "match", "code"),
    [
        (_header(magic=b"GE"), r"bad client frame magic b'GE'", CloseCode.PROTOCOL_ERROR),
        (_header(version=2), "unsupported client wire version 2", CloseCode.VERSION_MISMATCH),
        (_header(version=0), "unsupported client wire version 0", CloseCode.VERSION_MISMATCH),
        (_header(kind=0), "unknown client frame kind 0", CloseCode.PROTOCOL_ERROR),
        (_header(kind=6), "unknown client frame kind 6", CloseCode.PROTOCOL_ERROR),
        (
            _header(meta_length=MAX_META_BYTES + 1),
            f"meta of {MAX_META_BYTES + 1} bytes exceeds the limit of {MAX_META_BYTES}",
            CloseCode.FRAME_TOO_LARGE,
        ),
        (
            _header(meta_length=0xFFFF_FFFF),
            "meta of 4294967295 bytes exceeds",
            CloseCode.FRAME_TOO_LARGE,
        ),
        (
            _header(body_length=DEFAULT_MAX_BODY + 1),
            f"body of {DEFAULT_MAX_BODY + 1} bytes exceeds the limit of {DEFAULT_MAX_BODY}",
            CloseCode.FRAME_TOO_LARGE,
        ),
    ],
    ids=["magic", "version2", "version0", "kind0", "kind6", "meta", "meta-max", "body"],
)
def test_bad_header_rejected_from_header_alone(header: bytes, match: str, code: CloseCode) -> None:
    reader = ClientFrameReader()
    assert len(header) == HEADER_SIZE
    with pytest.raises(RemoteProtocolError, match=match) as info:
        reader.feed(header)
    assert info.value.close_code is code
    assert reader.failed
    assert reader.buffered_bytes == 0


def test_custom_body_limit_checked_from_header() -> None:
    reader = ClientFrameReader(max_body=1000)
    with pytest.raises(RemoteProtocolError, match="body of 1001 bytes exceeds the limit of 1000"):
        reader.feed(_header(body_length=1001))


def test_bad_header_after_good_frames_reports_them() -> None:
    reader = ClientFrameReader()
    with pytest.raises(RemoteProtocolError, match="magic") as info:
        reader.feed(encode_frame(SAMPLES[0]) + encode_frame(SAMPLES[1]) + b"XX" + b"\0" * 14)
    assert info.value.events == SAMPLES[:2]


# --- meta validation -----------------------------------------------------------


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        (b"[1,2]", "must be a JSON object, not an array"),
        (b'"s"', "must be a JSON object, not a string"),
        (b"3", "must be a JSON object, not a number"),
        (b"null", "must be a JSON object, not null"),
        (b"true", "must be a JSON object, not a boolean"),
        (b"", "not valid JSON"),
        (b"{", "not valid JSON"),
        (b'{"a":1}x', "not valid JSON"),
        (b'{"a":NaN}', "not valid JSON"),
        (b'{"a":-Infinity}', "not valid JSON"),
        (b"\xef\xbb\xbf{}", "not valid JSON"),  # a BOM
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
        (b'{"a":"\xff"}', "not valid UTF-8"),
        (b'{"a":"\xed\xa0\x80"}', "not valid UTF-8"),  # an encoded surrogate
        ('{"a":1}'.encode("utf-16"), "not valid UTF-8"),
    ],
    ids=[
        "array",
        "string",
        "number",
        "null",
        "bool",
        "empty",
        "truncated",
        "trailing",
        "nan",
        "infinity",
        "bom",
        "deep",
        "bad-utf8",
        "surrogate",
        "utf16",
    ],
)
def test_bad_meta_rejected(meta: bytes, match: str) -> None:
    reader = ClientFrameReader()
    with pytest.raises(RemoteProtocolError, match=match) as info:
        reader.feed(_raw_frame(meta, b"body"))
    assert info.value.close_code is CloseCode.PROTOCOL_ERROR
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


def test_dead_after_error() -> None:
    reader = ClientFrameReader()
    with pytest.raises(RemoteProtocolError, match="magic"):
        reader.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    for data in (encode_frame(SAMPLES[0]), b""):
        with pytest.raises(RemoteProtocolError, match="already failed: bad client frame magic"):
            reader.feed(data)
    assert reader.buffered_bytes == 0


def test_dead_after_meta_error_keeps_close_code() -> None:
    reader = ClientFrameReader()
    with pytest.raises(RemoteProtocolError):
        reader.feed(_header(version=9))
    with pytest.raises(RemoteProtocolError, match="already failed") as info:
        reader.feed(b"x")
    assert info.value.close_code is CloseCode.VERSION_MISMATCH


def test_bad_max_body() -> None:
    with pytest.raises(LocalProtocolError):
        ClientFrameReader(max_body=-1)
    with pytest.raises(LocalProtocolError):
        ClientFrameReader(max_meta=-1)


def test_a_small_meta_limit_refuses_from_the_header_alone() -> None:
    """A server keeps the meta small until its peer logs in: the announced length is
    refused before any of the meta is buffered."""
    frame = ClientFrame(ClientFrameKind.REQUEST, 1, {"pad": "x" * 200}, b"")
    wire = encode_frame(frame)
    assert ClientFrameReader(max_meta=len(wire)).feed(wire) == [frame]
    reader = ClientFrameReader(max_meta=100)
    with pytest.raises(RemoteProtocolError, match="exceeds the limit of 100"):
        reader.feed(wire[:HEADER_SIZE])
    assert reader.buffered_bytes == 0


# --- encode errors ---------------------------------------------------------------


class _Opaque:
    pass


def _circular() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (ClientFrame(ClientFrameKind.REQUEST, -1, {}), "request_id -1 does not fit"),
        (ClientFrame(ClientFrameKind.REQUEST, 2**32, {}), "does not fit in a u32"),
        (ClientFrame(ClientFrameKind.REQUEST, True, {}), "request_id must be an int"),  # type: ignore[arg-type]
        (ClientFrame(ClientFrameKind.REQUEST, "1", {}), "request_id must be an int"),  # type: ignore[arg-type]
        (ClientFrame(9, 1, {}), "unknown client frame kind 9"),  # type: ignore[arg-type]
        (ClientFrame(ClientFrameKind.REQUEST, 1, {"x": _Opaque()}), "not JSON-serialisable"),
        (ClientFrame(ClientFrameKind.REQUEST, 1, {"x": b"bytes"}), "not JSON-serialisable"),
        (ClientFrame(ClientFrameKind.REQUEST, 1, {"x": float("nan")}), "not JSON-serialisable"),
        (ClientFrame(ClientFrameKind.REQUEST, 1, {"x": "\ud800"}), "not JSON-serialisable"),
        (ClientFrame(ClientFrameKind.REQUEST, 1, {(1, 2): 1}), "not JSON-serialisable"),  # type: ignore[dict-item]
        (ClientFrame(ClientFrameKind.REQUEST, 1, _circular()), "not JSON-serialisable"),
        (ClientFrame(ClientFrameKind.REQUEST, 1, [1]), "meta must be a dict"),  # type: ignore[arg-type]
        (
            ClientFrame(ClientFrameKind.REQUEST, 1, {"x": "a" * MAX_META_BYTES}),
            "exceeds the limit of 1048576",
        ),
        (ClientFrame(ClientFrameKind.REQUEST, 1, {}, "text"), "body must be bytes-like"),  # type: ignore[arg-type]
    ],
    ids=[
        "id-negative",
        "id-too-big",
        "id-bool",
        "id-str",
        "kind",
        "object",
        "bytes",
        "nan",
        "surrogate",
        "tuple-key",
        "circular",
        "list-meta",
        "meta-too-large",
        "str-body",
    ],
)
def test_encode_errors(frame: ClientFrame, match: str) -> None:
    with pytest.raises(LocalProtocolError, match=match):
        encode_frame(frame)


def test_encode_accepts_largest_meta_and_bytes_like_bodies() -> None:
    meta = {"x": "a" * (MAX_META_BYTES - len('{"x":""}'))}
    frame = ClientFrame(ClientFrameKind.REQUEST, 0, meta, b"b")
    (got,) = ClientFrameReader().feed(encode_frame(frame))
    assert got == frame
    for body in (bytearray(b"abc"), memoryview(b"abc")):
        data = encode_frame(ClientFrame(ClientFrameKind.NOTICE, 0, {}, body))  # type: ignore[arg-type]
        assert ClientFrameReader().feed(data)[0].body == b"abc"


@pytest.mark.parametrize(
    "meta",
    [{}, {"messages": []}, {"messages": [{"a": "é", "n": 2**63 - 1, "t": 1.5}]}],
)
def test_a_response_from_encoded_meta_is_the_same_bytes(meta: dict[str, Any]) -> None:
    body = [b"one", bytearray(b"two"), memoryview(b"three")]
    assert b"".join(encode_response_parts(7, encode_meta(meta), body)) == b"".join(
        encode_frame_parts(ClientFrameKind.RESPONSE, 7, meta, body)
    )


def test_encoded_meta_is_checked_like_a_frame() -> None:
    with pytest.raises(LocalProtocolError, match="must be a dict"):
        encode_meta([])  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="JSON"):
        encode_meta({"x": float("nan")})
    with pytest.raises(LocalProtocolError, match="exceeds the limit"):
        encode_response_parts(0, b"x" * (MAX_META_BYTES + 1), [])


# --- authentication -------------------------------------------------------------

TOKEN = b"\x01" * 32
NONCE = bytes(range(32))


def test_new_nonce_uses_the_entropy_source() -> None:
    asked: list[int] = []

    def entropy(n: int) -> bytes:
        asked.append(n)
        return b"\x07" * n

    assert new_nonce(entropy) == b"\x07" * 32
    assert asked == [32]
    with pytest.raises(LocalProtocolError):
        new_nonce(lambda n: b"short")


def test_auth_proof_value() -> None:
    expected = hmac.new(
        TOKEN, b"brokerd-client-v1\x00" + "zoë".encode() + b"\x00" + NONCE, hashlib.sha256
    ).hexdigest()
    assert auth_proof(TOKEN, NONCE, "zoë") == expected
    assert len(expected) == 64


def test_check_proof() -> None:
    proof = auth_proof(TOKEN, NONCE, "alice")
    assert check_proof(TOKEN, NONCE, "alice", proof)
    assert not check_proof(b"\x02" * 32, NONCE, "alice", proof)
    assert not check_proof(TOKEN, bytes(32), "alice", proof)
    assert not check_proof(TOKEN, NONCE, "alicf", proof)
    assert not check_proof(TOKEN, NONCE, "bob", proof)
    assert not check_proof(TOKEN, NONCE, "alice", proof.upper())
    assert not check_proof(TOKEN, NONCE, "alice", proof[:-1])
    assert not check_proof(TOKEN, NONCE, "alice", "")
    assert not check_proof(TOKEN, NONCE, "alice", "é" * 64)
    assert not check_proof(TOKEN, NONCE, "\ud800", proof)
    for not_str in (None, 1, proof.encode(), [proof], {"proof": proof}):
        assert not check_proof(TOKEN, NONCE, "alice", not_str)


# --- fuzz ----------------------------------------------------------------------

FUZZ_MAX_BODY = 64
fuzz = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
frames_st = st.builds(
    ClientFrame,
    st.sampled_from(ClientFrameKind),
    st.integers(0, 0xFFFF_FFFF),
    st.dictionaries(st.text(max_size=6), json_values, max_size=4),
    st.binary(max_size=FUZZ_MAX_BODY),
)
segments = st.lists(
    st.one_of(
        frames_st.map(encode_frame),
        st.binary(max_size=40),
        # a valid prefix followed by garbage: gets past the magic check
        st.tuples(frames_st.map(encode_frame), st.integers(0, 60), st.binary(max_size=20)).map(
            lambda t: t[0][: t[1]] + t[2]
        ),
    ),
    min_size=1,
    max_size=6,
)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@fuzz
@given(parts=segments, cuts=st.lists(st.integers(0, 2000), max_size=10))
def test_fuzz_random_bytes_yield_frames_or_remote_error(
    parts: list[bytes], cuts: list[int]
) -> None:
    data = b"".join(parts)
    reader = ClientFrameReader(max_body=FUZZ_MAX_BODY)
    fed = 0
    for chunk in _chunks(data, cuts):
        try:
            got = reader.feed(chunk)
        except RemoteProtocolError as exc:
            assert all(isinstance(f, ClientFrame) for f in exc.events)
            assert reader.failed and reader.buffered_bytes == 0
            with pytest.raises(RemoteProtocolError):
                reader.feed(b"more")
            return
        fed += len(chunk)
        for frame in got:
            assert isinstance(frame.kind, ClientFrameKind)
            assert isinstance(frame.meta, dict)
            assert len(frame.body) <= FUZZ_MAX_BODY
        assert reader.buffered_bytes <= min(fed, HEADER_SIZE + MAX_META_BYTES + FUZZ_MAX_BODY)


@fuzz
@given(frames=st.lists(frames_st, max_size=5), cuts=st.lists(st.integers(0, 2000), max_size=10))
def test_fuzz_round_trip_any_split(frames: list[ClientFrame], cuts: list[int]) -> None:
    data = b"".join(encode_frame(f) for f in frames)
    reader = ClientFrameReader(max_body=FUZZ_MAX_BODY)
    got: list[ClientFrame] = []
    for chunk in _chunks(data, cuts):
        got += reader.feed(chunk)
    assert got == frames
    assert reader.buffered_bytes == 0


@pytest.mark.parametrize("number", [-(2**63) - 1, 2**64, 10**30, -(10**19)])
def test_integers_beyond_64_bits_in_meta_stay_integers(number: int) -> None:
    """orjson reads such integers as floats; the meta decoder hands them to json instead."""
    frame = ClientFrame(ClientFrameKind.REQUEST, 7, {"n": number, "s": "x" * 25}, b"")
    (got,) = ClientFrameReader().feed(encode_frame(frame))
    assert got.meta == {"n": number, "s": "x" * 25}
    assert type(got.meta["n"]) is int


@pytest.mark.parametrize(
    ("request_id", "seq"), [(0, 1), (1, 0), (7, -3), (0xFFFF_FFFF, 2**63 - 1), (42, -(2**63))]
)
def test_sequence_reply_is_the_general_encoding(request_id: int, seq: int) -> None:
    """The SEND reply's direct encoding is byte for byte the general one."""
    general = encode_frame(
        ClientFrame(ClientFrameKind.RESPONSE, request_id, {"sequence_number": seq})
    )
    assert encode_sequence_reply(request_id, seq) == general


@pytest.mark.parametrize(
    "meta",
    [
        b'{"sequence_number":5}',
        b'{"sequence_number":0}',
        b'{"sequence_number":999999999999999999}',
        b'{"sequence_number":9223372036854775807}',
        b'{"sequence_number":123456789012345678901}',
        b'{"sequence_number":-5}',
        b'{"sequence_number":05}',
        b'{"sequence_number":1_0}',
        b'{"sequence_number": 5}',
        b'{"sequence_number":5 }',
        b'{"sequence_number":}',
        b'{"sequence_number":\xd9\xa3}',
        b'{"sequence_number":5,"x":1}',
    ],
)
def test_a_sequence_reply_decodes_as_json_says(meta: bytes) -> None:
    """The reader's shortcut for a SEND's reply gives what JSON gives, or the same error:
    no integer JSON refuses (a leading zero, an underscore, other digits) gets through."""
    frame = b"".join(encode_response_parts(9, meta, []))
    try:
        expected: object = json.loads(meta)
    except ValueError:
        with pytest.raises(RemoteProtocolError, match="not valid"):
            ClientFrameReader().feed(frame)
    else:
        (got,) = ClientFrameReader().feed(frame)
        assert got.meta == expected
        assert [type(v) for v in got.meta.values()] == [type(v) for v in expected.values()]


@pytest.mark.parametrize("message_type", ["DEFAULT", "//shop/Order", "null é"])
def test_a_request_from_encoded_meta_is_the_same_bytes(message_type: str) -> None:
    """A SEND whose meta was encoded once (the SDK's) is byte for byte the general frame."""
    meta = {"op": "send", "conversation_handle": "h", "message_type": message_type}
    for body in (b"", b"x" * 300, bytearray(b"abc"), b"y" * 200_000):
        pieces = encode_request_parts(3, encode_meta(meta), body)
        assert pieces[-1] is body  # the body is not copied
        assert b"".join(pieces) == encode_frame(
            ClientFrame(ClientFrameKind.REQUEST, 3, meta, bytes(body))
        )
    with pytest.raises(LocalProtocolError, match="u32"):
        encode_request_parts(2**32, b"{}", b"")


def test_a_repeated_meta_decodes_to_a_copy_and_a_bad_one_still_fails() -> None:
    """A reader keeps the last small meta it decoded (a producer's SENDs on one dialog
    repeat it): each repeat gets an equal dict of its own; another meta is decoded; a
    meta that is not a JSON object is refused even right after a good one."""
    send = {"op": "send", "conversation_handle": "7f7c", "message_type": "//t"}
    frames = [
        ClientFrame(ClientFrameKind.REQUEST, i, meta, b"body")
        for i, meta in enumerate([send, send, {**send, "message_type": "//u"}, send])
    ]
    reader = ClientFrameReader()
    got = reader.feed(b"".join(encode_frame(f) for f in frames))
    assert got == frames
    assert got[0].meta is not got[1].meta and got[1].meta is not got[3].meta
    got[0].meta["op"] = "changed"
    assert reader.feed(encode_frame(frames[0])) == [frames[0]]
    bad = bytearray(encode_frame(frames[0]))
    meta = encode_meta(send)
    bad[HEADER_SIZE : HEADER_SIZE + len(meta)] = b"[" + b" " * (len(meta) - 2) + b"]"
    with pytest.raises(RemoteProtocolError, match="JSON object"):
        reader.feed(bytes(bad))
