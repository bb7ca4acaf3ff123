"""Client wire format: frames between an application SDK and the daemon's client listener.

This module owns the byte layout of the client protocol (TCP on loopback, TLS elsewhere), its
incremental parser and the helpers of its challenge/response authentication. It
does not own what the frames *mean* (the operations named in ``meta``, the
listener's state machine); that lives with the listener and the SDK.

Every frame is a fixed 16-byte header followed by two variable parts::

    magic b"BC" | version u8 (= 1) | kind u8 | request_id u32 |
    meta_length u32 | body_length u32 |
    meta   (meta_length bytes: a UTF-8 JSON object)
    body   (body_length bytes: opaque, e.g. a message body)

All integers are big-endian. ``kind`` is a :class:`ClientFrameKind`;
``request_id`` pairs a RESPONSE or ERROR with its REQUEST (CHALLENGE and NOTICE
frames conventionally carry 0; an ERROR of id 0 answers no request: the daemon closes
the connection and says why). A client may use an id again only once its request is
answered: the daemon refuses an id in flight. ``meta`` is limited to :data:`MAX_META_BYTES`;
``body`` to the reader's ``max_body`` (:data:`DEFAULT_MAX_BODY` by default). Both
limits are checked from the header alone, before any of the frame's meta or body
is waited for.

The header is declared once, with construct (:data:`CLIENT_FRAME_HEADER`); the
hot path packs and unpacks it with the ``struct`` derived from that declaration
(``protocol/codec.py`` says why).

Authentication: the daemon sends a CHALLENGE carrying a nonce from
:func:`new_nonce`; the SDK answers with :func:`auth_proof`, an HMAC-SHA256 under
the token the user name selects over ``b"brokerd-client-v1\\0" + user + b"\\0" + nonce``; the
daemon verifies it with :func:`check_proof` (constant time).

Errors: :func:`encode_frame` raises :class:`LocalProtocolError` (our own values do
not fit); :meth:`ClientFrameReader.feed` raises :class:`RemoteProtocolError` (the
peer sent something illegal, or a body there is no memory for), after which the reader
is dead. No construct,
struct, json or Unicode exception leaves this module.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import construct as c
import orjson

from protocol.buffers import Buffer, blank
from protocol.codec import fixed_struct
from protocol.errors import CloseCode, LocalProtocolError, RemoteProtocolError

MAGIC = b"BC"
CLIENT_WIRE_VERSION = 1
MAX_META_BYTES = 1024 * 1024
"""Limit on the UTF-8 JSON meta of one frame."""
DEFAULT_MAX_BODY = 128 * 1024 * 1024
"""Default limit on the opaque body of one frame (a reader may be given another)."""
NONCE_SIZE = 32
_U32_MAX = 0xFFFF_FFFF
_PROOF_LABEL = b"brokerd-client-v1\x00"
MAX_ROLLBACK_REASON = 4000
"""Characters of the reason a ROLLBACK may give (kept as the message's last error, SPEC §6);
the SDK cuts a longer one, the daemon refuses it (InvalidRequest)."""
BEGIN_DIALOG_KEYS = "begin_dialog_keys"
"""A feature a daemon names in its login answer (``features``): its BEGIN DIALOG takes an
idempotency ``key``, so the SDK may write a BEGIN DIALOG of unknown outcome again (SPEC
§6). A daemon that does not name it ignores the field."""


class ClientFrameKind(enum.IntEnum):
    CHALLENGE = 1
    """Daemon to SDK, first frame of a connection: the authentication nonce."""
    REQUEST = 2
    """SDK to daemon: an operation; ``request_id`` chosen by the SDK."""
    RESPONSE = 3
    """Daemon to SDK: the successful outcome of the request with the same id."""
    ERROR = 4
    """Daemon to SDK: the failed outcome of the request with the same id."""
    NOTICE = 5
    """Unsolicited information (e.g. the daemon is shutting down)."""


CLIENT_FRAME_HEADER = c.Struct(
    "magic" / c.Const(MAGIC),
    "version" / c.Int8ub,
    "kind" / c.Int8ub,
    "request_id" / c.Int32ub,
    "meta_length" / c.Int32ub,
    "body_length" / c.Int32ub,
)
"""The fixed header, the single declaration of the layout."""
_HEADER: struct.Struct = fixed_struct(CLIENT_FRAME_HEADER)
HEADER_SIZE = 16
assert _HEADER.size == HEADER_SIZE

_KIND_BY_VALUE: dict[int, ClientFrameKind] = {int(k): k for k in ClientFrameKind}


class ClientFrame(NamedTuple):
    kind: ClientFrameKind
    request_id: int
    meta: dict[str, Any]
    body: bytes | bytearray = b""
    """``bytes``, or a ``bytearray`` for a body of :data:`LARGE_BODY` or more that did not
    come whole within one read (gathered into a buffer of its own, in place)."""


def encode_frame(frame: ClientFrame) -> bytes:
    """The wire bytes of ``frame``.

    Raises LocalProtocolError when the kind is unknown, ``request_id`` is not a u32,
    ``meta`` is not a dict serialisable as strict JSON (no NaN/Infinity) or its
    encoding exceeds MAX_META_BYTES, or ``body`` is not bytes-like or exceeds a u32.
    The body is not checked against any reader's ``max_body``: that is the peer's.
    """
    kind, request_id, meta, body = frame
    return b"".join(encode_frame_parts(kind, request_id, meta, (body,)))


def encode_frame_parts(
    kind: ClientFrameKind, request_id: int, meta: dict[str, Any], body: Sequence[Buffer]
) -> list[Buffer]:
    """The wire bytes of a frame whose body is the concatenation of ``body``, as the
    header (with the meta) followed by the pieces themselves, not copied: a writer that
    takes several buffers at once sends a large body without joining it first (a
    RECEIVE of many large messages). Checks and errors as :func:`encode_frame`.
    """
    raw_kind: object = kind
    if isinstance(raw_kind, bool) or not isinstance(raw_kind, int):
        raise LocalProtocolError(f"cannot encode: unknown client frame kind {raw_kind!r}")
    known = _KIND_BY_VALUE.get(raw_kind)
    if known is None:
        raise LocalProtocolError(f"cannot encode: unknown client frame kind {raw_kind!r}")
    if type(request_id) is bool or not isinstance(request_id, int):
        raise LocalProtocolError(
            f"cannot encode: request_id must be an int, not {type(request_id).__name__}"
        )
    if not 0 <= request_id <= _U32_MAX:
        raise LocalProtocolError(f"cannot encode: request_id {request_id} does not fit in a u32")
    return _frame_parts(known, request_id, encode_meta(meta), body)


def encode_request_parts(request_id: int, meta_json: bytes, body: Buffer) -> list[Buffer]:
    """A REQUEST frame, as :func:`encode_frame` gives it once joined, whose meta
    ``meta_json`` was already encoded by :func:`encode_meta` (a client's SEND meta, the
    same for every message of a dialog and type, is encoded once), as its pieces: the
    header and meta, then the body, not copied (the SDK writes the pieces as they are,
    so a large body is copied only into the socket). Checks and errors as
    :func:`encode_frame`."""
    if type(request_id) is not int or not 0 <= request_id <= _U32_MAX:
        raise LocalProtocolError(f"cannot encode: request_id {request_id!r} is not a u32")
    return _frame_parts(ClientFrameKind.REQUEST, request_id, meta_json, (body,))


def encode_response_parts(
    request_id: int, meta_json: bytes, body: Sequence[Buffer]
) -> list[Buffer]:
    """A RESPONSE frame, as :func:`encode_frame_parts`, whose meta ``meta_json`` was
    already encoded by :func:`encode_meta` (a reply whose size was checked with the very
    bytes it sends: a RECEIVE's). ``request_id`` came from a REQUEST's header."""
    return _frame_parts(ClientFrameKind.RESPONSE, request_id, meta_json, body)


def _frame_parts(
    kind: ClientFrameKind, request_id: int, meta_bytes: bytes, body: Sequence[Buffer]
) -> list[Buffer]:
    if len(meta_bytes) > MAX_META_BYTES:
        raise LocalProtocolError(
            f"cannot encode: meta of {len(meta_bytes)} bytes exceeds the limit of {MAX_META_BYTES}"
        )
    body_size = 0
    for piece in body:
        if not isinstance(piece, bytes | bytearray | memoryview):
            raise LocalProtocolError(
                f"cannot encode: body must be bytes-like, not {type(piece).__name__}"
            )
        body_size += piece.nbytes if isinstance(piece, memoryview) else len(piece)
    if body_size > _U32_MAX:
        raise LocalProtocolError(f"cannot encode: body of {body_size} bytes does not fit a u32")
    header = _HEADER.pack(
        MAGIC, CLIENT_WIRE_VERSION, int(kind), request_id, len(meta_bytes), body_size
    )
    return [header + meta_bytes, *body]


def encode_sequence_reply(request_id: int, sequence_number: int) -> bytes:
    """``encode_frame(ClientFrame(RESPONSE, request_id, {"sequence_number": n}))``, the
    same bytes, built directly: the reply to every SEND, so it skips the general
    checks. ``request_id`` is a u32 (it came from a REQUEST's header) and
    ``sequence_number`` a 64-bit int."""
    meta = b'{"sequence_number":%d}' % sequence_number
    return _HEADER.pack(MAGIC, CLIENT_WIRE_VERSION, _RESPONSE, request_id, len(meta), 0) + meta


_RESPONSE = int(ClientFrameKind.RESPONSE)


class _Pending(NamedTuple):
    """The validated header of the frame being received."""

    kind: ClientFrameKind
    request_id: int
    meta_length: int
    body_length: int


@dataclass(slots=True)
class _LargeBody:
    """A frame whose header and meta arrived and whose large body is still coming: the
    body's own buffer, filled in place as the bytes arrive (every byte of it is written
    before the frame is handed out)."""

    kind: ClientFrameKind
    request_id: int
    meta: dict[str, Any]
    meta_length: int
    body: bytearray
    filled: int = 0


LARGE_BODY = 256 * 1024
"""A body at least this long is gathered into a buffer of its own as it arrives, not
appended to the reader's buffer: appending 1 MiB in 64 KiB reads reallocates and copies
the growing buffer again and again (1.4 ms a MiB alone). A reader fed through
:meth:`ClientFrameReader.get_buffer` has the socket write such a body in place: no copy
of it is made on this side of the kernel (docs/performance.md, "A large body read in
place on the client wire")."""

READ_SIZE = 256 * 1024
"""The size of a read buffer to give :meth:`ClientFrameReader.get_buffer`, for what is
not a large body: the event loop's own reads are as large."""


def read_buffer_in(store: object) -> memoryview:
    """The read buffer kept in ``store`` (the caller's ``threading.local()``), made there
    on first use: one of :data:`READ_SIZE` per thread serves every reader of the thread's
    event loop, which reads one connection at a time, each reader copying its bytes out
    before :meth:`ClientFrameReader.buffer_updated` returns; a buffer per connection
    would hold 256 KiB for each, logged in or not. (The store is the caller's: this
    module keeps no thread's state.)"""
    view: memoryview | None = getattr(store, "read_buffer", None)
    if view is None:
        view = memoryview(blank(READ_SIZE))
        setattr(store, "read_buffer", view)  # noqa: B010 (the store's type is the caller's)
    return view


class ClientFrameReader:
    """Incremental parser of a client-wire byte stream (one direction of one connection).

    :meth:`feed` returns every frame the bytes complete. Bytes are appended to one
    ``bytearray`` and consumed by an offset; consumed bytes are dropped once per
    ``feed`` (only the incomplete tail of that call's chunk remains to be moved), and
    the reader holds at most one partial frame plus the chunk being fed. A body of
    :data:`LARGE_BODY` or more is gathered into a buffer of its own, allocated once its
    header (within the limits) and meta are in. An ``asyncio.BufferedProtocol`` reads
    through :meth:`get_buffer` / :meth:`buffer_updated` instead of :meth:`feed`: such a
    body is then written by the socket in place, with no copy on this side of the kernel.

    On a protocol violation ``feed`` (or ``buffer_updated``) raises RemoteProtocolError
    whose ``events`` holds the frames completed earlier in the same call; the reader is
    then dead, its buffers released, and every later call raises again (as after
    :meth:`close`).
    """

    def __init__(self, max_body: int = DEFAULT_MAX_BODY, max_meta: int = MAX_META_BYTES) -> None:
        for name, value in (("max_body", max_body), ("max_meta", max_meta)):
            if type(value) is bool or not isinstance(value, int) or value < 0:
                raise LocalProtocolError(f"{name} must be a non-negative int, not {value!r}")
        self.max_body = max_body
        self.max_meta = min(max_meta, MAX_META_BYTES)
        """The largest meta accepted (a server keeps it small until the peer logs in)."""
        self._buffer = bytearray()
        self._pos = 0
        self._pending: _Pending | None = None
        self._failure: RemoteProtocolError | None = None
        self._large: _LargeBody | None = None
        self._missing = 0
        """Bytes of the large body still to come."""
        self._large_held = 0
        """Bytes of the large body's frame received so far (its header and meta too)."""
        self._spare: bytearray | None = None
        """A large body given back (:meth:`reuse`), for the next."""
        self._given: memoryview | None = None
        """The view the last :meth:`get_buffer` returned."""
        self._last_raw: bytes | None = None
        self._last_meta: dict[str, Any] = {}
        """The last small meta decoded, as it came and as decoded: a producer's pipelined
        SENDs on one dialog repeat it, and each gets a copy instead of a decoding."""
        self.meta_lengths: list[int] = []
        """The bytes each frame's meta took on the wire, for the frames the last
        :meth:`feed` or :meth:`buffer_updated` returned, in their order: a server counts
        what a request it holds takes (a meta may be up to :data:`MAX_META_BYTES`)."""

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet part of a returned frame."""
        return len(self._buffer) - self._pos + self._large_held

    @property
    def failed(self) -> bool:
        """True once a protocol violation has been seen; the reader is then dead."""
        return self._failure is not None

    def feed(self, data: bytes | bytearray | memoryview) -> list[ClientFrame]:
        """Feed bytes from the peer; returns the frames they complete, in order."""
        if self._failure is not None:
            raise RemoteProtocolError(
                f"client wire stream already failed: {self._failure}", self._failure.close_code
            )
        frames: list[ClientFrame] = []
        lengths: list[int] = []
        self.meta_lengths = lengths
        if self._large is not None:
            data = self._continue_large(data, frames)
            if not data:
                return frames
        buffer = self._buffer
        buffer += data
        pos = self._pos
        size = len(buffer)
        try:
            with memoryview(buffer) as view:
                while True:
                    pending = self._pending
                    if pending is None:
                        if size - pos < HEADER_SIZE:
                            break
                        # Validated as soon as complete: the limits are enforced before
                        # any of the frame's meta or body is waited for.
                        magic, version, raw_kind, request_id, meta_length, body_length = (
                            _HEADER.unpack_from(view, pos)
                        )
                        kind = _KIND_BY_VALUE.get(raw_kind)
                        if (
                            kind is None
                            or magic != MAGIC
                            or version != CLIENT_WIRE_VERSION
                            or meta_length > self.max_meta
                            or body_length > self.max_body
                        ):
                            raise self._header_error(view, pos)
                    else:
                        kind, request_id, meta_length, body_length = pending
                    meta_start = pos + HEADER_SIZE
                    body_start = meta_start + meta_length
                    end = body_start + body_length
                    if end > size:
                        if body_length >= LARGE_BODY and size >= body_start:
                            meta = _decode_meta(view[meta_start:body_start])
                            large = _LargeBody(
                                kind, request_id, meta, meta_length, self._body_buffer(body_length)
                            )
                            large.filled = size - body_start
                            large.body[: large.filled] = view[body_start:size]
                            self._large = large
                            self._missing = end - size
                            self._large_held = size - pos
                            self._pending = None
                            pos = size
                        elif pending is None:
                            self._pending = _Pending(kind, request_id, meta_length, body_length)
                        break
                    if meta_length > REPEATED_META_MOST:
                        meta = _decode_meta(view[meta_start:body_start])
                    else:
                        small = bytes(view[meta_start:body_start])
                        if small == self._last_raw:
                            meta = dict(self._last_meta)
                        else:
                            meta = _decode_meta(small)
                            if _flat(meta):  # a copy of it is then a decoding of its own
                                self._last_raw, self._last_meta = small, dict(meta)
                    body = bytes(view[body_start:end]) if body_length else b""
                    frames.append(ClientFrame(kind, request_id, meta, body))
                    lengths.append(meta_length)
                    self._pending = None
                    pos = end
        except RemoteProtocolError as exc:
            self._fail(exc)
            exc.events = list(frames)
            raise
        if pos:
            # Everything after pos arrived in this call (a frame completed in it), so
            # this moves at most one chunk; CPython drops a bytearray's head in O(1).
            del buffer[:pos]
            pos = 0
        self._pos = pos
        return frames

    def _continue_large(
        self, data: bytes | bytearray | memoryview, frames: list[ClientFrame]
    ) -> bytes | bytearray | memoryview:
        """The next piece of the large body being gathered, copied into its place; once
        the body is whole, its frame joins ``frames``. Returns what ``data`` holds
        beyond the body."""
        large = self._large
        assert large is not None
        take = min(len(data), self._missing)
        with memoryview(data) as view:
            large.body[large.filled : large.filled + take] = view[:take]
            rest = bytes(view[take:]) if take < len(data) else b""
        self._filled(take, frames)
        return rest

    def _filled(self, count: int, frames: list[ClientFrame]) -> None:
        """``count`` more bytes of the large body are in place; once it is whole, its
        frame joins ``frames``."""
        large = self._large
        assert large is not None
        large.filled += count
        self._missing -= count
        self._large_held += count
        if self._missing == 0:
            frames.append(ClientFrame(large.kind, large.request_id, large.meta, large.body))
            self.meta_lengths.append(large.meta_length)
            self._large = None
            self._large_held = 0

    def _body_buffer(self, length: int) -> bytearray:
        """A buffer for a large body of ``length`` bytes: the one given back by
        :meth:`reuse` when it is about as large, else a new one. RemoteProtocolError
        when there is no memory for it (refused as a body over the limit is)."""
        spare, self._spare = self._spare, None
        if spare is not None and length <= len(spare) < 2 * length:
            try:
                del spare[length:]  # less than half of it: CPython keeps the memory
                return spare
            except BufferError:  # a view of it is still held: it is not free after all
                pass
        try:
            return blank(length)
        except MemoryError:
            raise RemoteProtocolError(
                f"client frame body of {length} bytes: no memory to hold it",
                CloseCode.FRAME_TOO_LARGE,
            ) from None

    def reuse(self, buffer: bytearray) -> None:
        """``buffer``, the large body of a frame this reader returned, is no longer used by
        anyone: the next large body of about its size is read into it. A body of fresh
        memory costs a page fault and the kernel's zeroing of every 4 KiB page before the
        socket's copy into it (a consumer's RECEIVE replies of 64 MiB). One is kept,
        until the next large body or :meth:`close`."""
        if self._failure is None:
            self._spare = buffer

    def close(self) -> None:
        """The connection is gone: the buffers held for it (a large body being gathered, a
        buffer given back) are let go; the reader reads nothing more."""
        if self._failure is None:
            self._fail(RemoteProtocolError("client wire stream closed"))
        self._spare = None
        self._given = None

    # -- reading in place (asyncio.BufferedProtocol) ----------------------------------

    def get_buffer(self, read_buffer: memoryview) -> memoryview:
        """Where the socket's next bytes should go: the rest of the large body being
        gathered, in place, or else ``read_buffer``, the caller's (one of
        :data:`READ_SIZE` may serve every reader of a thread: what is read into it is
        copied out before :meth:`buffer_updated` returns). Pass the count read to
        :meth:`buffer_updated` before asking again."""
        large = self._large
        view = (
            memoryview(large.body)[large.filled :]
            if large is not None and self._failure is None
            else read_buffer
        )
        self._given = view
        return view

    def buffer_updated(self, nbytes: int) -> list[ClientFrame]:
        """``nbytes`` were written at the start of the last :meth:`get_buffer`'s view:
        the frames they complete, in order, as :meth:`feed` returns them."""
        given, self._given = self._given, None
        if given is None or not 0 <= nbytes <= len(given):
            raise LocalProtocolError("buffer_updated without a matching get_buffer")
        if self._failure is not None:
            return self.feed(b"")  # raises, as feed does once the reader is dead
        if self._large is None:  # the caller's read buffer
            return self.feed(given[:nbytes])
        frames: list[ClientFrame] = []
        self.meta_lengths = []
        self._filled(nbytes, frames)
        return frames

    def _header_error(self, view: memoryview, pos: int) -> RemoteProtocolError:
        """What is wrong with the header at ``pos``, which is known to break a rule."""
        magic, version, kind, _, meta_length, body_length = _HEADER.unpack_from(view, pos)
        if magic != MAGIC:
            return RemoteProtocolError(
                f"bad client frame magic {bytes(magic)!r} (expected {MAGIC!r})"
            )
        if version != CLIENT_WIRE_VERSION:
            return RemoteProtocolError(
                f"unsupported client wire version {version} (this side speaks "
                f"{CLIENT_WIRE_VERSION})",
                CloseCode.VERSION_MISMATCH,
            )
        frame_kind = _KIND_BY_VALUE.get(kind)
        if frame_kind is None:
            return RemoteProtocolError(f"unknown client frame kind {kind}")
        if meta_length > self.max_meta:
            return RemoteProtocolError(
                f"client frame meta of {meta_length} bytes exceeds the limit of {self.max_meta}",
                CloseCode.FRAME_TOO_LARGE,
            )
        return RemoteProtocolError(  # the only rule left
            f"client frame body of {body_length} bytes exceeds the limit of {self.max_body}",
            CloseCode.FRAME_TOO_LARGE,
        )

    def _fail(self, exc: RemoteProtocolError) -> None:
        self._failure = exc
        self._pending = None
        self._large = None
        self._missing = self._large_held = 0
        self._pos = 0
        self._buffer = bytearray()


REPEATED_META_MOST = 512
"""The largest meta a reader keeps to compare the next one with (a SEND's is about 120
bytes)."""
_SCALARS = frozenset((str, int, float, bool, type(None)))


def _flat(meta: dict[str, Any]) -> bool:
    """Whether every value of ``meta`` is a scalar: only then is a shallow copy of it a
    meta of its own, which no change a consumer makes to another frame's meta reaches."""
    return all(type(value) in _SCALARS for value in meta.values())


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def meta_size(meta: dict[str, Any]) -> int:
    """Bytes ``meta`` takes in a frame (raises like :func:`encode_frame` if it cannot)."""
    return len(encode_meta(meta))


def encode_meta(meta: dict[str, Any]) -> bytes:
    """``meta`` as a frame carries it: strict JSON. Raises LocalProtocolError when
    ``meta`` is not a dict serialisable as strict JSON (its size is the frame's check)."""
    if not isinstance(meta, dict):
        raise LocalProtocolError(
            f"cannot encode: meta must be a dict (a JSON object), not {type(meta).__name__}"
        )
    try:
        return _dumps(meta)
    except (TypeError, ValueError, RecursionError) as exc:
        # TypeError: unserialisable value or key; ValueError: NaN/Infinity, circular
        # reference, or a lone surrogate (UnicodeEncodeError); RecursionError: nesting.
        raise LocalProtocolError(f"cannot encode: meta is not JSON-serialisable: {exc}") from None


def _dumps(meta: dict[str, Any]) -> bytes:
    """Strict JSON of ``meta``: orjson, or the standard library where they could differ.

    orjson writes NaN and Infinity as ``null`` and refuses non-string keys and
    integers beyond 64 bits, so output containing ``null`` and anything orjson
    refuses go through :func:`json.dumps`, whose rules this format keeps.
    """
    try:
        fast = orjson.dumps(meta)
    except orjson.JSONEncodeError:
        fast = b"null"
    if b"null" not in fast:
        return fast
    text = json.dumps(meta, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")


_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGITS = b"0" * 19
"""19 digits in a row may be an integer beyond 64 bits, which orjson would read as a float.

They are found by turning every digit into ``0`` and looking for nineteen ``0`` in a row
(``bytes.translate`` and a substring search): a regular expression's ``\\d{19}`` tries
again at every digit of a run, and cost six times what orjson takes to decode a
RECEIVE reply's meta."""


def _has_long_digits(raw: bytes | memoryview) -> bool:
    return _LONG_DIGITS in bytes(raw).translate(_DIGITS_TO_ZERO)


_SEQUENCE_META = b'{"sequence_number":'
_SEQUENCE_DIGITS = slice(len(_SEQUENCE_META), -1)
_CLOSE_BRACE = ord("}")
_SEQUENCE_META_MOST = len(_SEQUENCE_META) + 19


def _decode_meta(raw: bytes | memoryview) -> dict[str, Any]:
    # A SEND's reply, exactly as encode_sequence_reply spells it (a producer reads one
    # for every message): up to 18 ASCII digits always fit a 64-bit integer.
    if (
        len(raw) <= _SEQUENCE_META_MOST
        and raw[: len(_SEQUENCE_META)] == _SEQUENCE_META
        and raw[len(raw) - 1] == _CLOSE_BRACE
    ):
        digits = bytes(raw[_SEQUENCE_DIGITS])
        if 0 < len(digits) <= 18 and digits.isdigit() and (digits[0] != 48 or len(digits) == 1):
            return {"sequence_number": int(digits)}
    if _has_long_digits(raw):
        return _decode_meta_exactly(raw)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _decode_meta_exactly(raw)  # the standard library says what is wrong
    if not isinstance(value, dict):
        raise RemoteProtocolError(
            f"client frame meta must be a JSON object, not {_json_type(value)}"
        )
    return value


def _decode_meta_exactly(raw: bytes | memoryview) -> dict[str, Any]:
    try:
        # Decoded explicitly: json.loads(bytes) would also accept UTF-16 and UTF-32.
        text = str(raw, "utf-8")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(
            f"client frame meta is not valid UTF-8: {exc.reason} at byte {exc.start}"
        ) from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise RemoteProtocolError(
            "client frame meta is not valid JSON: nested too deeply"
        ) from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, over-long integers
        raise RemoteProtocolError(f"client frame meta is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise RemoteProtocolError(
            f"client frame meta must be a JSON object, not {_json_type(value)}"
        )
    if "\\ud" in text or "\\uD" in text:  # an escaped surrogate: is it one of a pair?
        _refuse_lone_surrogates(value)
    return value


def _finite_float(literal: str) -> float:
    """A JSON number as a float; ValueError when it overflows to an infinity, which strict
    JSON cannot spell and :func:`encode_meta` refuses (as orjson does)."""
    value = float(literal)
    if value in (_INFINITY, -_INFINITY):
        raise ValueError(f"number {literal[:40]} is out of range")
    return value


_INFINITY = float("inf")


def _refuse_lone_surrogates(value: dict[str, Any]) -> None:
    """RemoteProtocolError when a string of ``value`` holds a lone surrogate (an escaped
    one, ``\\ud800``): no UTF-8 text holds it and :func:`encode_meta` refuses it, so it is
    refused as an encoded surrogate is."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise RemoteProtocolError(
            "client frame meta is not valid UTF-8: a lone surrogate"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise RemoteProtocolError(f"client frame meta is not valid JSON: {exc}") from None


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array"


def new_nonce(entropy: Callable[[int], bytes]) -> bytes:
    """A fresh 32-byte challenge nonce drawn from ``entropy`` (callers pass os.urandom)."""
    nonce = entropy(NONCE_SIZE)
    if not isinstance(nonce, bytes | bytearray) or len(nonce) != NONCE_SIZE:
        raise LocalProtocolError(f"entropy source did not return {NONCE_SIZE} bytes")
    return bytes(nonce)


def auth_proof(token: bytes, nonce: bytes, user: str) -> str:
    """Hex HMAC-SHA256 under ``token`` of ``b"brokerd-client-v1\\0" + user + b"\\0" + nonce``."""
    try:
        user_bytes = user.encode("utf-8")
    except UnicodeEncodeError:
        raise LocalProtocolError("user name is not encodable as UTF-8") from None
    message = b"".join((_PROOF_LABEL, user_bytes, b"\x00", nonce))
    return hmac.new(token, message, hashlib.sha256).hexdigest()


def check_proof(token: bytes, nonce: bytes, user: str, proof: object) -> bool:
    """True when ``proof`` is the proof of ``user`` for ``nonce`` under ``token``.

    Constant-time in the proof's content; False for anything but a str (the
    proof comes from peer-supplied JSON).
    """
    if not isinstance(proof, str):
        return False
    try:
        given = proof.encode("ascii")
    except UnicodeEncodeError:
        return False
    try:
        expected = auth_proof(token, nonce, user).encode("ascii")
    except LocalProtocolError:  # a user name carrying a lone surrogate
        return False
    return hmac.compare_digest(expected, given)
