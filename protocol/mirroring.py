"""Database mirroring messages carried in MIRROR frames (SPEC R-ROUTE-16), sans-I/O.

A mirrored database's principal ships each committed unit of work (the
statements of one SQLite transaction and their parameters) to its mirror
partner, in commit order, numbered by a *log sequence number* (LSN); the mirror
applies them to its own file and confirms. The MIRROR frame body is opaque to
the frame layer (like FRAGMENT); this module encodes and decodes it::

    kind u8 | broker_instance 16 bytes | fields of the kind

    ATTACH   (mirror -> principal)  epoch u64 | lsn u64 | lsn_epoch u64
             "I hold the database at mirroring epoch ``epoch`` and have applied
             every unit through ``lsn`` (that unit written at ``lsn_epoch``)"
    UNIT     (principal -> mirror)  lsn u64 | epoch u64 | final u8 | chunk bytes
    SNAPSHOT (principal -> mirror)  lsn u64 | epoch u64 | final u8 | chunk bytes
             a unit's encoded statements, or a copy of the whole file, split in
             chunks; ``final`` marks the last chunk
    CONFIRM  (mirror -> principal)  lsn u64
             every unit through ``lsn`` is committed in the mirror's file
    REFUSE   (either way)           reason u16-prefixed UTF-8

The statements of a unit (:func:`encode_statements`)::

    texts u32 | (length u32 | UTF-8 SQL) * texts |
    statements u32 | (text index u32 | values u16 | value * values) * statements
    value: tag u8 (0 NULL, 1 integer i64, 2 real f64, 3 text, 4 blob) |
           integer or real 8 bytes | text or blob: length u32 | bytes

Every count and size read is bounded before anything is allocated
(:data:`MAX_UNIT_BYTES`, :data:`MAX_SQL_TEXTS` ...), and :class:`StatementsEncoder`
encodes only what :func:`decode_statements` takes; a chunked unit or snapshot is
reassembled by :class:`ChunkAssembler`, which refuses to hold more than its
bound. Bad input raises :class:`~protocol.errors.RemoteProtocolError`.
"""

from __future__ import annotations

import enum
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from protocol.errors import LocalProtocolError, RemoteProtocolError

MAX_UNIT_BYTES = 1024 * 1024 * 1024
"""A unit of work's encoded statements (a group commit of large messages stays far below)."""
MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024 * 1024
"""A copy of the principal's whole file (a SNAPSHOT); units stay bounded by
:data:`MAX_UNIT_BYTES`, also after a copy that was cut off."""
MAX_SQL_TEXTS = 4096
MAX_SQL_BYTES = 64 * 1024
MAX_STATEMENTS = 10_000_000
MAX_VALUES = 32766
"""SQLite's own limit on the values of one statement (a multi-row INSERT carries many)."""
MAX_REASON_BYTES = 1024
CHUNK_BYTES = 256 * 1024
"""Largest chunk the daemon puts in one MIRROR frame (below every frame limit it may
negotiate it is cut further, see :func:`chunk_size`)."""


class Kind(enum.IntEnum):
    ATTACH = 1
    UNIT = 2
    SNAPSHOT = 3
    CONFIRM = 4
    REFUSE = 5


@dataclass(frozen=True, slots=True)
class Attach:
    broker_instance: uuid.UUID
    epoch: int
    lsn: int
    lsn_epoch: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """A part of a UNIT or a SNAPSHOT."""

    kind: Kind
    broker_instance: uuid.UUID
    lsn: int
    epoch: int
    final: bool
    data: bytes


@dataclass(frozen=True, slots=True)
class Confirm:
    broker_instance: uuid.UUID
    lsn: int


@dataclass(frozen=True, slots=True)
class Refuse:
    broker_instance: uuid.UUID
    reason: str


Message = Attach | Chunk | Confirm | Refuse

_HEAD = struct.Struct(">B16s")
_ATTACH = struct.Struct(">QQQ")
_CHUNK = struct.Struct(">QQB")
_CONFIRM = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_U64_MAX = 2**64 - 1


def encode(message: Message) -> bytes:
    """The MIRROR frame body for ``message``; LocalProtocolError if a field does not fit."""
    try:
        if isinstance(message, Attach):
            return _HEAD.pack(Kind.ATTACH, message.broker_instance.bytes) + _ATTACH.pack(
                message.epoch, message.lsn, message.lsn_epoch
            )
        if isinstance(message, Chunk):
            if message.kind not in (Kind.UNIT, Kind.SNAPSHOT):
                raise LocalProtocolError(f"a chunk is a UNIT or a SNAPSHOT, not {message.kind}")
            return (
                _HEAD.pack(message.kind, message.broker_instance.bytes)
                + _CHUNK.pack(message.lsn, message.epoch, 1 if message.final else 0)
                + message.data
            )
        if isinstance(message, Confirm):
            return _HEAD.pack(Kind.CONFIRM, message.broker_instance.bytes) + _CONFIRM.pack(
                message.lsn
            )
        reason = _utf8(message.reason, "refusal reason")
        if len(reason) > MAX_REASON_BYTES:
            raise LocalProtocolError(f"refusal reason of {len(reason)} bytes")
        return (
            _HEAD.pack(Kind.REFUSE, message.broker_instance.bytes) + _U16.pack(len(reason)) + reason
        )
    except struct.error as exc:
        raise LocalProtocolError(f"mirroring message does not fit: {exc}") from None


def decode(body: bytes) -> Message:
    """Parse a MIRROR frame body; RemoteProtocolError if it is malformed."""
    if len(body) < _HEAD.size:
        raise RemoteProtocolError(f"mirroring message of {len(body)} bytes is truncated")
    kind_value, instance_bytes = _HEAD.unpack_from(body)
    try:
        kind = Kind(kind_value)
    except ValueError:
        raise RemoteProtocolError(f"unknown mirroring message kind {kind_value}") from None
    instance = uuid.UUID(bytes=instance_bytes)
    rest = memoryview(body)[_HEAD.size :]
    if kind is Kind.ATTACH:
        _exact(rest, _ATTACH.size, "ATTACH")
        epoch, lsn, lsn_epoch = _ATTACH.unpack(rest)
        return Attach(instance, epoch, lsn, lsn_epoch)
    if kind in (Kind.UNIT, Kind.SNAPSHOT):
        if len(rest) < _CHUNK.size:
            raise RemoteProtocolError(f"{kind.name} chunk header is truncated")
        lsn, epoch, final = _CHUNK.unpack_from(rest)
        if final > 1:
            raise RemoteProtocolError(f"{kind.name} chunk final flag is {final}")
        return Chunk(kind, instance, lsn, epoch, bool(final), bytes(rest[_CHUNK.size :]))
    if kind is Kind.CONFIRM:
        _exact(rest, _CONFIRM.size, "CONFIRM")
        (lsn,) = _CONFIRM.unpack(rest)
        return Confirm(instance, lsn)
    if len(rest) < _U16.size:
        raise RemoteProtocolError("REFUSE is truncated")
    (size,) = _U16.unpack_from(rest)
    if size > MAX_REASON_BYTES:
        raise RemoteProtocolError(f"refusal reason of {size} bytes exceeds {MAX_REASON_BYTES}")
    _exact(rest, _U16.size + size, "REFUSE")
    try:
        reason = bytes(rest[_U16.size :]).decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError("refusal reason is not UTF-8") from None
    return Refuse(instance, reason)


def _exact(rest: memoryview, size: int, what: str) -> None:
    if len(rest) != size:
        raise RemoteProtocolError(f"{what} body is {len(rest)} bytes, not {size}")


def chunk_size(peer_max_frame_size: int) -> int:
    """The chunk that fits one MIRROR frame under the peer's limit (header, AEAD overhead)."""
    return max(1024, min(CHUNK_BYTES, peer_max_frame_size - 1024))


def split(
    kind: Kind, broker_instance: uuid.UUID, lsn: int, epoch: int, data: bytes, size: int
) -> list[Chunk]:
    """``data`` as chunks of at most ``size`` bytes (at least one, the last ``final``)."""
    if size <= 0:
        raise LocalProtocolError("chunk size must be positive")
    view = memoryview(data)
    starts = list(range(0, len(data), size)) or [0]
    return [
        Chunk(
            kind,
            broker_instance,
            lsn,
            epoch,
            i == len(starts) - 1,
            bytes(view[start : start + size]),
        )
        for i, start in enumerate(starts)
    ]


class ChunkAssembler:
    """Reassembles the chunks of one UNIT or SNAPSHOT at a time, a UNIT within ``limit``
    bytes and a SNAPSHOT within ``snapshot_limit`` (``limit`` if not given): each chunk is
    held to the bound of its own kind, whatever came before it."""

    def __init__(self, limit: int, snapshot_limit: int | None = None) -> None:
        self.limit = limit
        self.snapshot_limit = limit if snapshot_limit is None else snapshot_limit
        self._key: tuple[Kind, int, int] | None = None
        self._parts: list[bytes] = []
        self._size = 0

    @property
    def buffered(self) -> int:
        return self._size

    def reset(self) -> None:
        self._key, self._parts, self._size = None, [], 0

    def add(self, chunk: Chunk) -> bytes | None:
        """The whole payload once ``chunk`` is the final one; None while parts are missing.

        A chunk of another unit before the current one is complete, or a payload over the
        limit, raises RemoteProtocolError (and forgets the parts)."""
        key = (chunk.kind, chunk.lsn, chunk.epoch)
        if self._key is not None and key != self._key:
            self.reset()
            raise RemoteProtocolError(
                f"{chunk.kind.name} chunk for LSN {chunk.lsn} arrived before the previous "
                "one was complete"
            )
        limit = self.snapshot_limit if chunk.kind is Kind.SNAPSHOT else self.limit
        if self._size + len(chunk.data) > limit:
            self.reset()
            raise RemoteProtocolError(f"{chunk.kind.name} exceeds {limit} bytes")
        self._key = key
        self._parts.append(chunk.data)
        self._size += len(chunk.data)
        if not chunk.final:
            return None
        whole = b"".join(self._parts)
        self.reset()
        return whole


Statement = tuple[str, Sequence[Any]]


class StatementsEncoder:
    """The statements of a unit of work encoded one at a time (:func:`encode_statements`'s
    format), within every bound :func:`decode_statements` enforces: a statement that would
    take the unit beyond one (:data:`MAX_SQL_TEXTS`, :data:`MAX_SQL_BYTES`,
    :data:`MAX_STATEMENTS`, :data:`MAX_VALUES`, :data:`MAX_UNIT_BYTES`), or that holds a
    value no unit carries, raises LocalProtocolError and leaves the encoder as it was. So
    whatever it encodes, a mirror decodes.

    ``max_bytes`` and ``max_statements`` lower the bounds (never above the mirror's)."""

    __slots__ = ("_body", "_head", "_texts", "count", "max_bytes", "max_statements", "size")

    def __init__(
        self, max_bytes: int = MAX_UNIT_BYTES, max_statements: int = MAX_STATEMENTS
    ) -> None:
        self.max_bytes = min(max_bytes, MAX_UNIT_BYTES)
        self.max_statements = min(max_statements, MAX_STATEMENTS)
        self._texts: dict[str, int] = {}
        self._head: list[bytes] = []
        self._body: list[bytes] = []
        self.count = 0
        """Statements encoded so far."""
        self.size = 2 * _U32.size
        """Bytes :meth:`finish` returns."""

    def add(self, sql: str, params: Sequence[Any]) -> None:
        """Encode one more statement; LocalProtocolError (nothing added) if it cannot be."""
        if self.count >= self.max_statements:
            raise LocalProtocolError(
                f"a unit of work with more than {self.max_statements} statements"
            )
        if len(params) > MAX_VALUES:
            raise LocalProtocolError(f"a statement with {len(params)} values")
        index = self._texts.get(sql)
        text = b""
        if index is None:
            if len(self._texts) >= MAX_SQL_TEXTS:
                raise LocalProtocolError(
                    f"a unit of work with more than {MAX_SQL_TEXTS} distinct statements"
                )
            raw = _utf8(sql, "statement")
            if len(raw) > MAX_SQL_BYTES:
                raise LocalProtocolError(f"a statement of {len(raw)} bytes")
            index = len(self._texts)
            text = _U32.pack(len(raw)) + raw
        parts = [_U32.pack(index) + _U16.pack(len(params))]
        try:
            for value in params:
                _value(value, parts)
        except struct.error as exc:  # a text or blob of 4 GiB or more
            raise LocalProtocolError(f"a value does not fit a unit of work: {exc}") from None
        size = self.size + len(text) + sum(len(part) for part in parts)
        if size > self.max_bytes:
            raise LocalProtocolError(
                f"a unit of work of more than {self.max_bytes} bytes ({size} with this statement)"
            )
        if text:
            self._texts[sql] = index
            self._head.append(text)
        self._body += parts
        self.count += 1
        self.size = size

    def finish(self) -> bytes:
        """The encoded statements (see the module docstring)."""
        return b"".join(
            [_U32.pack(len(self._texts)), *self._head, _U32.pack(self.count), *self._body]
        )


def encode_statements(statements: Sequence[Statement]) -> bytes:
    """The statements of a unit of work, SQL texts stored once (see the module docstring);
    LocalProtocolError beyond a bound :func:`decode_statements` enforces."""
    encoder = StatementsEncoder()
    for sql, params in statements:
        encoder.add(sql, params)
    return encoder.finish()


def _value(value: Any, parts: list[bytes]) -> None:
    """Append ``value``'s encoding to ``parts`` (a blob's bytes as a part of their own: not
    copied until the unit is joined)."""
    if value is None:
        parts.append(b"\x00")
    elif isinstance(value, bool | int):
        try:
            parts.append(b"\x01" + _I64.pack(int(value)))
        except struct.error:
            raise LocalProtocolError(f"integer {value} does not fit 64 bits") from None
    elif isinstance(value, float):
        parts.append(b"\x02" + _F64.pack(value))
    elif isinstance(value, str):
        raw = _utf8(value, "text value")
        parts += (b"\x03" + _U32.pack(len(raw)), raw)
    elif isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        parts += (b"\x04" + _U32.pack(len(raw)), raw)
    else:
        raise LocalProtocolError(f"cannot ship a value of type {type(value).__name__}")


def _utf8(text: str, what: str) -> bytes:
    """``text`` as UTF-8; LocalProtocolError if no UTF-8 holds it (a lone surrogate)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise LocalProtocolError(f"{what} is not valid Unicode text") from None


def decode_statements(data: bytes) -> list[tuple[str, tuple[Any, ...]]]:
    """Parse :func:`encode_statements`'s bytes; RemoteProtocolError if malformed."""
    if len(data) > MAX_UNIT_BYTES:
        raise RemoteProtocolError(f"unit of work of {len(data)} bytes exceeds {MAX_UNIT_BYTES}")
    reader = _Reader(data)
    count = reader.u32()
    if count > MAX_SQL_TEXTS:
        raise RemoteProtocolError(f"unit of work with {count} distinct statements")
    texts: list[str] = []
    for _ in range(count):
        size = reader.u32()
        if size > MAX_SQL_BYTES:
            raise RemoteProtocolError(f"statement of {size} bytes exceeds {MAX_SQL_BYTES}")
        texts.append(reader.text(size))
    total = reader.u32()
    if total > MAX_STATEMENTS:
        raise RemoteProtocolError(f"unit of work with {total} statements")
    out: list[tuple[str, tuple[Any, ...]]] = []
    for _ in range(total):
        index = reader.u32()
        if index >= len(texts):
            raise RemoteProtocolError(f"statement refers to text {index} of {len(texts)}")
        values = reader.u16()
        if values > MAX_VALUES:
            raise RemoteProtocolError(f"statement with {values} values exceeds {MAX_VALUES}")
        out.append((texts[index], tuple(reader.value() for _ in range(values))))
    if reader.pos != len(data):
        raise RemoteProtocolError(f"{len(data) - reader.pos} trailing bytes after the statements")
    return out


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise RemoteProtocolError("unit of work is truncated")
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def u16(self) -> int:
        value: int = _U16.unpack(self._take(2))[0]
        return value

    def u32(self) -> int:
        value: int = _U32.unpack(self._take(4))[0]
        return value

    def text(self, size: int) -> str:
        try:
            return self._take(size).decode("utf-8")
        except UnicodeDecodeError:
            raise RemoteProtocolError("text in a unit of work is not UTF-8") from None

    def value(self) -> Any:
        tag = self._take(1)[0]
        if tag == 0:
            return None
        if tag == 1:
            return _I64.unpack(self._take(8))[0]
        if tag == 2:
            return _F64.unpack(self._take(8))[0]
        if tag in (3, 4):
            size = self.u32()
            if size > len(self.data) - self.pos:
                raise RemoteProtocolError("unit of work is truncated")
            return self.text(size) if tag == 3 else self._take(size)
        raise RemoteProtocolError(f"unknown value tag {tag} in a unit of work")
