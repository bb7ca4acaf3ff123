"""Adjacent-broker frame format (SPEC R-PROTO-1, R-PROTO-2), declared once with construct.

Every frame is a fixed 22-byte header followed by ``length`` bytes of body::

    magic "BK" | version u8 | frame type u8 | flags u8 | reserved 0x00 |
    length u32 | counter u64 | header CRC-32 u32

``counter`` numbers the frames of one direction of one connection from 0; it is
the AEAD nonce and the replay/reorder guard. The CRC covers the first 18 header
bytes so that a damaged length is caught at once (the stream cannot be
re-synchronised after that, so it is fatal); everything else is protected by the
AEAD (``protocol/security.py``), whose associated data is the whole header.

Bodies, one construct declaration per frame type; at run time they are parsed
and built by FastCodecs derived from those declarations (``protocol/codec.py``
says why). FRAGMENT and ACK bodies are opaque here: they carry dialog-layer bytes
(``protocol/dialog.py``); a FRAGMENTS body is several FRAGMENT bodies, each prefixed
by its length (u32), so one seal, one signature and one header serve them all. The
byte layouts are documented in docs/protocol.md.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import construct as c

from protocol.buffers import Buffer
from protocol.codec import FastCodec, fixed_struct
from protocol.errors import CloseCode, RemoteProtocolError

MAGIC = b"BK"
PROTOCOL_VERSIONS: tuple[int, ...] = (1, 2)
"""Protocol versions this implementation speaks, oldest first. Version 2 adds the
FRAGMENTS frame; everything else is version 1's."""
FRAGMENTS_VERSION = 2
"""The first version with FRAGMENTS frames."""
HELLO_VERSION = 1
"""Header version of every HELLO, frozen for all time: a peer of any later version can
still read the offered version list and negotiate."""

HEADER_SIZE = 22
DEFAULT_MAX_FRAME_SIZE = 1024 * 1024 + 16 * 1024
"""Default limit on a frame body: a 1 MiB fragment plus the largest dialog header
(about 5.2 KiB) and the protection overhead."""
MIN_MAX_FRAME_SIZE = 32 * 1024
"""No peer may announce a smaller limit: the largest handshake frame (a HELLO_REPLY
with a 16 KiB certificate, about 18.5 KiB) must fit."""

MAX_NAME_BYTES = 1024
"""Bound on instance, database and service names (UTF-8 bytes)."""
MAX_REASON_BYTES = 1024
MAX_CERTIFICATE_BYTES = 16 * 1024
MAX_SIGNATURE_BYTES = 1024
MAX_VERSIONS = 16


class FrameType(enum.IntEnum):
    HELLO = 1
    HELLO_REPLY = 2
    PROOF = 3
    WELCOME = 4
    FRAGMENT = 16
    ACK = 17
    KEEPALIVE = 18
    CLOSE = 19
    PRINCIPAL_QUERY = 20
    PRINCIPAL_ANSWER = 21
    MIRROR = 22
    """Database mirroring (R-ROUTE-16); the body is opaque here, see protocol/mirroring.py."""
    FRAGMENTS = 23
    """Version 2 on: several FRAGMENT payloads under one seal (:func:`encode_fragments`)."""


class FrameFlags(enum.IntFlag):
    NONE = 0
    PROTECTED = 1
    """Body carries the encrypted MD5 signature and is authenticated under the session key."""
    ENCRYPTED = 2
    """Body is AEAD-encrypted (only together with PROTECTED)."""


class EncryptionMode(enum.IntEnum):
    """SPEC R-OBJ-7: the endpoint's encryption setting."""

    REQUIRED = 1
    SUPPORTED = 2
    DISABLED = 3


class MirrorRole(enum.IntEnum):
    """Answer to a principal query (SPEC R-ROUTE-10)."""

    PRINCIPAL = 1
    MIRROR = 2
    UNKNOWN = 3
    """This instance does not hold that database / broker instance."""


FRAME_HEADER_PREFIX = c.Struct(
    "magic" / c.Const(MAGIC),
    "version" / c.Int8ub,
    "frame_type" / c.Int8ub,
    "flags" / c.Int8ub,
    "reserved" / c.Const(b"\x00"),
    "length" / c.Int32ub,
    "counter" / c.Int64ub,
)
"""The part of the header the CRC covers."""
FRAME_HEADER = c.Struct(*FRAME_HEADER_PREFIX.subcons, "header_crc" / c.Int32ub)
_HEADER: struct.Struct = fixed_struct(FRAME_HEADER)
_PREFIX: struct.Struct = fixed_struct(FRAME_HEADER_PREFIX)
_CRC = struct.Struct(">I")
_CRC_SPAN = _PREFIX.size
assert _HEADER.size == HEADER_SIZE == _CRC_SPAN + _CRC.size

_Name = c.PascalString(c.Int16ub, "utf8")
_Blob = c.Prefixed(c.Int16ub, c.GreedyBytes)

HELLO_BODY = c.Struct(
    "versions" / c.PrefixedArray(c.Int8ub, c.Int16ub),
    "instance_name" / _Name,
    "random" / c.Bytes(32),
    "ephemeral_key" / c.Bytes(32),
    "encryption" / c.Int8ub,
    "max_frame_size" / c.Int32ub,
    "certificate" / _Blob,
    c.Terminated,
)
# The reply is signed over its core's exact bytes, so the core travels as a blob.
HELLO_REPLY_CORE = c.Struct(
    "version" / c.Int16ub,
    "instance_name" / _Name,
    "random" / c.Bytes(32),
    "ephemeral_key" / c.Bytes(32),
    "encryption" / c.Int8ub,
    "encrypted" / c.Int8ub,
    "max_frame_size" / c.Int32ub,
    "certificate" / _Blob,
    c.Terminated,
)
HELLO_REPLY_BODY = c.Struct("core" / _Blob, "signature" / _Blob, c.Terminated)
PROOF_BODY = c.Struct("signature" / _Blob, c.Terminated)
WELCOME_BODY = c.Struct(c.Terminated)
KEEPALIVE_BODY = c.Struct(c.Terminated)
CLOSE_BODY = c.Struct("code" / c.Int16ub, "reason" / _Name, c.Terminated)
PRINCIPAL_QUERY_BODY = c.Struct(
    "query_id" / c.Int32ub,
    "broker_instance" / c.Bytes(16),
    "service" / _Name,
    "epoch" / c.Int64ub,
    c.Terminated,
)
"""``epoch``: the highest mirroring epoch the asker has seen for the pair (R-ROUTE-15)."""
PRINCIPAL_ANSWER_BODY = c.Struct(
    "query_id" / c.Int32ub,
    "role" / c.Int8ub,
    "broker_instance" / c.Bytes(16),
    "service" / _Name,
    "epoch" / c.Int64ub,
    c.Terminated,
)
"""``epoch``: the answering partner's mirroring epoch for the database (R-ROUTE-15)."""

BODY_CODECS: dict[FrameType, Any] = {
    FrameType.HELLO: HELLO_BODY,
    FrameType.HELLO_REPLY: HELLO_REPLY_BODY,
    FrameType.PROOF: PROOF_BODY,
    FrameType.WELCOME: WELCOME_BODY,
    FrameType.KEEPALIVE: KEEPALIVE_BODY,
    FrameType.CLOSE: CLOSE_BODY,
    FrameType.PRINCIPAL_QUERY: PRINCIPAL_QUERY_BODY,
    FrameType.PRINCIPAL_ANSWER: PRINCIPAL_ANSWER_BODY,
}
"""The construct declarations of the structured bodies (FRAGMENT/ACK are opaque)."""

FAST_BODY_CODECS: dict[FrameType, FastCodec] = {
    t: FastCodec(s, t.name.title().replace("_", "") + "Body") for t, s in BODY_CODECS.items()
}
"""The codecs used at run time, derived from BODY_CODECS (see protocol/codec.py)."""
_REPLY_CORE_CODEC = FastCodec(HELLO_REPLY_CORE, "HelloReplyCore")


class FrameHeader(NamedTuple):
    version: int
    frame_type: int
    flags: int
    length: int
    counter: int


def encode_header(version: int, frame_type: int, flags: int, length: int, counter: int) -> bytes:
    """Header bytes for a frame (hot path: the derived struct of FRAME_HEADER)."""
    prefix = _PREFIX.pack(MAGIC, version, frame_type, flags, b"\x00", length, counter)
    return prefix + _CRC.pack(zlib.crc32(prefix))


def decode_header(data: bytes, max_frame_size: int, offset: int = 0) -> FrameHeader:
    """Validate and decode the HEADER_SIZE bytes of ``data`` at ``offset``.

    Checks, in order, before anything is allocated for the body: magic, header
    CRC, reserved byte, frame type, body length against ``max_frame_size``.
    """
    magic, version, frame_type, flags, reserved, length, counter, crc = _HEADER.unpack_from(
        data, offset
    )
    if magic != MAGIC:
        raise RemoteProtocolError(f"bad frame magic {bytes(magic)!r}")
    if zlib.crc32(data[offset : offset + _CRC_SPAN]) != crc:
        raise RemoteProtocolError("frame header checksum mismatch", CloseCode.INTEGRITY)
    if reserved != b"\x00":
        raise RemoteProtocolError("reserved header byte is not zero")
    if frame_type not in _FRAME_TYPE_VALUES:
        raise RemoteProtocolError(f"unknown frame type {frame_type}")
    if length > max_frame_size:
        raise RemoteProtocolError(
            f"frame body of {length} bytes exceeds the limit of {max_frame_size}",
            CloseCode.FRAME_TOO_LARGE,
        )
    return FrameHeader(version, frame_type, flags, length, counter)


_FRAME_TYPE_VALUES = frozenset(int(t) for t in FrameType)


def iter_frame_headers(
    data: bytes, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
) -> list[FrameHeader]:
    """Headers of the complete frames at the start of ``data`` (for tools and tests)."""
    out: list[FrameHeader] = []
    pos = 0
    while len(data) - pos >= HEADER_SIZE:
        header = decode_header(data, max_frame_size, pos)
        if len(data) - pos - HEADER_SIZE < header.length:
            break
        out.append(header)
        pos += HEADER_SIZE + header.length
    return out


def encode_body(frame_type: FrameType, value: dict[str, Any]) -> bytes:
    """Build a structured body (handshake, close, keepalive, principal query/answer)."""
    return FAST_BODY_CODECS[frame_type].build_mapping(value)


def decode_body(frame_type: FrameType, body: bytes) -> Any:
    """Parse a structured body into a named tuple; truncated or trailing bytes fail."""
    value = _parse_record(FAST_BODY_CODECS[frame_type], body, f"{frame_type.name} body")
    _check_bounds(frame_type, value)
    return value


def encode_reply_core(value: dict[str, Any]) -> bytes:
    return _REPLY_CORE_CODEC.build_mapping(value)


def decode_reply_core(data: bytes) -> Any:
    value = _parse_record(_REPLY_CORE_CODEC, data, "HELLO_REPLY core")
    _check_name(value.instance_name, "instance name")
    _check_blob(value.certificate, MAX_CERTIFICATE_BYTES, "certificate")
    return value


def _parse_record(codec: FastCodec, data: bytes, what: str) -> Any:
    try:
        return codec.parse_record(data)
    except RemoteProtocolError as exc:
        raise RemoteProtocolError(f"malformed {what}: {exc}") from None


def _check_bounds(frame_type: FrameType, value: Any) -> None:
    if frame_type is FrameType.HELLO:
        _check_name(value.instance_name, "instance name")
        _check_blob(value.certificate, MAX_CERTIFICATE_BYTES, "certificate")
        if not 0 < len(value.versions) <= MAX_VERSIONS:
            raise RemoteProtocolError(f"HELLO offers {len(value.versions)} versions")
    elif frame_type in (FrameType.HELLO_REPLY, FrameType.PROOF):
        _check_blob(value.signature, MAX_SIGNATURE_BYTES, "signature")
    elif frame_type is FrameType.CLOSE:
        _check_name(value.reason, "close reason", MAX_REASON_BYTES, allow_empty=True)
    elif frame_type in (FrameType.PRINCIPAL_QUERY, FrameType.PRINCIPAL_ANSWER):
        _check_name(value.service, "service name")


def _check_name(
    name: str, what: str, limit: int = MAX_NAME_BYTES, allow_empty: bool = False
) -> None:
    size = len(name.encode("utf-8"))
    if size > limit:
        raise RemoteProtocolError(f"{what} of {size} bytes exceeds {limit}")
    if not allow_empty and size == 0:
        raise RemoteProtocolError(f"empty {what}")


def _check_blob(blob: bytes, limit: int, what: str) -> None:
    if len(blob) > limit:
        raise RemoteProtocolError(f"{what} of {len(blob)} bytes exceeds {limit}")


_FRAGMENT_LENGTH = struct.Struct(">I")
MAX_FRAGMENTS_PER_FRAME = 4096
"""Bound on the FRAGMENT payloads one FRAGMENTS frame carries."""


SizedPayload = tuple[Sequence[Buffer], int]
"""A payload as the pieces it is joined from, and its size in bytes: how a link hands
fragments to :meth:`protocol.connection.BrokerConnection.send_fragments`, which copies
them once, into the frame."""


def encode_fragments(payloads: list[bytes]) -> bytes:
    """The body of a FRAGMENTS frame: each payload prefixed by its length (u32)."""
    return b"".join(fragments_pieces([((payload,), len(payload)) for payload in payloads]))


def fragments_pieces(payloads: Sequence[SizedPayload]) -> list[Buffer]:
    """The pieces that make the body of a FRAGMENTS frame once joined: each payload's
    size (u32), then its pieces. ValueError for what :func:`decode_fragments` refuses:
    no payload, more than :data:`MAX_FRAGMENTS_PER_FRAME`, an empty one."""
    if not 0 < len(payloads) <= MAX_FRAGMENTS_PER_FRAME:
        raise ValueError(f"a FRAGMENTS frame carries 1..{MAX_FRAGMENTS_PER_FRAME} payloads")
    pack = _FRAGMENT_LENGTH.pack
    out: list[Buffer] = []
    for pieces, size in payloads:
        if not size:
            raise ValueError("a FRAGMENTS frame carries no empty payload")
        out.append(pack(size))
        out.extend(pieces)
    return out


def decode_fragments(body: Buffer) -> list[bytes]:
    """The FRAGMENT payloads of a FRAGMENTS body; RemoteProtocolError if it is malformed
    (no payload, an empty one, a length past the end, too many)."""
    size = len(body)
    unpack = _FRAGMENT_LENGTH.unpack_from
    view = memoryview(body)
    out: list[bytes] = []
    pos = 0
    while pos < size:
        if len(out) == MAX_FRAGMENTS_PER_FRAME:
            raise RemoteProtocolError(
                f"FRAGMENTS frame with more than {MAX_FRAGMENTS_PER_FRAME} payloads"
            )
        if pos + 4 > size:
            raise RemoteProtocolError("FRAGMENTS length prefix is truncated")
        (length,) = unpack(body, pos)
        pos += 4
        if not length:
            raise RemoteProtocolError("FRAGMENTS frame with an empty payload")
        if pos + length > size:
            raise RemoteProtocolError("FRAGMENTS payload runs past the end")
        out.append(bytes(view[pos : pos + length]))
        pos += length
    if not out:
        raise RemoteProtocolError("FRAGMENTS frame with no payload")
    return out
