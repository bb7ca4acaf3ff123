"""Tests of protocol/codec.py: FastCodec and fixed_struct against construct, and the
parse/build wrappers (SPEC §3, R-PROTO-1: the adjacent broker protocol "encodes
fragments in a standard wire format"; docs/design.md: the wire format is
declared once, in construct, and every derived codec must agree with it).

The construct declarations are the single definition of the wire format, so every
test here builds the same value with construct (interpreted and compiled) and with
the derived codec and requires identical bytes, and parses each one's output with
the other. Peer bytes that do not fit must surface as RemoteProtocolError, our own
bad values as LocalProtocolError, and nothing else (no construct or struct errors).
"""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import construct as c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import dialog, frames
from protocol.codec import FastCodec, fixed_struct
from protocol.errors import LocalProtocolError, RemoteProtocolError

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

STRUCTS: dict[str, c.Struct] = {
    "FRAME_HEADER": frames.FRAME_HEADER,
    "HELLO_BODY": frames.HELLO_BODY,
    "HELLO_REPLY_CORE": frames.HELLO_REPLY_CORE,
    "HELLO_REPLY_BODY": frames.HELLO_REPLY_BODY,
    "PROOF_BODY": frames.PROOF_BODY,
    "CLOSE_BODY": frames.CLOSE_BODY,
    "PRINCIPAL_QUERY_BODY": frames.PRINCIPAL_QUERY_BODY,
    "PRINCIPAL_ANSWER_BODY": frames.PRINCIPAL_ANSWER_BODY,
    "KEEPALIVE_BODY": frames.KEEPALIVE_BODY,
    "WELCOME_BODY": frames.WELCOME_BODY,
    "DIALOG_HEADER": dialog.DIALOG_HEADER,
    "SECURED_DIALOG_HEADER": dialog.SECURED_DIALOG_HEADER,
    "FRAGMENT_PAYLOAD": dialog.FRAGMENT_PAYLOAD,
    "ACK_PAYLOAD": dialog.ACK_PAYLOAD,
}
COMPILED = {name: con.compile() for name, con in STRUCTS.items()}
CODECS = {name: FastCodec(con) for name, con in STRUCTS.items()}
TERMINATED = [
    name for name, con in STRUCTS.items() if con.subcons and con.subcons[-1] is c.Terminated
]


def construct_parse(con: Any, data: bytes) -> Any:
    """The oracle: what construct's interpreted parser accepts (RemoteProtocolError if not)."""
    try:
        return con.parse(data)
    except (c.ConstructError, struct.error, UnicodeDecodeError) as exc:
        raise RemoteProtocolError(f"construct refused the bytes: {exc}") from None


UUID_A = bytes(range(16))
UUID_B = bytes(range(16, 32))

# Hand-written sample values, one or more per declaration.
SAMPLES: dict[str, list[dict[str, Any]]] = {
    "FRAME_HEADER": [
        dict(
            magic=b"BK",
            version=1,
            frame_type=16,
            flags=3,
            reserved=b"\x00",
            length=1234,
            counter=2**64 - 1,
            header_crc=0xDEADBEEF,
        ),
        dict(
            magic=b"BK",
            version=0,
            frame_type=0,
            flags=0,
            reserved=b"\x00",
            length=0,
            counter=0,
            header_crc=0,
        ),
    ],
    "HELLO_BODY": [
        dict(
            versions=[1, 2, 65535],
            instance_name="alpha",
            random=bytes(range(32)),
            ephemeral_key=bytes(range(32, 64)),
            encryption=1,
            max_frame_size=frames.DEFAULT_MAX_FRAME_SIZE,
            certificate=b"-----BEGIN CERTIFICATE-----",
        ),
        dict(
            versions=[],
            instance_name="",
            random=bytes(32),
            ephemeral_key=bytes(32),
            encryption=0,
            max_frame_size=0,
            certificate=b"",
        ),
    ],
    "HELLO_REPLY_CORE": [
        dict(
            version=1,
            instance_name="βeta/ブローカー",
            random=b"\xff" * 32,
            ephemeral_key=b"\x01" * 32,
            encryption=3,
            encrypted=1,
            max_frame_size=4096,
            certificate=b"cert" * 10,
        )
    ],
    "HELLO_REPLY_BODY": [dict(core=b"core bytes", signature=b"\x00sig\xff")],
    "PROOF_BODY": [dict(signature=b"signature"), dict(signature=b"")],
    "CLOSE_BODY": [dict(code=1, reason="idle"), dict(code=65535, reason="")],
    "PRINCIPAL_QUERY_BODY": [
        dict(query_id=7, broker_instance=UUID_A, service="msdb", epoch=0),
        dict(query_id=8, broker_instance=UUID_A, service="msdb", epoch=2**64 - 1),
    ],
    "PRINCIPAL_ANSWER_BODY": [
        dict(query_id=2**32 - 1, role=2, broker_instance=UUID_B, service="Базаданных", epoch=9)
    ],
    "KEEPALIVE_BODY": [{}],
    "WELCOME_BODY": [{}],
    "DIALOG_HEADER": [
        dict(
            conversation_id=UUID_A,
            flags=3,
            sequence_number=9,
            fragment_index=1,
            fragment_count=4,
            fragment_offset=65536,
            message_length=200000,
            lifetime=3600,
            hop_count=2,
            from_broker_instance=UUID_B,
            to_broker_instance=bytes(16),
            ack_through=4,
            ack_ranges=[dict(first=6, last=7), dict(first=9, last=2**64 - 1)],
            ack_fragments=[dict(sequence_number=5, first=0, last=2**32 - 1)],
            from_service="//alpha/Initiator",
            to_service="//beta/Zielservice/ü",
            contract="DEFAULT",
            message_type=dialog.END_DIALOG,
        )
    ],
    "SECURED_DIALOG_HEADER": [
        dict(
            conversation_id=UUID_A,
            flags=0x13,
            sequence_number=9,
            fragment_index=0,
            fragment_count=1,
            fragment_offset=0,
            message_length=5,
            lifetime=0,
            hop_count=1,
            from_broker_instance=UUID_B,
            to_broker_instance=UUID_A,
            ack_through=4,
            ack_ranges=[],
            ack_fragments=[],
            nonce=bytes(range(12)),
            tag=b"\xff" * 16,
            key_exchange=b"key exchange",
            from_service="//alpha/Initiator",
            to_service="//beta/Target",
            contract="DEFAULT",
            message_type="DEFAULT",
        )
    ],
    "FRAGMENT_PAYLOAD": [dict(header=b"head", body=b"body bytes"), dict(header=b"", body=b"")],
    "ACK_PAYLOAD": [dict(headers=[b"one", b"", b"three"]), dict(headers=[])],
}


# --------------------------------------------------------------------------- helpers


def _unwrap(sub: Any) -> Any:
    return sub.subcon if isinstance(sub, c.Renamed) else sub


def _array_item(con: Any) -> Any:
    """The item construct of a PrefixedArray (a FocusedSeq over count and items)."""
    return con.subcons[1].subcon.subcon


def _is_array(con: Any) -> bool:
    return isinstance(con, c.FocusedSeq) and con.parsebuildfrom == "items"


def _fields(con: c.Struct) -> list[tuple[str, Any]]:
    """Named, non-constant fields of a Struct in declaration order."""
    out = []
    for sub in con.subcons:
        inner = _unwrap(sub)
        if sub.name and not isinstance(inner, c.Const):
            out.append((sub.name, inner))
    return out


def to_row(con: c.Struct, value: dict[str, Any]) -> tuple[Any, ...]:
    """A construct value as FastCodec's flat tuple (nested fixed structs become tuples)."""
    row: list[Any] = []
    for name, inner in _fields(con):
        v = value[name]
        if _is_array(inner) and isinstance(_array_item(inner), c.Struct):
            item = _array_item(inner)
            v = [tuple(e[n] for n, _ in _fields(item)) for e in v]
        row.append(v)
    return tuple(row)


def plain(value: Any) -> Any:
    """construct Container/ListContainer as plain dicts/lists, without ``_io`` keys."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if not k.startswith("_")}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def without_consts(con: c.Struct, value: dict[str, Any]) -> dict[str, Any]:
    names = {n for n, _ in _fields(con)}
    return {k: v for k, v in value.items() if k in names}


def _int_strategy(fmtstr: str) -> st.SearchStrategy[int]:
    code = fmtstr.lstrip("<>=!")
    bits = 8 * struct.calcsize(">" + code)
    if code.islower():
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return st.integers(0, 2**bits - 1)


def strategy_for(con: Any) -> st.SearchStrategy[Any]:
    """A hypothesis strategy of valid construct values, derived from the declaration."""
    con = _unwrap(con)
    if isinstance(con, c.Struct):
        return st.fixed_dictionaries({name: strategy_for(inner) for name, inner in _fields(con)})
    if isinstance(con, c.FormatField):
        return _int_strategy(con.fmtstr)
    if isinstance(con, c.Bytes) and isinstance(con.length, int):
        return st.binary(min_size=con.length, max_size=con.length)
    if isinstance(con, c.StringEncoded):
        # At most 60 code points = 240 UTF-8 bytes: fits every length prefix in use.
        return st.text(st.characters(exclude_categories=["Cs"]), max_size=60)
    if isinstance(con, c.Prefixed):
        return st.binary(max_size=80)
    if con is c.GreedyBytes:
        return st.binary(max_size=80)
    if _is_array(con):
        return st.lists(strategy_for(_array_item(con)), max_size=6)
    raise AssertionError(f"no strategy for {con!r}")


def _assert_all_agree(name: str, value: dict[str, Any]) -> None:
    con, compiled, fast = STRUCTS[name], COMPILED[name], CODECS[name]
    row = to_row(con, value)
    interpreted = con.build(value)
    assert compiled.build(value) == interpreted
    assert fast.build(row) == interpreted
    # Each parses the others' output to the same value.
    assert fast.parse(interpreted) == row
    expected = without_consts(con, plain(value))
    assert without_consts(con, plain(con.parse(interpreted))) == expected
    assert without_consts(con, plain(compiled.parse(interpreted))) == expected


def _valid_encodings() -> list[tuple[str, bytes]]:
    return [(name, STRUCTS[name].build(v)) for name in STRUCTS for v in SAMPLES[name]]


# ----------------------------------------------------------- equivalence with construct


def test_every_declaration_has_samples() -> None:
    assert set(SAMPLES) == set(STRUCTS)


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_fastcodec_builds_and_parses_like_construct_samples(name: str) -> None:
    """R-PROTO-1: FastCodec == construct (interpreted and compiled) on hand-written values."""
    for value in SAMPLES[name]:
        _assert_all_agree(name, value)


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_fastcodec_builds_and_parses_like_construct_generated(name: str) -> None:
    """R-PROTO-1: FastCodec == construct on values generated from every declaration."""

    @FAST
    @given(value=strategy_for(STRUCTS[name]))
    def check(value: dict[str, Any]) -> None:
        _assert_all_agree(name, value)

    check()


@settings(max_examples=200, deadline=None)
@given(value=strategy_for(dialog.DIALOG_HEADER))
def test_dialog_header_fastcodec_equals_construct(value: dict[str, Any]) -> None:
    """R-DLG-1/R-DLG-5: the dialog header hot path matches its construct declaration."""
    _assert_all_agree("DIALOG_HEADER", value)


@settings(max_examples=200, deadline=None)
@given(value=strategy_for(frames.HELLO_BODY))
def test_hello_body_fastcodec_equals_construct(value: dict[str, Any]) -> None:
    """R-PROTO-1: HELLO body built by FastCodec equals construct's, both ways."""
    _assert_all_agree("HELLO_BODY", value)


def test_known_bytes_of_a_few_bodies() -> None:
    """Byte layouts written out by hand, so a shared mistake in construct use shows too."""
    close = CODECS["CLOSE_BODY"]
    assert close.build((1, "bye")) == b"\x00\x01\x00\x03bye"
    hello_versions = CODECS["HELLO_BODY"].build(([1, 2], "a", b"r" * 32, b"k" * 32, 2, 4096, b"C"))
    assert hello_versions == (
        b"\x02\x00\x01\x00\x02" + b"\x00\x01a" + b"r" * 32 + b"k" * 32 + b"\x02"
        b"\x00\x00\x10\x00" + b"\x00\x01C"
    )
    assert CODECS["ACK_PAYLOAD"].build(([b"ab", b""],)) == b"\x00\x02\x00\x02ab\x00\x00"
    assert CODECS["FRAGMENT_PAYLOAD"].build((b"h", b"body")) == b"\x00\x01hbody"
    assert CODECS["WELCOME_BODY"].build(()) == b""


def test_fastcodec_field_names_follow_declaration_order() -> None:
    assert CODECS["FRAME_HEADER"].names == [
        "version",
        "frame_type",
        "flags",
        "length",
        "counter",
        "header_crc",
    ]
    assert CODECS["DIALOG_HEADER"].names == [n for n, _ in _fields(dialog.DIALOG_HEADER)]


def test_fastcodec_rejects_unsupported_declarations() -> None:
    with pytest.raises(TypeError):
        FastCodec(c.Struct("x" / c.VarInt))


# ------------------------------------------------------------------------ fixed_struct


def test_fixed_struct_frame_header_size_and_bytes() -> None:
    """R-PROTO-1: the 22-byte frame header derived with struct matches construct."""
    derived = fixed_struct(frames.FRAME_HEADER)
    assert derived.size == 22 == frames.HEADER_SIZE == frames.FRAME_HEADER.sizeof()
    for value in SAMPLES["FRAME_HEADER"]:
        packed = derived.pack(*(value[sub.name] for sub in frames.FRAME_HEADER.subcons))
        assert packed == frames.FRAME_HEADER.build(value)
        assert packed == COMPILED["FRAME_HEADER"].build(value)
        parsed = derived.unpack(packed)
        assert parsed == tuple(value[sub.name] for sub in frames.FRAME_HEADER.subcons)


def test_fixed_struct_agrees_with_frames_encode_header() -> None:
    """frames.encode_header (hot path) emits what construct parses, with a valid CRC."""
    data = frames.encode_header(1, frames.FrameType.FRAGMENT, 3, 1000, 42)
    parsed = frames.FRAME_HEADER.parse(data)
    assert (parsed.version, parsed.frame_type, parsed.flags, parsed.length, parsed.counter) == (
        1,
        16,
        3,
        1000,
        42,
    )
    assert frames.decode_header(data, 4096) == frames.FrameHeader(1, 16, 3, 1000, 42)


def test_fixed_struct_rejects_variable_size_struct() -> None:
    with pytest.raises(TypeError):
        fixed_struct(frames.HELLO_BODY)


# ------------------------------------------------------------- FastCodec.parse failures


@pytest.mark.parametrize(("name", "data"), _valid_encodings())
def test_fastcodec_parse_truncated_input_is_remote_error(name: str, data: bytes) -> None:
    """Every strict prefix of a valid encoding is refused (GreedyBytes tails excepted)."""
    codec = CODECS[name]
    if name == "FRAGMENT_PAYLOAD":
        # The body is GreedyBytes: only cutting into the prefixed header is detectable.
        (hlen,) = struct.unpack_from(">H", data)
        cuts = range(2 + hlen)
    else:
        cuts = range(len(data))
    for n in cuts:
        with pytest.raises(RemoteProtocolError):
            codec.parse(data[:n])


@pytest.mark.parametrize("name", TERMINATED)
def test_fastcodec_parse_trailing_bytes_is_remote_error(name: str) -> None:
    """Structs ending in Terminated refuse trailing bytes, like construct does."""
    data = STRUCTS[name].build(SAMPLES[name][0])
    for extra in (b"\x00", b"junk"):
        with pytest.raises(RemoteProtocolError, match="trailing"):
            CODECS[name].parse(data + extra)
        with pytest.raises(RemoteProtocolError):
            construct_parse(STRUCTS[name], data + extra)


def test_fastcodec_parse_frame_header_ignores_trailing_bytes_like_construct() -> None:
    """FRAME_HEADER has no Terminated: both construct and FastCodec read 22 bytes only."""
    value = SAMPLES["FRAME_HEADER"][0]
    data = frames.FRAME_HEADER.build(value) + b"body"
    assert CODECS["FRAME_HEADER"].parse(data) == to_row(frames.FRAME_HEADER, value)
    assert plain(frames.FRAME_HEADER.parse(data)) == value


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("CLOSE_BODY", b"\x00\x01\x00\x10bye"),  # name prefix 16, 3 bytes present
        ("CLOSE_BODY", b"\x00\x01\xff\xff"),
        ("PROOF_BODY", b"\x00\x05abcd"),  # blob prefix 5, 4 bytes present
        ("HELLO_REPLY_BODY", b"\x00\x02ab\x00\x09sig"),
        ("HELLO_BODY", b"\x05\x00\x01"),  # 5 versions announced, one present
        ("DIALOG_HEADER", bytes(16 + 2 + 8 + 4 + 4 + 8 + 8 + 4 + 1 + 16 + 16 + 8) + b"\x09"),
        ("ACK_PAYLOAD", b"\x00\x03\x00\x01a\x00\x01b"),  # 3 headers, 2 present
        ("ACK_PAYLOAD", b"\x00\x01\x00\x09abc"),  # header prefix 9, 3 present
        ("FRAGMENT_PAYLOAD", b"\x00\x20short"),
    ],
)
def test_fastcodec_parse_length_prefix_past_end_is_remote_error(name: str, data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        CODECS[name].parse(data)
    with pytest.raises(RemoteProtocolError):
        construct_parse(STRUCTS[name], data)  # construct agrees that this is malformed


@pytest.mark.parametrize("bad", [b"\xff", b"\xc3", b"\xed\xa0\x80", b"ok\x80"])
def test_fastcodec_parse_bad_utf8_is_remote_error(bad: bytes) -> None:
    data = b"\x00\x01" + struct.pack(">H", len(bad)) + bad
    with pytest.raises(RemoteProtocolError):
        CODECS["CLOSE_BODY"].parse(data)
    query = struct.pack(">I", 1) + UUID_A + struct.pack(">H", len(bad)) + bad
    with pytest.raises(RemoteProtocolError):
        CODECS["PRINCIPAL_QUERY_BODY"].parse(query)


def test_fastcodec_parse_bad_utf8_in_dialog_service_name_is_remote_error() -> None:
    value = dict(SAMPLES["DIALOG_HEADER"][0], to_service="x")
    data = dialog.DIALOG_HEADER.build(value)
    # to_service is the second name; its single byte "x" sits before the last two names.
    tail = 2 + len(b"DEFAULT") + 2 + len(dialog.END_DIALOG.encode())
    broken = bytearray(data)
    assert broken[-tail - 1] == ord("x")
    broken[-tail - 1] = 0xFF
    with pytest.raises(RemoteProtocolError):
        CODECS["DIALOG_HEADER"].parse(bytes(broken))


@pytest.mark.parametrize(
    "data",
    [
        b"XK" + bytes(20),
        b"BX" + bytes(20),
        b"bk" + bytes(20),
        b"BK\x01\x10\x00\x01" + bytes(16),  # reserved byte not zero
    ],
)
def test_fastcodec_parse_wrong_constant_is_remote_error(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        CODECS["FRAME_HEADER"].parse(data)
    with pytest.raises(RemoteProtocolError):
        construct_parse(frames.FRAME_HEADER, data)


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_fastcodec_parse_agrees_with_construct_on_mutated_input(name: str) -> None:
    """Differential fuzzing: on damaged encodings, FastCodec accepts exactly what construct
    accepts (with the same value) and otherwise raises RemoteProtocolError only."""
    con, fast = STRUCTS[name], CODECS[name]

    @FAST
    @given(value=strategy_for(con), data=st.data())
    def check(value: dict[str, Any], data: st.DataObject) -> None:
        raw = bytearray(con.build(value))
        action = data.draw(st.sampled_from(["flip", "cut", "append"]))
        if action == "flip" and raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= data.draw(st.integers(1, 255))
        elif action == "cut" and raw:
            del raw[data.draw(st.integers(0, len(raw) - 1)) :]
        else:
            raw += data.draw(st.binary(min_size=1, max_size=4))
        damaged = bytes(raw)
        try:
            expected = construct_parse(con, damaged)
        except RemoteProtocolError:
            with pytest.raises(RemoteProtocolError):
                fast.parse(damaged)
            return
        got = fast.parse(damaged)
        assert got == to_row(con, plain(expected))

    check()


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200))
def test_fastcodec_parse_random_bytes_only_remote_errors(data: bytes) -> None:
    """Arbitrary peer bytes: a value or RemoteProtocolError; any other exception fails."""
    for fast in CODECS.values():
        with contextlib.suppress(RemoteProtocolError):
            fast.parse(data)


# ------------------------------------------------------------- FastCodec.build failures


@pytest.mark.parametrize(
    ("name", "row"),
    [
        # too few values
        ("CLOSE_BODY", ()),
        ("CLOSE_BODY", (1,)),
        ("FRAME_HEADER", (1, 2, 3, 4, 5)),
        ("DIALOG_HEADER", to_row(dialog.DIALOG_HEADER, SAMPLES["DIALOG_HEADER"][0])[:-1]),
        ("ACK_PAYLOAD", ()),
        ("FRAGMENT_PAYLOAD", (b"h",)),
        # out-of-range integers
        ("CLOSE_BODY", (65536, "bye")),
        ("CLOSE_BODY", (-1, "bye")),
        ("PRINCIPAL_QUERY_BODY", (2**32, UUID_A, "db")),
        ("FRAME_HEADER", (256, 0, 0, 0, 0, 0)),
        ("FRAME_HEADER", (1, 1, 1, 1, 2**64, 0)),
        ("HELLO_BODY", ([65536], "a", bytes(32), bytes(32), 1, 1, b"")),
        # wrong types
        ("CLOSE_BODY", ("1", "bye")),
        ("CLOSE_BODY", (1.5, "bye")),
        ("CLOSE_BODY", (None, "bye")),
        ("CLOSE_BODY", (1, b"bye")),
        ("CLOSE_BODY", (1, 7)),
        ("CLOSE_BODY", (1, None)),
        ("PRINCIPAL_QUERY_BODY", (7, None, "db")),
        ("PRINCIPAL_QUERY_BODY", (7, "not bytes", "db")),
        ("PROOF_BODY", ("text",)),
        ("PROOF_BODY", (None,)),
        ("HELLO_BODY", (1, "a", bytes(32), bytes(32), 1, 1, b"")),
        ("HELLO_BODY", (["1"], "a", bytes(32), bytes(32), 1, 1, b"")),
        ("ACK_PAYLOAD", (None,)),
        ("ACK_PAYLOAD", (["text"],)),
        ("FRAGMENT_PAYLOAD", (b"h", "text body")),
        # values that do not fit their length or count prefix
        ("CLOSE_BODY", (1, "x" * 65536)),
        ("PROOF_BODY", (b"x" * 65536,)),
        ("HELLO_BODY", ([1] * 256, "a", bytes(32), bytes(32), 1, 1, b"")),
        # strings that cannot be encoded
        ("CLOSE_BODY", (1, "\ud800")),
        # array rows of the wrong shape
        (
            "DIALOG_HEADER",
            (
                *to_row(dialog.DIALOG_HEADER, SAMPLES["DIALOG_HEADER"][0])[:12],
                [(1, 2, 3)],
                [],
                "a",
                "b",
                "c",
                "d",
            ),
        ),
    ],
)
def test_fastcodec_build_bad_values_is_local_error(name: str, row: tuple[Any, ...]) -> None:
    with pytest.raises(LocalProtocolError):
        CODECS[name].build(row)


@pytest.mark.parametrize("wrong", [UUID_A[:15], UUID_A + b"\x01", b""])
def test_fastcodec_build_wrong_length_fixed_bytes_is_local_error(wrong: bytes) -> None:
    with pytest.raises(c.StreamError):
        frames.PRINCIPAL_QUERY_BODY.build(dict(query_id=7, broker_instance=wrong, service="db"))
    with pytest.raises(LocalProtocolError):
        CODECS["PRINCIPAL_QUERY_BODY"].build((7, wrong, "db"))


@pytest.mark.parametrize(
    ("name", "row"),
    [("PROOF_BODY", (5,)), ("HELLO_REPLY_BODY", (b"core", 4)), ("FRAGMENT_PAYLOAD", (b"h", 3))],
)
def test_fastcodec_build_int_for_bytes_is_local_error(name: str, row: tuple[Any, ...]) -> None:
    with pytest.raises(LocalProtocolError):
        CODECS[name].build(row)


# ------------------------------------------------------- run-time body codecs


@pytest.mark.parametrize(
    "name", sorted(set(TERMINATED) & {f"{t.name}_BODY" for t in frames.FrameType})
)
def test_frames_decode_body_truncated_is_remote(name: str) -> None:
    """The run-time body decoder refuses every truncation and trailing byte (R-PROTO-1)."""
    frame_type = frames.FrameType[name.removesuffix("_BODY")]
    body = STRUCTS[name].build(SAMPLES[name][0])
    for n in range(len(body)):
        with pytest.raises(RemoteProtocolError):
            frames.decode_body(frame_type, body[:n])
    with pytest.raises(RemoteProtocolError):
        frames.decode_body(frame_type, body + b"\x00")


@pytest.mark.parametrize("value", [{"code": 1}, {"code": 70000, "reason": "r"}, {"reason": "r"}])
def test_frames_encode_body_bad_values_are_local(value: dict[str, Any]) -> None:
    """The run-time body encoder (FastCodec.build_mapping) reports our bad values locally."""
    with pytest.raises(LocalProtocolError):
        frames.encode_body(frames.FrameType.CLOSE, value)
