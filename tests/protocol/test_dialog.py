"""Tests of protocol/dialog.py: the dialog-protocol header codec (SPEC §4).

Covers R-DLG-1 (conversation id + sequence number on every message), R-DLG-2
(sequenced vs unsequenced messages), R-DLG-5 (acknowledgements: through, ranges,
fragments; dedicated ACK frames carrying several headers), R-DLG-7 (fragment
position in the header), R-DLG-10 (EndDialog / Error messages) and R-ROUTE-7
(service and broker names travel in the header so forwarders can route).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import dialog
from protocol.codec import FastCodec
from protocol.dialog import (
    DIALOG_HEADER,
    END_DIALOG,
    ERROR,
    FRAGMENT_PAYLOAD,
    MAX_SEQUENCE_NUMBER,
    NIL_UUID,
    NO_ACK,
    Acknowledgement,
    AckRange,
    DialogHeader,
    FragmentAck,
    MessageFlags,
    decode_acks,
    decode_fragment,
    decode_header,
    encode_acks,
    encode_fragment,
    encode_header,
    to_construct_value,
    validate_header,
)
from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.frames import MAX_NAME_BYTES
from tests.protocol.dialog_samples import (
    BROKER_A,
    BROKER_B,
    CONV,
    INIT,
    SEQ,
    U32,
    U64,
    ack_header,
    raw_acks,
    raw_fragment,
    user_message,
)

GOLDEN = Path(__file__).parent / "golden" / "dialog_fragment_v1.hex"


# ---------------------------------------------------------------------- round trips


def test_round_trip_plain_sequenced_user_message() -> None:
    """R-DLG-1/R-DLG-2: a user message carries conversation id and sequence number."""
    body = b"<order id='1'/>"
    h = user_message(body, sequence_number=42, lifetime=600, hop_count=3)
    header, got = decode_fragment(encode_fragment(h, body))
    assert (header, got) == (h, body)
    assert header.sequenced and header.initiator
    assert header.conversation_id == CONV and header.sequence_number == 42
    assert header.to_broker_instance is None


def test_round_trip_end_dialog() -> None:
    """R-DLG-2/R-DLG-10: EndDialog is sequenced, has the EndDialog type and no body."""
    h = user_message(
        b"",
        flags=MessageFlags.END_DIALOG | SEQ,
        message_type=END_DIALOG,
        sequence_number=9,
        to_broker_instance=BROKER_B,
    )
    header, body = decode_fragment(encode_fragment(h, b""))
    assert (header, body) == (h, b"")
    assert header.flags == MessageFlags.END_DIALOG | SEQ
    assert header.message_type == END_DIALOG
    assert header.sequenced and not header.initiator


def test_round_trip_unsequenced_broker_error() -> None:
    """R-DLG-2: broker-generated errors are unsequenced (sequence number 0)."""
    body = b"<Error><Code>-8489</Code><Description>no route</Description></Error>"
    h = user_message(
        body,
        flags=MessageFlags.ERROR,
        message_type=ERROR,
        sequence_number=0,
        from_service="//beta/Target",
        to_service="//alpha/Initiator",
        from_broker_instance=BROKER_B,
        to_broker_instance=BROKER_A,
    )
    header, got = decode_fragment(encode_fragment(h, body))
    assert (header, got) == (h, body)
    assert not header.sequenced and header.sequence_number == 0


@pytest.mark.parametrize("to_broker", [None, BROKER_B], ids=["any-broker", "named-broker"])
def test_round_trip_to_broker_instance(to_broker: uuid.UUID | None) -> None:
    """R-ROUTE-3/R-ROUTE-7: the target broker instance is optional (nil UUID on the wire)."""
    h = user_message(to_broker_instance=to_broker)
    header, _ = decode_fragment(encode_fragment(h, b"<order id='1'/>"))
    assert header.to_broker_instance == to_broker


def test_nil_to_broker_instance_decodes_as_none() -> None:
    """The nil UUID means "no broker instance named" (module docstring)."""
    h = user_message(to_broker_instance=NIL_UUID)
    header, _ = decode_fragment(encode_fragment(h, b"<order id='1'/>"))
    assert header.to_broker_instance is None
    assert encode_header(h) == encode_header(h._replace(to_broker_instance=None))


@pytest.mark.parametrize(
    ("from_service", "to_service", "contract", "message_type"),
    [
        ("//δοκιμή/Αποστολέας", "//ターゲット/サービス", "Контракт", "Сообщение"),
        ("//émoji/🚀", "ß", "DEFAULT", "☃"),
        ("é" * 512, "x" * MAX_NAME_BYTES, "k" * MAX_NAME_BYTES, "€" * 341),  # at the limit
    ],
)
def test_round_trip_non_ascii_names(
    from_service: str, to_service: str, contract: str, message_type: str
) -> None:
    """R-OBJ-4: service names are compared byte-for-byte; any UTF-8 name survives."""
    h = user_message(
        from_service=from_service,
        to_service=to_service,
        contract=contract,
        message_type=message_type,
    )
    header, _ = decode_fragment(encode_fragment(h, b"<order id='1'/>"))
    assert header == h
    assert header.from_service.encode() == from_service.encode()
    assert [decode_acks(encode_acks([h]))[0]] == [h]


def test_round_trip_fragment_in_the_middle_of_a_large_message() -> None:
    """R-DLG-7: fragment index/count/offset and message length travel in the header."""
    body = bytes(range(256)) * 4
    h = user_message(
        body,
        fragment_index=3,
        fragment_count=10,
        fragment_offset=3 * 1024,
        message_length=10 * 1024 - 17,
    )
    assert decode_fragment(encode_fragment(h, body)) == (h, body)


def test_round_trip_piggybacked_ack_on_a_message() -> None:
    """R-DLG-5: an acknowledgement rides on a message going back on the conversation."""
    ack = Acknowledgement(
        through=10, ranges=(AckRange(12, 15), AckRange(20, 20)), fragments=(FragmentAck(11, 0, 3),)
    )
    h = user_message(flags=SEQ, sequence_number=3, ack=ack)
    header, _ = decode_fragment(encode_fragment(h, b"<order id='1'/>"))
    assert header.ack == ack
    assert isinstance(header.ack.ranges[0], AckRange)
    assert isinstance(header.ack.fragments[0], FragmentAck)


def test_round_trip_dedicated_acks_several_conversations() -> None:
    """R-DLG-5: one ACK frame carries dedicated acknowledgements of several endpoints."""
    headers = [
        ack_header(Acknowledgement(through=7)),
        ack_header(
            Acknowledgement(
                3, (AckRange(5, 6), AckRange(9, MAX_SEQUENCE_NUMBER)), (FragmentAck(4, 2, U32),)
            ),
            conversation_id=uuid.UUID(int=1),
            flags=INIT,
        ),
        ack_header(
            Acknowledgement(0, (), (FragmentAck(1, 0, 0),)),
            conversation_id=uuid.UUID(int=2),
            to_broker_instance=None,
            from_service="//ü/Target",
        ),
        ack_header(NO_ACK, conversation_id=uuid.UUID(int=3)),
    ]
    assert decode_acks(encode_acks(headers)) == headers
    assert decode_acks(encode_acks(headers))[3].ack is NO_ACK


def test_to_construct_value_builds_same_bytes_as_fast_path() -> None:
    """The construct declaration and the struct hot path agree on a dialog header."""
    h = user_message(ack=Acknowledgement(0, (AckRange(2, 3),), (FragmentAck(1, 0, 1),)))
    assert DIALOG_HEADER.build(to_construct_value(h)) == encode_header(h)
    assert decode_header(DIALOG_HEADER.build(to_construct_value(h))) == h


# --------------------------------------------------------------- hypothesis round trip

names = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=40)
brokers = st.uuids(allow_nil=False)


@st.composite
def acknowledgements(draw: st.DrawFn) -> Acknowledgement:
    through = draw(st.integers(0, 2**62))
    ranges = []
    low = through
    for _ in range(draw(st.integers(0, 4))):
        first = low + draw(st.integers(1, 1000))
        last = first + draw(st.integers(0, 1000))
        ranges.append(AckRange(first, last))
        low = last
    fragments = []
    for _ in range(draw(st.integers(0, 4))):
        first = draw(st.integers(0, U32))
        fragments.append(
            FragmentAck(
                draw(st.integers(through + 1, MAX_SEQUENCE_NUMBER)),
                first,
                draw(st.integers(first, U32)),
            )
        )
    return Acknowledgement(through, tuple(ranges), tuple(fragments))


@st.composite
def headers_and_bodies(draw: st.DrawFn, ack_only: bool = False) -> tuple[DialogHeader, bytes]:
    body = draw(st.binary(max_size=64))
    if draw(st.booleans()):
        # A single-fragment message: the body is the whole message.
        offset, length, count = 0, len(body), 1
    else:
        offset = draw(st.integers(0, 2**40))
        length = draw(st.integers(max(2, offset + len(body)), U64))
        count = draw(st.integers(2, min(U32, length)))
    flags = draw(st.integers(0, 15))
    low_seq = 1 if flags & SEQ else 0
    h = DialogHeader(
        conversation_id=draw(st.uuids()),
        from_service=draw(names),
        to_service=draw(names),
        from_broker_instance=draw(brokers),
        to_broker_instance=draw(st.none() | brokers),
        contract=draw(names),
        message_type=draw(names),
        flags=flags,
        sequence_number=draw(st.integers(low_seq, MAX_SEQUENCE_NUMBER)),
        fragment_index=draw(st.integers(0, count - 1)),
        fragment_count=count,
        fragment_offset=offset,
        message_length=length,
        lifetime=draw(st.integers(0, U32)),
        hop_count=draw(st.integers(0, 255)),
        ack=draw(acknowledgements()),
    )
    return h, body


@settings(max_examples=200, deadline=None)
@given(case=headers_and_bodies())
def test_round_trip_generated_fragments(case: tuple[DialogHeader, bytes]) -> None:
    """R-DLG-1/R-DLG-5/R-DLG-7: every valid header and body survives encode/decode."""
    h, body = case
    assert validate_header(h, len(body)) is None
    payload = encode_fragment(h, body)
    assert decode_fragment(payload) == (h, body)
    # The hot path's bytes are exactly what the construct declaration builds.
    assert payload == raw_fragment(h, body)


STRICT_HEADER = FastCodec(DIALOG_HEADER)
"""The generic strict parser of the construct declaration (tests/protocol/test_codec.py
checks it against construct): the reference for the hand-written hot path."""
STRICT_SECURED_HEADER = FastCodec(dialog.SECURED_DIALOG_HEADER)
"""The same for a header whose flags have SECURED (the layout with the trailer)."""


def _strict_parse(data: bytes) -> None:
    """The declaration that applies to ``data``: its flags (bytes 16-17) choose the
    layout, as they do for the hot path; a damaged byte may set or clear SECURED."""
    secured = len(data) >= 18 and int.from_bytes(data[16:18], "big") & dialog.FLAG_SECURED
    (STRICT_SECURED_HEADER if secured else STRICT_HEADER).parse(data)


@settings(max_examples=300, deadline=None)
@given(
    case=headers_and_bodies(),
    cut=st.integers(0, 400),
    flip=st.integers(0, 400),
    value=st.integers(0, 255),
)
def test_the_hot_path_accepts_exactly_what_the_declaration_accepts(
    case: tuple[DialogHeader, bytes], cut: int, flip: int, value: int
) -> None:
    """Damaged headers (truncated, a byte replaced, bytes added): decode_header raises
    RemoteProtocolError exactly when the strict parser of the declaration does."""
    encoded = bytearray(DIALOG_HEADER.build(to_construct_value(case[0])))
    if flip < len(encoded):
        encoded[flip] = value
    for damaged in (bytes(encoded[:cut]), bytes(encoded), bytes(encoded) + b"\0"):
        try:
            _strict_parse(damaged)
        except RemoteProtocolError:
            with pytest.raises(RemoteProtocolError):
                decode_header(damaged)
        else:
            decode_header(damaged)


@settings(max_examples=200, deadline=None)
@given(case=headers_and_bodies(), hop_count=st.integers(0, 255))
def test_a_relayed_fragment_is_the_fragment_encoded_with_its_new_hop_count(
    case: tuple[DialogHeader, bytes], hop_count: int
) -> None:
    """R-ROUTE-7: a forwarder relays the bytes it received with only the hop count
    changed; they are what encoding the header with that hop count gives."""
    header, body = case
    payload = encode_fragment(header, body)
    relayed = dialog.relay_fragment(payload, hop_count)
    assert relayed == encode_fragment(header._replace(hop_count=hop_count), body)
    assert decode_fragment(relayed) == (header._replace(hop_count=hop_count), body)


def test_a_relayed_hop_count_must_fit_in_its_byte() -> None:
    payload = encode_fragment(user_message(), b"<order id='1'/>")
    for hop_count in (-1, 256):
        with pytest.raises(LocalProtocolError, match="does not fit"):
            dialog.relay_fragment(payload, hop_count)
    with pytest.raises(LocalProtocolError, match="truncated"):
        dialog.relay_fragment(payload[:40], 1)


@settings(max_examples=100, deadline=None)
@given(cases=st.lists(headers_and_bodies(), min_size=1, max_size=5))
def test_round_trip_generated_acks(cases: list[tuple[DialogHeader, bytes]]) -> None:
    """R-DLG-5: dedicated acknowledgements of several conversations round-trip."""
    headers = [h for h, _ in cases]
    payload = encode_acks(headers)
    assert decode_acks(payload) == headers
    assert payload == raw_acks(headers)


# ------------------------------------------------------ whole, trailing and truncated


def test_decode_header_refuses_trailing_bytes() -> None:
    raw = encode_header(user_message())
    assert decode_header(raw) == user_message()
    with pytest.raises(RemoteProtocolError):
        decode_header(raw + b"\x00")


def test_decode_fragment_refuses_trailing_bytes_inside_the_header() -> None:
    h = user_message()
    header = encode_header(h) + b"\x00"
    payload = FRAGMENT_PAYLOAD.build(dict(header=header, body=b"<order id='1'/>"))
    with pytest.raises(RemoteProtocolError):
        decode_fragment(payload)


def test_decode_fragment_refuses_body_longer_than_the_message() -> None:
    """A body byte beyond message_length overruns the message (R-DLG-7)."""
    body = b"<order id='1'/>"
    payload = encode_fragment(user_message(body), body)
    with pytest.raises(RemoteProtocolError, match="overruns"):
        decode_fragment(payload + b"!")


def test_decode_acks_refuses_trailing_bytes() -> None:
    payload = encode_acks([ack_header(Acknowledgement(through=3))])
    for extra in (b"\x00", b"\x00\x00", b"\x00\x01x"):
        with pytest.raises(RemoteProtocolError):
            decode_acks(payload + extra)


def test_decode_fragment_truncated_inside_the_header_at_every_length() -> None:
    """Every cut before the end of the (length-prefixed) header is refused."""
    body = b"<order id='1'/>"
    h = user_message(body, ack=Acknowledgement(1, (AckRange(3, 4),), (FragmentAck(2, 0, 1),)))
    payload = encode_fragment(h, body)
    header_end = 2 + len(encode_header(h))
    for n in range(header_end):
        with pytest.raises(RemoteProtocolError):
            decode_fragment(payload[:n])


def test_decode_fragment_truncated_inside_single_fragment_body() -> None:
    """R-DLG-7: fragment_count == 1 means the body IS the message; a shorter body is
    a malformed peer message and should be RemoteProtocolError at decode time."""
    body = b"<order id='1'/>"
    payload = encode_fragment(user_message(body), body)
    header_end = len(payload) - len(body)
    for n in range(header_end, len(payload)):
        with pytest.raises(RemoteProtocolError):
            decode_fragment(payload[:n])


def test_decode_acks_truncated_at_every_length() -> None:
    headers = [
        ack_header(Acknowledgement(through=3)),
        ack_header(Acknowledgement(0, (AckRange(2, 2),)), conversation_id=uuid.UUID(int=9)),
    ]
    payload = encode_acks(headers)
    for n in range(len(payload)):
        with pytest.raises(RemoteProtocolError):
            decode_acks(payload[:n])


# ---------------------------------------------------------------- Acknowledgement.covers


ACK = Acknowledgement(
    through=5,
    ranges=(AckRange(8, 9), AckRange(12, 12)),
    fragments=(FragmentAck(6, 0, 2), FragmentAck(10, 4, 4)),
)


@pytest.mark.parametrize(
    ("sequence_number", "fragment_index", "expected"),
    [
        (1, None, True),
        (5, None, True),  # through is inclusive
        (5, 99, True),  # a message acknowledged whole covers every fragment
        (6, None, False),  # only some fragments of 6 are in
        (6, 0, True),
        (6, 2, True),
        (6, 3, False),
        (7, None, False),
        (7, 0, False),  # fragment acks are per message
        (8, None, True),
        (9, None, True),  # ranges are inclusive
        (9, 1000, True),
        (10, None, False),
        (10, 4, True),
        (10, 3, False),
        (10, 5, False),
        (11, None, False),
        (12, None, True),
        (13, None, False),
        (2**64 - 1, None, False),
    ],
)
def test_acknowledgement_covers(
    sequence_number: int, fragment_index: int | None, expected: bool
) -> None:
    """R-DLG-5/R-DLG-7: the sender deletes exactly what the acknowledgement covers."""
    assert ACK.covers(sequence_number, fragment_index) is expected


def test_empty_acknowledgement_covers_no_message() -> None:
    for seq in (1, 2, 1000):
        assert not NO_ACK.covers(seq)
        assert not NO_ACK.covers(seq, 0)


def test_covers_survives_the_wire() -> None:
    h = ack_header(ACK)
    (decoded,) = decode_acks(encode_acks([h]))
    for seq in range(1, 15):
        for index in (None, 0, 2, 3, 4):
            assert decoded.ack.covers(seq, index) == ACK.covers(seq, index)


# ------------------------------------------------------------------------ golden vector


def golden_header() -> tuple[DialogHeader, bytes]:
    h = DialogHeader(
        conversation_id=CONV,
        from_service="//alpha/Initiator",
        to_service="//beta/Target",
        from_broker_instance=BROKER_A,
        to_broker_instance=BROKER_B,
        contract="//brokerd/Contract",
        message_type="//brokerd/Request",
        flags=INIT | SEQ,
        sequence_number=7,
        fragment_index=1,
        fragment_count=3,
        fragment_offset=16,
        message_length=40,
        lifetime=3600,
        hop_count=2,
        ack=Acknowledgement(5, (AckRange(7, 8),), (FragmentAck(10, 0, 2),)),
    )
    return h, b"0123456789abcdef"


def test_golden_fragment_vector_v1() -> None:
    """The dialog wire format is pinned by tests/protocol/golden/dialog_fragment_v1.hex.

    Layout (all integers big-endian), in DIALOG_HEADER declaration order:
      00ca                              u16 header length = 202
      00112233445566778899aabbccddeeff  conversation_id
      0003                              flags u16 = INITIATOR | SEQUENCED
      0000000000000007                  sequence_number u64 = 7
      00000001 00000003                 fragment_index, fragment_count u32 = 1, 3
      0000000000000010 0000000000000028 fragment_offset, message_length u64 = 16, 40
      00000e10 02                       lifetime u32 = 3600, hop_count u8 = 2
      1111...5555 6666...aaaa           from_ / to_broker_instance, 16 bytes each
      0000000000000005                  ack_through u64 = 5
      01 <7><8>                         1 ack range (u64 first, u64 last)
      01 <10><0><2>                     1 fragment ack (u64 seq, u32 first, u32 last)
      0011 "//alpha/Initiator" 000d "//beta/Target" 0012 ... 0011 ...  u16-prefixed names
      then the 16 body bytes "0123456789abcdef" (no length: rest of the payload).
    A change here is a wire-format change: bump the protocol version instead.
    """
    expected = bytes.fromhex(GOLDEN.read_text().strip())
    h, body = golden_header()
    assert encode_fragment(h, body) == expected
    assert decode_fragment(expected) == (h, body)
    assert expected[:2] == b"\x00\xca"
    assert expected[2:18] == CONV.bytes
    assert expected[18:20] == b"\x00\x03"
    assert expected[-16:] == body


@pytest.mark.parametrize(
    "header",
    [
        user_message(sequence_number=MAX_SEQUENCE_NUMBER + 1),
        user_message(sequence_number=2**64 - 1),
        user_message(ack=Acknowledgement(MAX_SEQUENCE_NUMBER + 1)),
        user_message(ack=Acknowledgement(5, (AckRange(7, MAX_SEQUENCE_NUMBER + 1),))),
        user_message(ack=Acknowledgement(5, (), (FragmentAck(MAX_SEQUENCE_NUMBER + 1, 0, 1),))),
    ],
    ids=["seq", "seq-u64-max", "ack-through", "ack-range", "fragment-ack"],
)
def test_sequence_numbers_beyond_signed_64_bits_are_refused_at_the_wire(
    header: DialogHeader,
) -> None:
    """Storage keeps sequence numbers as SQLite INTEGERs: a peer's larger one must never
    reach it (it used to fail the database's writes for half a minute)."""
    with pytest.raises(RemoteProtocolError, match="sequence number above"):
        decode_fragment(raw_fragment(header, b"<order id='1'/>"))
    with pytest.raises(LocalProtocolError, match="sequence number above"):
        encode_fragment(header, b"<order id='1'/>")
