"""Tests of protocol/dialog.py's validation rules: what a header may hold, on a
fragment and on a dedicated acknowledgement, and the bounds of each field (SPEC §4;
R-DLG-5 acknowledgement bounds, R-ROUTE-7 names), refused on both sides of the wire.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from protocol.dialog import (
    FRAGMENT_PAYLOAD,
    MAX_ACK_RANGES,
    MAX_ACKS_PER_FRAME,
    MAX_FRAGMENT_ACKS,
    NIL_UUID,
    Acknowledgement,
    AckRange,
    FragmentAck,
    decode_acks,
    decode_fragment,
    decode_header,
    encode_acks,
    encode_fragment,
    encode_header,
    validate_header,
)
from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.frames import MAX_NAME_BYTES
from tests.protocol.dialog_samples import (
    SEQ,
    ack_header,
    raw_acks,
    raw_fragment,
    user_message,
)

LONG = "x" * (MAX_NAME_BYTES + 1)
LONG_UTF8 = "é" * (MAX_NAME_BYTES // 2 + 1)  # 1026 bytes, 513 characters

# (id, changes to user_message(), body, message fragment)
FRAGMENT_RULES: list[tuple[str, dict[str, Any], bytes, str]] = [
    ("empty-from-service", dict(from_service=""), b"", "service names must not be empty"),
    ("empty-to-service", dict(to_service=""), b"", "service names must not be empty"),
    ("long-from-service", dict(from_service=LONG), b"", "from service name of 1025 bytes"),
    ("long-to-service-utf8", dict(to_service=LONG_UTF8), b"", "to service name of 1026 bytes"),
    ("long-contract", dict(contract=LONG), b"", "contract name of 1025 bytes"),
    ("long-message-type", dict(message_type=LONG), b"", "message type name of 1025 bytes"),
    ("unknown-flag-0x40", dict(flags=SEQ | 0x40), b"", "unknown message flags 0x42"),
    ("unknown-flag-0x8000", dict(flags=0x8000), b"", "unknown message flags 0x8000"),
    ("nil-from-broker", dict(from_broker_instance=NIL_UUID), b"", "must be named"),
    ("sequenced-seq-0", dict(sequence_number=0), b"", "needs a sequence number"),
    ("end-dialog-seq-0", dict(flags=SEQ | 4, sequence_number=0), b"", "needs a sequence"),
    (
        "index-equals-count",
        dict(fragment_index=3, fragment_count=3, message_length=30),
        b"",
        "fragment index 3 outside 0..2",
    ),
    ("count-zero", dict(fragment_index=0, fragment_count=0), b"", "outside 0..-1"),
    (
        "offset-plus-len-over-length",
        dict(fragment_offset=5, message_length=10),
        b"123456",
        "fragment at offset 5 with 6 bytes overruns a message of 10 bytes",
    ),
    (
        "body-over-length",
        dict(message_length=2),
        b"abc",
        "overruns a message of 2 bytes",
    ),
    (
        "more-fragments-than-bytes",
        dict(fragment_count=5, message_length=4),
        b"a",
        "5 fragments for a message of 4 bytes",
    ),
]

# Rules about the acknowledgement part: they apply to fragments and dedicated acks.
ACK_RULES: list[tuple[str, Acknowledgement, str]] = [
    (
        "too-many-ranges",
        Acknowledgement(
            0, tuple(AckRange(2 * i + 1, 2 * i + 1) for i in range(MAX_ACK_RANGES + 1))
        ),
        "too many acknowledgement ranges",
    ),
    (
        "too-many-fragment-acks",
        Acknowledgement(0, (), tuple(FragmentAck(i + 1, 0, 0) for i in range(33))),
        "too many acknowledgement ranges",
    ),
    ("range-at-through", Acknowledgement(5, (AckRange(5, 7),)), "range 5..7 is out of order"),
    ("range-below-through", Acknowledgement(5, (AckRange(2, 3),)), "out of order"),
    ("range-reversed", Acknowledgement(0, (AckRange(9, 8),)), "range 9..8 is out of order"),
    (
        "ranges-descending",
        Acknowledgement(0, (AckRange(10, 11), AckRange(3, 4))),
        "range 3..4 is out of order",
    ),
    (
        "ranges-overlapping",
        Acknowledgement(0, (AckRange(3, 6), AckRange(6, 8))),
        "range 6..8 is out of order",
    ),
    ("fragment-first-after-last", Acknowledgement(0, (), (FragmentAck(3, 5, 4),)), "inconsist"),
    ("fragment-of-acked-message", Acknowledgement(4, (), (FragmentAck(4, 0, 0),)), "inconsist"),
]


@pytest.mark.parametrize(
    ("changes", "body", "message"),
    [pytest.param(ch, b, m, id=i) for i, ch, b, m in FRAGMENT_RULES],
)
def test_validate_header_fragment_rules(changes: dict[str, Any], body: bytes, message: str) -> None:
    """Each rule is reported with a clear message; encode -> Local, decode -> Remote."""
    good = user_message(body)
    assert validate_header(good, len(body)) is None
    bad = good._replace(**changes)
    problem = validate_header(bad, len(body))
    assert problem is not None and message in problem
    with pytest.raises(LocalProtocolError, match="invalid dialog message") as local:
        encode_fragment(bad, body)
    assert message in str(local.value)
    with pytest.raises(RemoteProtocolError, match="invalid dialog message") as remote:
        decode_fragment(raw_fragment(bad, body))
    assert message in str(remote.value)


@pytest.mark.parametrize(("ack", "message"), [pytest.param(a, m, id=i) for i, a, m in ACK_RULES])
def test_validate_header_ack_rules(ack: Acknowledgement, message: str) -> None:
    """R-DLG-5: ack lists are bounded and ordered, on fragments and in ACK frames."""
    body = b"<order id='1'/>"
    bad_fragment = user_message(body, ack=ack)
    problem = validate_header(bad_fragment, len(body))
    assert problem is not None and message in problem
    with pytest.raises(LocalProtocolError, match=re.escape(message)):
        encode_fragment(bad_fragment, body)
    with pytest.raises(RemoteProtocolError, match=re.escape(message)):
        decode_fragment(raw_fragment(bad_fragment, body))

    bad_ack = ack_header(ack)
    assert message in (validate_header(bad_ack, None) or "")
    with pytest.raises(LocalProtocolError, match="invalid acknowledgement"):
        encode_acks([ack_header(Acknowledgement(1)), bad_ack])
    with pytest.raises(RemoteProtocolError, match="invalid acknowledgement"):
        decode_acks(raw_acks([ack_header(Acknowledgement(1)), bad_ack]))


@pytest.mark.parametrize(
    "changes",
    [
        dict(from_service=""),
        dict(to_service=LONG),
        dict(flags=0x40),
        dict(from_broker_instance=NIL_UUID),
    ],
)
def test_header_rules_also_apply_to_dedicated_acks(changes: dict[str, Any]) -> None:
    bad = ack_header(Acknowledgement(2))._replace(**changes)
    assert validate_header(bad, None) is not None
    with pytest.raises(LocalProtocolError):
        encode_acks([bad])
    with pytest.raises(RemoteProtocolError):
        decode_acks(raw_acks([bad]))


def test_fragment_rules_do_not_apply_to_dedicated_acks() -> None:
    """A dedicated ack has no content: sequence/fragment fields are not checked."""
    h = ack_header(Acknowledgement(3), flags=SEQ, sequence_number=0, fragment_count=0)
    assert validate_header(h, None) is None
    assert decode_acks(encode_acks([h])) == [h]


def test_validate_header_accepts_the_bounds() -> None:
    """Limits are inclusive: 1024-byte names, 32 ranges, 32 fragment acks."""
    ack = Acknowledgement(
        0,
        tuple(AckRange(2 * i + 1, 2 * i + 1) for i in range(MAX_ACK_RANGES)),
        tuple(FragmentAck(1000 + i, 0, 0) for i in range(MAX_FRAGMENT_ACKS)),
    )
    body = b"abc"
    h = user_message(
        body,
        from_service="é" * (MAX_NAME_BYTES // 2),
        to_service="y" * MAX_NAME_BYTES,
        flags=0x0F,
        fragment_index=2,
        fragment_count=3,
        fragment_offset=7,
        message_length=10,
        ack=ack,
    )
    assert validate_header(h, len(body)) is None
    assert decode_fragment(encode_fragment(h, body)) == (h, body)


def test_ack_frame_header_count_bounds() -> None:
    """R-DLG-5: an ACK frame carries 1..MAX_ACKS_PER_FRAME headers."""
    one = ack_header(Acknowledgement(1))
    with pytest.raises(LocalProtocolError, match=r"1\.\.1024"):
        encode_acks([])
    with pytest.raises(LocalProtocolError, match=r"1\.\.1024"):
        encode_acks([one] * (MAX_ACKS_PER_FRAME + 1))
    full = encode_acks([one] * MAX_ACKS_PER_FRAME)
    assert len(decode_acks(full)) == MAX_ACKS_PER_FRAME
    with pytest.raises(RemoteProtocolError, match="0 headers"):
        decode_acks(raw_acks([]))
    with pytest.raises(RemoteProtocolError, match="1025 headers"):
        decode_acks(raw_acks([one] * (MAX_ACKS_PER_FRAME + 1)))


def test_decode_refuses_bad_utf8_in_a_name() -> None:
    h = user_message(to_service="@")
    raw = bytearray(encode_header(h))
    raw[raw.index(b"\x00\x01@") + 2] = 0xFF
    with pytest.raises(RemoteProtocolError):
        decode_header(bytes(raw))
    with pytest.raises(RemoteProtocolError):
        decode_fragment(FRAGMENT_PAYLOAD.build(dict(header=bytes(raw), body=b"")))


def test_encode_refuses_values_that_do_not_fit() -> None:
    """Values outside their wire field are our bug: LocalProtocolError."""
    for changes in (
        dict(sequence_number=2**64),
        dict(hop_count=256),
        dict(lifetime=-1),
        dict(fragment_offset=-1, message_length=5),
        dict(conversation_id=uuid.UUID(int=0), flags=0x1_0000),
    ):
        with pytest.raises(LocalProtocolError):
            encode_fragment(user_message(b"", **changes), b"")


@pytest.mark.parametrize("field", ["from_service", "to_service", "contract", "message_type"])
def test_encode_refuses_unencodable_names(field: str) -> None:
    with pytest.raises(LocalProtocolError):
        encode_fragment(user_message(b"", **{field: "bad\ud800"}), b"")
    with pytest.raises(LocalProtocolError):
        encode_acks([ack_header(Acknowledgement(1), **{field: "bad\ud800"})])
