"""Dialog-protocol message header codec (SPEC §4, R-DLG-1, R-DLG-2, R-DLG-5, R-DLG-7).

The dialog layer rides in the bodies of FRAGMENT and ACK frames:

* FRAGMENT payload: ``u16 header length | dialog header | fragment bytes``
* ACK payload: ``u16 count | count x (u16 length | dialog header)`` with no
  message content: dedicated acknowledgements for several conversations in one frame.

The dialog header names the conversation and both services and broker instances
(so forwarders can route it, R-ROUTE-7), the contract and message type, the
sequence number and fragment position, the acknowledgement of the other
direction (piggybacked, R-DLG-5), the dialog lifetime and the hop count.

Acknowledgement fields: ``through`` = highest sequence number such that every
message 1..through has been received and stored; ``ranges`` = complete messages
received beyond it; ``fragments`` = fragments received of messages not yet complete
(so a lost fragment is resent alone, R-DLG-7). All lists are bounded.

Sequence numbers start at 1; 0 means "none" (unsequenced messages, empty acks).
The nil UUID stands for "no broker instance named".

Dialog security (SPEC R-DLG-14): a header with the SECURED flag carries a
*security trailer* between the acknowledgement lists and the names: a 12-byte
nonce, a 16-byte AES-GCM tag and ``u16 length | key exchange`` (empty except on
the initiator's messages until the target has answered). What the trailer
protects is :mod:`protocol.dialog_security`'s business; this module only carries
it. A header without the flag has no trailer, so its bytes are those of
protocol version 1 before dialog security.
"""

from __future__ import annotations

import enum
import struct
import uuid
from functools import lru_cache
from typing import Any, NamedTuple

import construct as c

from protocol.buffers import Buffer
from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.frames import MAX_NAME_BYTES, SizedPayload

END_DIALOG = "http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog"
ERROR = "http://schemas.microsoft.com/SQL/ServiceBroker/Error"
DIALOG_TIMER = "http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer"
BROKER_CONFIGURATION_NOTICE = (
    "http://schemas.microsoft.com/SQL/ServiceBroker/BrokerConfigurationNotice"
)
"""The contract of dynamic routing requests (SPEC R-ROUTE-14); every database has it."""
MISSING_ROUTE = BROKER_CONFIGURATION_NOTICE + "/MissingRoute"
"""The request the broker sends to the dynamic routing service (SPEC R-ROUTE-14)."""
DEFAULT_CONTRACT = "DEFAULT"
DEFAULT_MESSAGE_TYPE = "DEFAULT"

MAX_SEQUENCE_NUMBER = 2**63 - 1
"""Sequence numbers travel as u64 but are stored as SQLite INTEGERs (signed 64-bit):
a larger one from a peer is refused at the wire, never handed to storage."""
MAX_ACK_RANGES = 32
MAX_FRAGMENT_ACKS = 32
MAX_ACKS_PER_FRAME = 1024

NIL_UUID = uuid.UUID(int=0)
_NIL_BYTES = NIL_UUID.bytes


FLAG_INITIATOR = 0x01
FLAG_SEQUENCED = 0x02
FLAG_END_DIALOG = 0x04
FLAG_ERROR = 0x08
FLAG_SECURED = 0x10
"""The message flags as plain ints, for hot paths: IntFlag arithmetic costs microseconds."""


class MessageFlags(enum.IntFlag):
    NONE = 0
    INITIATOR = 0x01
    """The sender of this message is the conversation's initiator."""
    SEQUENCED = 0x02
    """User messages, EndDialog and application errors (R-DLG-2)."""
    END_DIALOG = 0x04
    ERROR = 0x08
    """An Error message; unsequenced when the broker generated it."""
    SECURED = 0x10
    """Dialog security: the header carries a security trailer (R-DLG-14)."""


_KNOWN_FLAGS = int(
    MessageFlags.INITIATOR
    | MessageFlags.SEQUENCED
    | MessageFlags.END_DIALOG
    | MessageFlags.ERROR
    | MessageFlags.SECURED
)

NONCE_SIZE = 12
TAG_SIZE = 16
MAX_KEY_EXCHANGE_SIZE = 512
"""Bound of a security trailer's key exchange (``dialog_security.KEY_EXCHANGE`` is
185 bytes)."""

_Name = c.PascalString(c.Int16ub, "utf8")

DIALOG_HEADER = c.Struct(
    "conversation_id" / c.Bytes(16),
    "flags" / c.Int16ub,
    "sequence_number" / c.Int64ub,
    "fragment_index" / c.Int32ub,
    "fragment_count" / c.Int32ub,
    "fragment_offset" / c.Int64ub,
    "message_length" / c.Int64ub,
    "lifetime" / c.Int32ub,
    "hop_count" / c.Int8ub,
    "from_broker_instance" / c.Bytes(16),
    "to_broker_instance" / c.Bytes(16),
    "ack_through" / c.Int64ub,
    "ack_ranges" / c.PrefixedArray(c.Int8ub, c.Struct("first" / c.Int64ub, "last" / c.Int64ub)),
    "ack_fragments"
    / c.PrefixedArray(
        c.Int8ub,
        c.Struct("sequence_number" / c.Int64ub, "first" / c.Int32ub, "last" / c.Int32ub),
    ),
    "from_service" / _Name,
    "to_service" / _Name,
    "contract" / _Name,
    "message_type" / _Name,
    c.Terminated,
)
_SECURITY_TRAILER = (
    "nonce" / c.Bytes(NONCE_SIZE),
    "tag" / c.Bytes(TAG_SIZE),
    "key_exchange" / c.Prefixed(c.Int16ub, c.GreedyBytes),
)
SECURED_DIALOG_HEADER = c.Struct(
    *DIALOG_HEADER.subcons[:14],
    *_SECURITY_TRAILER,
    *DIALOG_HEADER.subcons[14:],
)
"""The layout of a header whose flags have SECURED: DIALOG_HEADER with the security
trailer between the acknowledgement lists and the names (R-DLG-14)."""
FRAGMENT_PAYLOAD = c.Struct(
    "header" / c.Prefixed(c.Int16ub, c.GreedyBytes),
    "body" / c.GreedyBytes,
)
ACK_PAYLOAD = c.Struct(
    "headers" / c.PrefixedArray(c.Int16ub, c.Prefixed(c.Int16ub, c.GreedyBytes)),
    c.Terminated,
)


class AckRange(NamedTuple):
    """Complete messages ``first..last`` (inclusive) received beyond ``through``."""

    first: int
    last: int


class FragmentAck(NamedTuple):
    """Fragments ``first..last`` (inclusive) of an incomplete message received."""

    sequence_number: int
    first: int
    last: int


class Acknowledgement(NamedTuple):
    through: int = 0
    ranges: tuple[AckRange, ...] = ()
    fragments: tuple[FragmentAck, ...] = ()

    def covers(self, sequence_number: int, fragment_index: int | None = None) -> bool:
        """Whether this acknowledgement confirms a message (or one fragment of it)."""
        if sequence_number <= self.through:
            return True
        if any(r.first <= sequence_number <= r.last for r in self.ranges):
            return True
        if fragment_index is None:
            return False
        return any(
            f.sequence_number == sequence_number and f.first <= fragment_index <= f.last
            for f in self.fragments
        )


NO_ACK = Acknowledgement()


class Security(NamedTuple):
    """The security trailer of a SECURED header (R-DLG-14)."""

    nonce: bytes
    tag: bytes
    key_exchange: bytes = b""


class DialogHeader(NamedTuple):
    """The dialog-layer header of one message fragment or dedicated acknowledgement.

    A NamedTuple: immutable, and cheap to build on the hot path.
    """

    conversation_id: uuid.UUID
    from_service: str
    to_service: str
    from_broker_instance: uuid.UUID
    to_broker_instance: uuid.UUID | None = None
    contract: str = DEFAULT_CONTRACT
    message_type: str = DEFAULT_MESSAGE_TYPE
    flags: int = MessageFlags.SEQUENCED
    """A combination of MessageFlags."""
    sequence_number: int = 0
    fragment_index: int = 0
    fragment_count: int = 1
    fragment_offset: int = 0
    message_length: int = 0
    lifetime: int = 0
    """Seconds left of the dialog's lifetime when the fragment was built, rounded up;
    0 = unlimited (R-DLG-9)."""
    hop_count: int = 0
    ack: Acknowledgement = NO_ACK
    security: Security | None = None
    """Present exactly when ``flags`` has SECURED."""

    @property
    def initiator(self) -> bool:
        return bool(self.flags & FLAG_INITIATOR)

    @property
    def sequenced(self) -> bool:
        return bool(self.flags & FLAG_SEQUENCED)


_HEADER_FIELDS = tuple(sub.name for sub in DIALOG_HEADER.subcons if sub.name)
assert _HEADER_FIELDS[13] == "ack_fragments" and _HEADER_FIELDS[14] == "from_service"

# The hot path: DIALOG_HEADER spelled out with struct (tests check that it builds and
# accepts exactly what the construct declaration does). Names and identifiers repeat
# from one message of a dialog to the next, so their encodings and UUID objects are cached.
_FIXED = struct.Struct(">16sHQIIQQIB16s16sQ")
_TRAILER = struct.Struct(">12s16sH")
_RANGE = struct.Struct(">QQ")
_FRAGMENT_ACK = struct.Struct(">QII")
_U16 = struct.Struct(">H")


@lru_cache(maxsize=65536)
def _uuid_of(raw: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=raw)


@lru_cache(maxsize=4096)
def _encoded_names(from_service: str, to_service: str, contract: str, message_type: str) -> bytes:
    parts = []
    for name in (from_service, to_service, contract, message_type):
        raw = name.encode("utf-8")
        parts.append(_U16.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


@lru_cache(maxsize=4096)
def _decoded_names(raw: bytes) -> tuple[str, str, str, str]:
    names = []
    pos = 0
    for _ in range(4):
        if pos + 2 > len(raw):
            raise RemoteProtocolError("dialog header names run past the end")
        (length,) = _U16.unpack_from(raw, pos)
        pos += 2
        if pos + length > len(raw):
            raise RemoteProtocolError("length prefix runs past the end")
        try:
            names.append(raw[pos : pos + length].decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise RemoteProtocolError(f"a name is not valid UTF-8: {exc.reason}") from None
        pos += length
    if pos != len(raw):
        raise RemoteProtocolError(f"{len(raw) - pos} trailing bytes")
    return names[0], names[1], names[2], names[3]


def _to_row(h: DialogHeader) -> tuple[Any, ...]:
    ack = h.ack
    return (
        h.conversation_id.bytes,
        int(h.flags),
        h.sequence_number,
        h.fragment_index,
        h.fragment_count,
        h.fragment_offset,
        h.message_length,
        h.lifetime,
        h.hop_count,
        h.from_broker_instance.bytes,
        (h.to_broker_instance or NIL_UUID).bytes,
        ack.through,
        ack.ranges,
        ack.fragments,
        h.from_service,
        h.to_service,
        h.contract,
        h.message_type,
    )


def _header_bytes(h: DialogHeader) -> bytes:
    ack = h.ack
    to = h.to_broker_instance
    try:
        fixed = _FIXED.pack(
            h.conversation_id.bytes,
            h.flags,
            h.sequence_number,
            h.fragment_index,
            h.fragment_count,
            h.fragment_offset,
            h.message_length,
            h.lifetime,
            h.hop_count,
            h.from_broker_instance.bytes,
            _NIL_BYTES if to is None else to.bytes,
            ack.through,
        )
        names = _encoded_names(h.from_service, h.to_service, h.contract, h.message_type)
        sec = h.security
        if not ack.ranges and not ack.fragments and sec is None:
            return fixed + b"\0\0" + names
        parts = [fixed, bytes((len(ack.ranges),))]
        parts += [_RANGE.pack(*r) for r in ack.ranges]
        parts.append(bytes((len(ack.fragments),)))
        parts += [_FRAGMENT_ACK.pack(*f) for f in ack.fragments]
        if sec is not None:
            if len(sec.nonce) != NONCE_SIZE or len(sec.tag) != TAG_SIZE:
                raise ValueError("a security trailer needs a 12-byte nonce and a 16-byte tag")
            parts.append(_TRAILER.pack(sec.nonce, sec.tag, len(sec.key_exchange)))
            parts.append(sec.key_exchange)
        parts.append(names)
        return b"".join(parts)
    except (struct.error, ValueError, TypeError, AttributeError, UnicodeEncodeError) as exc:
        raise LocalProtocolError(f"cannot encode: {exc}") from None


def _array(
    data: bytes | memoryview, pos: int, item: struct.Struct
) -> tuple[list[tuple[Any, ...]], int]:
    """A u8-counted array of fixed-size items at ``pos``; the items and the next position."""
    if pos >= len(data):
        raise RemoteProtocolError("dialog header is truncated")
    count = data[pos]
    pos += 1
    if not count:
        return [], pos
    end = pos + count * item.size
    if end > len(data):
        raise RemoteProtocolError("array runs past the end")
    return list(item.iter_unpack(data[pos:end])), end


_unpack_fixed = _FIXED.unpack_from
_FIXED_SIZE = _FIXED.size
_new_tuple = tuple.__new__


def _parse_header(data: bytes | memoryview) -> DialogHeader:
    size = len(data)
    if size < _FIXED_SIZE + 2:
        raise RemoteProtocolError("dialog header is truncated")
    (
        conversation_id,
        flags,
        sequence_number,
        fragment_index,
        fragment_count,
        fragment_offset,
        message_length,
        lifetime,
        hop_count,
        from_broker,
        to_broker,
        ack_through,
    ) = _unpack_fixed(data, 0)
    ranges: tuple[AckRange, ...] = ()
    fragments: tuple[FragmentAck, ...] = ()
    if data[_FIXED_SIZE] or data[_FIXED_SIZE + 1]:
        raw_ranges, pos = _array(data, _FIXED_SIZE, _RANGE)
        raw_fragments, pos = _array(data, pos, _FRAGMENT_ACK)
        ranges = tuple(AckRange(*r) for r in raw_ranges)
        fragments = tuple(FragmentAck(*f) for f in raw_fragments)
    else:
        pos = _FIXED_SIZE + 2  # the common case: two empty arrays
    security = None
    if flags & FLAG_SECURED:
        if pos + _TRAILER.size > size:
            raise RemoteProtocolError("security trailer is truncated")
        nonce, tag, exchange_size = _TRAILER.unpack_from(data, pos)
        pos += _TRAILER.size
        if exchange_size > MAX_KEY_EXCHANGE_SIZE:
            raise RemoteProtocolError(
                f"key exchange of {exchange_size} bytes exceeds {MAX_KEY_EXCHANGE_SIZE}"
            )
        if pos + exchange_size > size:
            raise RemoteProtocolError("length prefix runs past the end")
        security = Security(nonce, tag, bytes(data[pos : pos + exchange_size]))
        pos += exchange_size
    from_service, to_service, contract, message_type = _decoded_names(bytes(data[pos:]))
    if ack_through or ranges or fragments:
        ack = Acknowledgement(ack_through, ranges, fragments)
    else:
        ack = NO_ACK
    # tuple.__new__ with every field in order: what DialogHeader(...) builds, without
    # the generated __new__'s seventeen keyword parameters.
    header: DialogHeader = _new_tuple(
        DialogHeader,
        (
            _uuid_of(conversation_id),
            from_service,
            to_service,
            _uuid_of(from_broker),
            None if to_broker == _NIL_BYTES else _uuid_of(to_broker),
            contract,
            message_type,
            flags,
            sequence_number,
            fragment_index,
            fragment_count,
            fragment_offset,
            message_length,
            lifetime,
            hop_count,
            ack,
            security,
        ),
    )
    return header


def to_construct_value(h: DialogHeader) -> dict[str, Any]:
    """The header as a construct container value (for tests and tooling)."""
    row = _to_row(h)
    value = dict(zip(_HEADER_FIELDS, row, strict=True))
    value["ack_ranges"] = [{"first": a, "last": b} for a, b in h.ack.ranges]
    value["ack_fragments"] = [
        {"sequence_number": s, "first": a, "last": b} for s, a, b in h.ack.fragments
    ]
    sec = h.security
    if sec is not None:
        value.update(nonce=sec.nonce, tag=sec.tag, key_exchange=sec.key_exchange)
    return value


def declaration_of(h: DialogHeader) -> c.Struct:
    """The construct declaration ``h`` is laid out by."""
    return SECURED_DIALOG_HEADER if h.flags & FLAG_SECURED else DIALOG_HEADER


@lru_cache(maxsize=4096)
def _names_problem(
    from_service: str, to_service: str, contract: str, message_type: str
) -> str | None:
    for what, name in (
        ("from service", from_service),
        ("to service", to_service),
        ("contract", contract),
        ("message type", message_type),
    ):
        try:
            size = len(name.encode("utf-8"))
        except UnicodeEncodeError:
            return f"{what} name is not valid Unicode text"
        if size > MAX_NAME_BYTES:
            return f"{what} name of {size} bytes exceeds {MAX_NAME_BYTES}"
    return None


def validate_header(h: DialogHeader, body_length: int | None) -> str | None:
    """The first rule ``h`` breaks, or None. ``body_length`` is None for acknowledgements.

    On the path of every fragment and acknowledgement: the fields are unpacked once, and
    the acknowledgement's ranges are only looked at when there are any.
    """
    (
        _,
        from_service,
        to_service,
        from_broker,
        _,
        contract,
        message_type,
        flags,
        sequence_number,
        fragment_index,
        fragment_count,
        fragment_offset,
        message_length,
        _,
        _,
        ack,
        security,
    ) = h
    problem = _names_problem(from_service, to_service, contract, message_type)
    if problem:
        return problem
    if not from_service or not to_service:
        return "service names must not be empty"
    if flags & ~_KNOWN_FLAGS:
        return f"unknown message flags {int(flags):#x}"
    if from_broker == NIL_UUID:
        return "the sending broker instance must be named"
    if bool(flags & FLAG_SECURED) != (security is not None):
        return "the SECURED flag and the security trailer must go together"
    if security is not None and len(security.key_exchange) > MAX_KEY_EXCHANGE_SIZE:
        return f"key exchange exceeds {MAX_KEY_EXCHANGE_SIZE} bytes"
    through, ranges, fragments = ack
    if not ranges and not fragments:
        if sequence_number > MAX_SEQUENCE_NUMBER or through > MAX_SEQUENCE_NUMBER:
            return f"a sequence number above {MAX_SEQUENCE_NUMBER}"
    else:
        problem = _ranges_problem(sequence_number, ack)
        if problem:
            return problem
    if body_length is None:
        return None
    if flags & FLAG_SEQUENCED and sequence_number == 0:
        return "a sequenced message needs a sequence number"
    if not 0 <= fragment_index < fragment_count:
        return f"fragment index {fragment_index} outside 0..{fragment_count - 1}"
    if fragment_offset + body_length > message_length:
        return (
            f"fragment at offset {fragment_offset} with {body_length} bytes overruns a "
            f"message of {message_length} bytes"
        )
    if fragment_count > max(1, message_length):
        return f"{fragment_count} fragments for a message of {message_length} bytes"
    if fragment_count == 1 and body_length != message_length:
        return f"single-fragment message of {message_length} bytes carries {body_length}"
    return None


def _ranges_problem(sequence_number: int, ack: Acknowledgement) -> str | None:
    """The first rule an acknowledgement with ranges or fragment acknowledgements breaks."""
    if len(ack.ranges) > MAX_ACK_RANGES or len(ack.fragments) > MAX_FRAGMENT_ACKS:
        return "too many acknowledgement ranges"
    if (
        sequence_number > MAX_SEQUENCE_NUMBER
        or ack.through > MAX_SEQUENCE_NUMBER
        or (ack.ranges and ack.ranges[-1].last > MAX_SEQUENCE_NUMBER)
        or any(f.sequence_number > MAX_SEQUENCE_NUMBER for f in ack.fragments)
    ):
        return f"a sequence number above {MAX_SEQUENCE_NUMBER}"
    low = ack.through
    for r in ack.ranges:
        if not low < r.first <= r.last:
            return f"acknowledgement range {r.first}..{r.last} is out of order"
        low = r.last
    for f in ack.fragments:
        if f.first > f.last or f.sequence_number <= ack.through:
            return f"fragment acknowledgement {f} is inconsistent"
    return None


def encode_header(h: DialogHeader) -> bytes:
    return _header_bytes(h)


def decode_header(data: bytes) -> DialogHeader:
    return _parse_header(data)


def encode_fragment(h: DialogHeader, body: bytes) -> bytes:
    """The payload of a FRAGMENT frame: header and fragment bytes."""
    return b"".join(fragment_pieces(h, body)[0])


def fragment_pieces(h: DialogHeader, body: Buffer) -> SizedPayload:
    """The payload of a FRAGMENT frame as two pieces, not joined, and its size: the
    header with its length prefix, then the fragment's bytes (a link frames them without
    copying the bytes first: :meth:`protocol.connection.BrokerConnection.send_fragments`)."""
    problem = validate_header(h, len(body))
    if problem:
        raise LocalProtocolError(f"invalid dialog message: {problem}")
    header = _header_bytes(h)
    prefix = _U16.pack(len(header)) + header
    return (prefix, body), len(prefix) + len(body)


def decode_fragment(payload: bytes) -> tuple[DialogHeader, bytes]:
    """Header and fragment bytes of a FRAGMENT frame payload; RemoteProtocolError if invalid."""
    if len(payload) < 2:
        raise RemoteProtocolError("FRAGMENT payload is truncated")
    (length,) = _U16.unpack_from(payload, 0)
    if 2 + length > len(payload):
        raise RemoteProtocolError("length prefix runs past the end")
    view = memoryview(payload)
    header = _parse_header(view[2 : 2 + length])
    body = bytes(view[2 + length :])
    problem = validate_header(header, len(body))
    if problem:
        raise RemoteProtocolError(f"invalid dialog message: {problem}")
    return header, body


_HOP_COUNT_AT = 2 + struct.calcsize(">16sHQIIQQI")
"""Where a FRAGMENT payload's hop count is: after its header's length prefix and the
header's fixed fields before it (``_FIXED``)."""


def relay_fragment(payload: bytes, hop_count: int) -> bytes:
    """A FRAGMENT payload that :func:`decode_fragment` accepted, with its header's hop
    count set to ``hop_count``: what a forwarder sends on (R-ROUTE-7). The same bytes as
    encoding the decoded header with that hop count, without encoding it again."""
    if not 0 <= hop_count <= 255:
        raise LocalProtocolError(f"hop count {hop_count} does not fit in a byte")
    if len(payload) <= _HOP_COUNT_AT:
        raise LocalProtocolError("FRAGMENT payload is truncated")
    return b"".join((payload[:_HOP_COUNT_AT], bytes((hop_count,)), payload[_HOP_COUNT_AT + 1 :]))


def encode_acks(headers: list[DialogHeader]) -> bytes:
    """The payload of an ACK frame: one header per acknowledged conversation endpoint."""
    if not 0 < len(headers) <= MAX_ACKS_PER_FRAME:
        raise LocalProtocolError(f"an ACK frame carries 1..{MAX_ACKS_PER_FRAME} headers")
    parts = [_U16.pack(len(headers))]
    for h in headers:
        problem = validate_header(h, None)
        if problem:
            raise LocalProtocolError(f"invalid acknowledgement: {problem}")
        raw = _header_bytes(h)
        parts.append(_U16.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def decode_acks(payload: bytes) -> list[DialogHeader]:
    size = len(payload)
    if size < 2:
        raise RemoteProtocolError("ACK payload is truncated")
    (count,) = _U16.unpack_from(payload, 0)
    if not 0 < count <= MAX_ACKS_PER_FRAME:
        raise RemoteProtocolError(f"ACK frame with {count} headers")
    view = memoryview(payload)
    pos = 2
    headers = []
    for _ in range(count):
        if pos + 2 > size:
            raise RemoteProtocolError("length prefix runs past the end")
        (length,) = _U16.unpack_from(payload, pos)
        pos += 2
        if pos + length > size:
            raise RemoteProtocolError("length prefix runs past the end")
        h = _parse_header(view[pos : pos + length])
        pos += length
        problem = validate_header(h, None)
        if problem:
            raise RemoteProtocolError(f"invalid acknowledgement: {problem}")
        headers.append(h)
    if pos != size:
        raise RemoteProtocolError(f"{size - pos} trailing bytes")
    return headers
