"""The adjacent-broker connection: handshake and frame exchange as one sans-I/O state machine.

SPEC R-PROTO-1/2 (the adjacent broker protocol under the dialog protocol),
R-OBJ-7 (encryption modes), R-DLG-8 (integrity). Bytes in, events out; events in,
bytes out; no sockets, no clock (``now`` is passed in), no threads.

The four handshake messages (HELLO, HELLO_REPLY, PROOF, WELCOME), their checks and
the session keys are ``protocol.handshake``'s; the numbering, sealing and opening of
every frame is ``protocol.session``'s. This module reads frames off the byte stream,
decides which frame may come in which state, turns opened frames into events and
events into frames.

Transitions (state, role, frame type received) -> handler; anything not in the
table is a RemoteProtocolError. CLOSE is accepted in every state but CLOSED::

    START       ACCEPTOR   HELLO        -> SENT_REPLY   (send HELLO_REPLY)
    SENT_HELLO  INITIATOR  HELLO_REPLY  -> SENT_PROOF   (send PROOF)
    SENT_REPLY  ACCEPTOR   PROOF        -> OPEN         (send WELCOME; HandshakeComplete)
    SENT_PROOF  INITIATOR  WELCOME      -> OPEN         (HandshakeComplete)
    OPEN        both       FRAGMENT, ACK, KEEPALIVE, PRINCIPAL_QUERY, PRINCIPAL_ANSWER, MIRROR,
                           FRAGMENTS (version 2 on: one Fragment event per payload)
    any         both       CLOSE        -> CLOSED       (Close event)

In OPEN, a frame that fails its integrity check (altered, replayed, reordered,
from another connection) yields an IntegrityFailure event and is dropped; the
connection goes on. A damaged header (CRC), bad magic, an unknown frame type or an
oversized length is fatal: the stream cannot be re-synchronised.

Errors: ``receive_data`` raises RemoteProtocolError (or its subclass
HandshakeRefused) when the peer broke the protocol; the connection is then CLOSED,
a CLOSE frame for the peer waits in ``data_to_send()``, and the events decoded
before the failure in the same call are on the exception's ``events`` attribute.
``send`` raises LocalProtocolError for our own mistakes.

May import: ``protocol.handshake``, ``protocol.session`` and the modules below them
(``frames``, ``security``, ``events``, ``buffers``, ``errors``).
"""

from __future__ import annotations

import enum
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509

from protocol import digests, frames
from protocol.buffers import Buffer
from protocol.errors import (
    CloseCode,
    LocalProtocolError,
    RemoteProtocolError,
)
from protocol.events import (
    Ack,
    Close,
    Event,
    Fragment,
    HandshakeComplete,
    IntegrityFailure,
    Keepalive,
    Mirror,
    PrincipalAnswer,
    PrincipalQuery,
    SendableEvent,
)
from protocol.frames import (
    HEADER_SIZE,
    EncryptionMode,
    FrameHeader,
    FrameType,
    MirrorRole,
)
from protocol.handshake import HANDSHAKE_MAX_FRAME_SIZE, Handshake
from protocol.security import (
    IN_PLACE_FROM,
    MD5_MISMATCH,
    PROTECTION_OVERHEAD,
    Identity,
    IntegrityError,
)
from protocol.session import Session


class Role(enum.Enum):
    INITIATOR = "initiator"
    ACCEPTOR = "acceptor"


class State(enum.Enum):
    START = "start"
    SENT_HELLO = "sent_hello"
    SENT_REPLY = "sent_reply"
    SENT_PROOF = "sent_proof"
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True)
class ConnectionSettings:
    """One side's parameters for a connection."""

    identity: Identity
    encryption: EncryptionMode = EncryptionMode.REQUIRED
    max_frame_size: int = frames.DEFAULT_MAX_FRAME_SIZE
    """Largest frame body this side accepts; announced to the peer in the handshake."""
    versions: tuple[int, ...] = frames.PROTOCOL_VERSIONS
    expected_peer: str | None = None
    """If set, the peer's certificate must name this instance."""
    max_integrity_failures: int = 64
    """Integrity failures tolerated on one connection before it is closed."""
    fragments_per_frame: int = frames.MAX_FRAGMENTS_PER_FRAME
    """Fragments one FRAGMENTS frame may carry (version 2); 1 sends each in a FRAGMENT
    frame of its own, as version 1 does."""

    def __post_init__(self) -> None:
        if self.max_frame_size < frames.MIN_MAX_FRAME_SIZE:
            raise ValueError(f"max_frame_size must be at least {frames.MIN_MAX_FRAME_SIZE}")
        if not self.versions or any(v not in frames.PROTOCOL_VERSIONS for v in self.versions):
            raise ValueError(f"versions must be a non-empty subset of {frames.PROTOCOL_VERSIONS}")
        if not 1 <= self.fragments_per_frame <= frames.MAX_FRAGMENTS_PER_FRAME:
            raise ValueError(
                f"fragments_per_frame must be between 1 and {frames.MAX_FRAGMENTS_PER_FRAME}"
            )


@dataclass
class ConnectionStats:
    """Counters for the broker_connections view (SPEC R-PROTO-3)."""

    frames_sent: int = 0
    frames_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    fragments_sent: int = 0
    """Dialog message fragments sent (a FRAGMENTS frame carries several)."""
    fragments_received: int = 0
    """Dialog message fragments received and opened (a FRAGMENTS frame carries several)."""
    integrity_failures: int = 0


_Handler = Callable[["BrokerConnection", FrameHeader, bytes, bytes, list[Event]], None]


_GATHERED_BELOW = 4096
"""Reads shorter than this are copied into the pending frame's buffer, not kept as
they came (:meth:`BrokerConnection._keep`)."""


class BrokerConnection:
    """One adjacent-broker connection, either side, as a sans-I/O state machine."""

    def __init__(
        self,
        role: Role,
        settings: ConnectionSettings,
        now: datetime,
        entropy: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.role = role
        self.settings = settings
        self.now = now
        self.state = State.START
        self.stats = ConnectionStats()
        self.close_code: CloseCode | None = None
        self.close_reason: str | None = None
        self._session = Session(settings.versions, self.stats)
        self._handshake = Handshake(role is Role.INITIATOR, settings, self._session, entropy)
        self._pending: list[Buffer] = []
        """The bytes of an incomplete frame, as they came: joined once it is whole."""
        self._pending_size = 0
        self._need = HEADER_SIZE
        self._outbox = bytearray()

    @property
    def peer_instance(self) -> str | None:
        """The peer's instance name, once its certificate checked out."""
        return self._handshake.peer_instance

    @property
    def peer_certificate(self) -> x509.Certificate | None:
        return self._handshake.peer_certificate

    @property
    def peer_max_frame_size(self) -> int:
        """Largest frame body the peer accepts, as it announced in the handshake."""
        return self._handshake.peer_max_frame_size

    @property
    def version(self) -> int | None:
        """The agreed protocol version, once the session keys are installed."""
        return self._session.version

    @property
    def encrypted(self) -> bool | None:
        """Whether payloads are encrypted (or only signed), once the keys are installed."""
        return self._session.encrypted

    # ------------------------------------------------------------------ public API

    def start(self) -> bytes:
        """Initiator: the HELLO that opens the handshake. Acceptor: nothing (it waits)."""
        if self.state is not State.START:
            raise LocalProtocolError(f"start() in state {self.state.value}")
        if self.role is Role.ACCEPTOR:
            return b""
        hello = self._handshake.hello()
        self.state = State.SENT_HELLO
        return hello

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the peer; returns the events they complete, in order."""
        if self.state is State.CLOSED:
            return []
        if type(data) is not bytes:
            data = bytes(data)  # payload slices handed up must be immutable
        self.stats.bytes_received += len(data)
        events: list[Event] = []
        pos = 0
        head = b""
        if self._pending:
            buffered = self._pending_size
            missing = self._need - buffered
            if len(data) < missing:
                self._keep(data)
                return []
            pending = self._pending
            self._pending = []
            self._pending_size = 0
            if buffered < HEADER_SIZE:  # a header split across reads: join them
                pending.append(data)
                data = b"".join(pending)
            else:
                # Complete the pending frame from the head of ``data`` and parse the rest
                # where it is: only the frame that straddled reads is copied, once.
                pending.append(memoryview(data)[:missing])
                head = b"".join(pending)
                pos = missing
        batch: list[_Unsealed] = []
        try:
            if head and self._frames(head, 0, events, batch) < 0:
                return events
            pos = self._frames(data, pos, events, batch)
            if batch:
                self._open_batch(batch, events)
            if pos < 0:
                return events
        except RemoteProtocolError as exc:
            self._fail(exc)
            exc.events = events
            raise
        size = len(data)
        if pos < size:
            if not pos:
                self._keep(data)
            elif 2 * pos <= size:  # a view keeps the whole read: at most twice the rest
                self._keep(memoryview(data)[pos:])
            else:
                self._keep(data[pos:])
            # The header of the pending frame is validated as soon as it is complete,
            # so an oversized length is refused before its body is buffered.
            limit = (
                self.settings.max_frame_size
                if self.state is State.OPEN
                else HANDSHAKE_MAX_FRAME_SIZE
            )
            self._need = (
                HEADER_SIZE + frames.decode_header(data, limit, pos).length
                if size - pos >= HEADER_SIZE
                else HEADER_SIZE
            )
        return events

    def _frames(self, data: bytes, pos: int, events: list[Event], batch: list[_Unsealed]) -> int:
        """Handle the whole frames of ``data`` from ``pos``; where the first incomplete
        one starts, or -1 once the connection has closed.

        Where MD5 runs in lanes, large FRAGMENT(S) frames are decrypted as they come and
        gathered in ``batch``, their signatures checked together (:meth:`_open_batch`)
        before any other frame is handled, and by the caller at the end of the read."""
        size = len(data)
        opened_limit = self.settings.max_frame_size
        view: memoryview | None = None
        lanes = digests.lanes()
        while size - pos >= HEADER_SIZE:
            limit = opened_limit if self.state is State.OPEN else HANDSHAKE_MAX_FRAME_SIZE
            header = frames.decode_header(data, limit, pos)
            start = pos + HEADER_SIZE
            end = start + header.length
            if end > size:
                break
            header_bytes = data[pos:start]
            pos = end
            self.stats.frames_received += 1
            if self.state is State.OPEN and header.frame_type in _OPEN_TYPE_VALUES:
                # The common case skips the general dispatch's enum and table lookup; a
                # large frame is opened where it lies in ``data``, not copied out first.
                if header.length < IN_PLACE_FROM:
                    if batch:
                        self._open_batch(batch, events)
                    self._on_open_frame(header, header_bytes, data[start:end], events)
                    continue
                if view is None:
                    view = memoryview(data)
                if lanes and header.frame_type in _LANE_TYPES:
                    unsealed = self._unseal(header, header_bytes, view[start:end])
                    batch.append(unsealed)
                    if isinstance(unsealed[3], RemoteProtocolError):
                        self._open_batch(batch, events)  # raises, after the frames before
                    continue
                if batch:
                    self._open_batch(batch, events)
                self._on_open_frame(header, header_bytes, view[start:end], events)
                continue
            if batch:
                self._open_batch(batch, events)
            self._dispatch(header, header_bytes, data[start:end], events)
            if self.closed:
                return -1
        return pos

    def _unseal(self, header: FrameHeader, header_bytes: bytes, body: Buffer) -> _Unsealed:
        """A large FRAGMENT(S) frame decrypted, its signature not checked yet; a frame
        that fails its other checks carries its error."""
        try:
            signature, payload = self._session.unseal(header, header_bytes, body)
        except (IntegrityError, RemoteProtocolError) as exc:
            return (header, b"", b"", exc)
        return (header, signature, payload, _MD5_PENDING)

    def _open_batch(self, batch: list[_Unsealed], events: list[Event]) -> None:
        """Check the signatures of the gathered frames at once, then handle each frame in
        order as :meth:`_on_open_frame` would: its fragments, or its integrity failure."""
        unsealed = [payload for _, _, payload, error in batch if error is _MD5_PENDING]
        signatures = iter(digests.md5_each(unsealed))
        gathered = batch[:]
        batch.clear()
        for header, signature, payload, error in gathered:
            if error is _MD5_PENDING:
                if next(signatures) != signature:
                    self._integrity_failure(header, MD5_MISMATCH, events)
                    continue
                self._frame_events(header, payload, events)
            elif isinstance(error, IntegrityError):
                self._integrity_failure(header, str(error), events)
            else:
                raise error

    def data_to_send(self) -> bytes:
        """Bytes the connection produced by itself (handshake replies, refusals).

        ``send`` and ``close`` prepend these too, so the wire order is always right
        whichever the caller writes first."""
        out = bytes(self._outbox)
        self._outbox.clear()
        return out

    def send(self, event: SendableEvent) -> bytes:
        """Frame one event for the peer; raises LocalProtocolError if not allowed now."""
        if isinstance(event, Fragment):
            frame = self._send_protected(FrameType.FRAGMENT, event.payload)
            self.stats.fragments_sent += 1
            return frame
        if isinstance(event, Ack):
            return self._send_protected(FrameType.ACK, event.payload)
        if isinstance(event, Mirror):
            return self._send_protected(FrameType.MIRROR, event.payload)
        if isinstance(event, Keepalive):
            return self._send_protected(
                FrameType.KEEPALIVE, frames.encode_body(FrameType.KEEPALIVE, {})
            )
        if isinstance(event, PrincipalQuery):
            body = frames.encode_body(
                FrameType.PRINCIPAL_QUERY,
                {
                    "query_id": event.query_id,
                    "broker_instance": event.broker_instance.bytes,
                    "service": event.service,
                    "epoch": event.epoch,
                },
            )
            return self._send_protected(FrameType.PRINCIPAL_QUERY, body)
        if isinstance(event, PrincipalAnswer):
            body = frames.encode_body(
                FrameType.PRINCIPAL_ANSWER,
                {
                    "query_id": event.query_id,
                    "role": int(event.role),
                    "broker_instance": event.broker_instance.bytes,
                    "service": event.service,
                    "epoch": event.epoch,
                },
            )
            return self._send_protected(FrameType.PRINCIPAL_ANSWER, body)
        if isinstance(event, Close):
            return self.close(event.code, event.reason)
        raise LocalProtocolError(f"cannot send {type(event).__name__}")

    def send_fragments(self, payloads: Sequence[frames.SizedPayload]) -> list[Buffer]:
        """The frames carrying several FRAGMENT payloads, in order: on a version 2
        connection as few FRAGMENTS frames as the peer's frame limit allows (one seal,
        signature and header for many small fragments), otherwise, and for a payload
        alone, one FRAGMENT each. An empty payload, which a FRAGMENTS frame may not carry
        (each of its entries is a byte or more), always goes in a FRAGMENT frame of its own.

        Where MD5 runs in SIMD lanes (:mod:`protocol.digests`), a payload of
        :data:`IN_PLACE_FROM` bytes or more goes in a FRAGMENT frame of its own, and the
        signatures of the call's large frames are taken together: several 64 KiB
        frames hash at once faster than one frame of all their bytes.

        Each payload is given as the pieces it is made of and its size (a fragment's
        header, then its bytes: :func:`protocol.dialog.fragment_pieces`); they are joined
        once, into the frame's plaintext."""
        per_frame = self.settings.fragments_per_frame
        planned: list[_Planned]
        if (
            len(payloads) == 1
            or per_frame == 1
            or self.version is None
            or self.version < frames.FRAGMENTS_VERSION
        ):
            planned = [(_FRAGMENT, pieces, size) for pieces, size in payloads]
        else:
            limit = self.max_payload_size
            alone_from = IN_PLACE_FROM if digests.lanes() else limit + 1
            planned = []
            batch: list[frames.SizedPayload] = []
            total = 0
            for payload in payloads:
                size = payload[1]
                if size >= alone_from or not size:  # an empty one is no FRAGMENTS entry
                    if batch:
                        planned.append(_planned_batch(batch, total))
                        batch, total = [], 0
                    planned.append((_FRAGMENT, payload[0], size))
                    continue
                cost = 4 + size
                if batch and (total + cost > limit or len(batch) == per_frame):
                    planned.append(_planned_batch(batch, total))
                    batch, total = [], 0
                batch.append(payload)
                total += cost
            if batch:
                planned.append(_planned_batch(batch, total))
        out = self._seal_planned(planned)
        self.stats.fragments_sent += len(payloads)
        if self._outbox:
            out.insert(0, self.data_to_send())
        return out

    def _seal_planned(self, planned: list[_Planned]) -> list[Buffer]:
        """The frames of ``planned``, in order; consecutive large ones sealed together
        where MD5 runs in lanes."""
        if len(planned) < 2 or not digests.lanes():
            return [self._protect(*plan) for plan in planned]
        out: list[Buffer] = []
        run: list[tuple[int, Sequence[Buffer]]] = []
        for frame_type, pieces, size in planned:
            if size >= IN_PLACE_FROM:
                self._check_sendable(frame_type, size)
                run.append((frame_type, pieces))
                continue
            if run:
                out.extend(self._session.seal_each(run))
                run = []
            out.append(self._protect(frame_type, pieces, size))
        if run:
            out.extend(self._session.seal_each(run))
        return out

    def close(self, code: CloseCode = CloseCode.NORMAL, reason: str = "") -> bytes:
        """The CLOSE frame that ends this connection (empty if already closed)."""
        if self.state is State.CLOSED:
            return b""
        frame = self._close_frame(code, reason)
        out = self.data_to_send() + frame
        self._closed(code, reason)
        return out

    # ----------------------------------------------------------------- receiving

    def _dispatch(
        self, header: FrameHeader, header_bytes: bytes, body: bytes, events: list[Event]
    ) -> None:
        frame_type = FrameType(header.frame_type)
        if frame_type is FrameType.CLOSE:
            self._on_close(header, header_bytes, body, events)
            return
        handler = _TRANSITIONS.get((self.state, self.role, frame_type))
        if handler is None:
            raise RemoteProtocolError(
                f"unexpected {frame_type.name} frame in state {self.state.value} "
                f"({self.role.value})"
            )
        handler(self, header, header_bytes, body, events)

    def _on_hello(
        self, header: FrameHeader, header_bytes: bytes, body: bytes, events: list[Event]
    ) -> None:
        self._outbox += self._handshake.on_hello(header, header_bytes, body, self.now)
        self.state = State.SENT_REPLY

    def _on_hello_reply(
        self, header: FrameHeader, header_bytes: bytes, body: bytes, events: list[Event]
    ) -> None:
        self._outbox += self._handshake.on_hello_reply(header, header_bytes, body, self.now)
        self.state = State.SENT_PROOF

    def _on_proof(
        self, header: FrameHeader, header_bytes: bytes, body: bytes, events: list[Event]
    ) -> None:
        self._outbox += self._handshake.on_proof(header, header_bytes, body)
        self._opened(events)

    def _on_welcome(
        self, header: FrameHeader, header_bytes: bytes, body: bytes, events: list[Event]
    ) -> None:
        self._handshake.on_welcome(header, header_bytes, body)
        self._opened(events)

    def _on_open_frame(
        self, header: FrameHeader, header_bytes: bytes, body: Buffer, events: list[Event]
    ) -> None:
        try:
            opened = self._session.open_view(header, header_bytes, body)
        except IntegrityError as exc:
            self._integrity_failure(header, str(exc), events)
            return
        self._frame_events(header, opened, events)

    def _frame_events(self, header: FrameHeader, opened: Buffer, events: list[Event]) -> None:
        """The events of a protected frame that checked out."""
        frame_type = header.frame_type
        if frame_type == FrameType.FRAGMENTS:
            if self.version is None or self.version < frames.FRAGMENTS_VERSION:
                raise RemoteProtocolError(f"FRAGMENTS frame on a version {self.version} connection")
            parts = frames.decode_fragments(opened)
            self.stats.fragments_received += len(parts)
            events.extend(Fragment(part) for part in parts)
            return
        payload = bytes(opened)  # a small payload is bytes already: not copied
        if frame_type == FrameType.FRAGMENT:
            self.stats.fragments_received += 1
            events.append(Fragment(payload))
        elif frame_type == FrameType.ACK:
            events.append(Ack(payload))
        elif frame_type == FrameType.MIRROR:
            events.append(Mirror(payload))
        elif frame_type == FrameType.KEEPALIVE:
            frames.decode_body(FrameType.KEEPALIVE, payload)
            events.append(Keepalive())
        elif frame_type == FrameType.PRINCIPAL_QUERY:
            q = frames.decode_body(FrameType.PRINCIPAL_QUERY, payload)
            events.append(
                PrincipalQuery(q.query_id, uuid.UUID(bytes=q.broker_instance), q.service, q.epoch)
            )
        else:
            a = frames.decode_body(FrameType.PRINCIPAL_ANSWER, payload)
            try:
                role = MirrorRole(a.role)
            except ValueError:
                raise RemoteProtocolError(f"unknown mirror role {a.role}") from None
            events.append(
                PrincipalAnswer(
                    a.query_id, role, uuid.UUID(bytes=a.broker_instance), a.service, a.epoch
                )
            )

    def _on_close(
        self, header: FrameHeader, header_bytes: bytes, body: bytes, events: list[Event]
    ) -> None:
        """A CLOSE in OPEN must be protected (else it could be injected); before OPEN a
        refusal may travel in clear, or sealed if the peer already held keys."""
        if self.state is State.OPEN or (header.flags != 0 and self._session.keyed):
            try:
                payload = self._session.open(header, header_bytes, body)
            except IntegrityError as exc:
                if self.state is not State.OPEN:
                    raise RemoteProtocolError(f"CLOSE frame failed its check: {exc}") from None
                self._integrity_failure(header, str(exc), events)
                return
        else:
            self._session.check_clear(header)
            payload = body
        value = frames.decode_body(FrameType.CLOSE, payload)
        try:
            code = CloseCode(value.code)
        except ValueError:
            code = CloseCode.PROTOCOL_ERROR
        events.append(Close(code, value.reason))
        self._closed(code, value.reason)

    # -------------------------------------------------------------- internals

    def _opened(self, events: list[Event]) -> None:
        self.state = State.OPEN
        assert self.peer_instance is not None
        assert self.version is not None and self.encrypted is not None
        events.append(
            HandshakeComplete(
                self.peer_instance, self.version, self.encrypted, self.peer_max_frame_size
            )
        )

    def _integrity_failure(self, header: FrameHeader, reason: str, events: list[Event]) -> None:
        self.stats.integrity_failures += 1
        events.append(IntegrityFailure(header.frame_type, header.counter, reason))
        if self.stats.integrity_failures > self.settings.max_integrity_failures:
            raise RemoteProtocolError(
                f"{self.stats.integrity_failures} frames failed their integrity check",
                CloseCode.INTEGRITY,
            )

    def _fail(self, exc: RemoteProtocolError) -> None:
        if self.state is not State.CLOSED:
            self._outbox += self._close_frame(exc.close_code, str(exc))
            self._closed(exc.close_code, str(exc))
        self._drop_pending()

    def _closed(self, code: CloseCode, reason: str) -> None:
        self.state = State.CLOSED
        self.close_code = code
        self.close_reason = reason
        self._drop_pending()

    def _keep(self, data: Buffer) -> None:
        """Hold ``data``, the next bytes of an incomplete frame. Small reads are gathered
        into one buffer, so that a peer writing a frame a few bytes at a time costs the
        bytes, not an object each."""
        pending = self._pending
        if len(data) >= _GATHERED_BELOW:
            pending.append(data)
        elif pending and type(pending[-1]) is bytearray:
            pending[-1] += data
        else:
            pending.append(bytearray(data))
        self._pending_size += len(data)

    def _drop_pending(self) -> None:
        self._pending = []
        self._pending_size = 0
        self._need = HEADER_SIZE

    def _close_frame(self, code: CloseCode, reason: str) -> bytes:
        reason_bytes = reason.encode("utf-8", "replace")[: frames.MAX_REASON_BYTES]
        body = frames.encode_body(
            FrameType.CLOSE,
            {"code": int(code), "reason": reason_bytes.decode("utf-8", "ignore")},
        )
        if self.state is State.OPEN or self.state is State.SENT_PROOF:
            return self._session.seal(FrameType.CLOSE, body)
        # Before a version is agreed a refusal carries the frozen HELLO version, which
        # every peer of every version reads.
        version = self.version or frames.HELLO_VERSION
        return self._session.clear_frame(FrameType.CLOSE, body, version)

    def _send_protected(self, frame_type: FrameType, payload: bytes) -> bytes:
        self._check_sendable(frame_type, len(payload))
        frame = self._session.seal(frame_type, payload)
        return self.data_to_send() + frame if self._outbox else frame

    def _protect(self, frame_type: int, pieces: Sequence[Buffer], size: int) -> Buffer:
        """The protected frame of the payload ``pieces`` make (``size`` bytes joined)."""
        self._check_sendable(frame_type, size)
        return self._session.seal_pieces(frame_type, pieces)

    def _check_sendable(self, frame_type: int, size: int) -> None:
        if self.state is not State.OPEN:
            raise LocalProtocolError(
                f"cannot send {FrameType(frame_type).name} in state {self.state.value}: "
                "the handshake has not completed"
            )
        if size + PROTECTION_OVERHEAD > self.peer_max_frame_size:
            raise LocalProtocolError(
                f"{FrameType(frame_type).name} payload of {size} bytes exceeds the peer's "
                f"frame limit of {self.peer_max_frame_size - PROTECTION_OVERHEAD}"
            )

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for an incomplete frame; never above HEADER_SIZE + max_frame_size
        once receive_data returns. The memory they take is at most about twice that: the
        read a frame's first bytes came in may be kept whole while it is at most twice
        them."""
        return self._pending_size

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    @property
    def max_payload_size(self) -> int:
        """Largest FRAGMENT/ACK payload the peer accepts (valid once OPEN)."""
        return self.peer_max_frame_size - PROTECTION_OVERHEAD


_Planned = tuple[int, Sequence[Buffer], int]
"""A frame to seal: its type, its payload's pieces and the payload's size."""
_FRAGMENT = int(FrameType.FRAGMENT)
_FRAGMENTS = int(FrameType.FRAGMENTS)


def _planned_batch(batch: list[frames.SizedPayload], size: int) -> _Planned:
    if len(batch) == 1:
        return (_FRAGMENT, *batch[0])
    return (_FRAGMENTS, frames.fragments_pieces(batch), size)


_OPEN_TYPES = (
    FrameType.FRAGMENT,
    FrameType.FRAGMENTS,
    FrameType.ACK,
    FrameType.KEEPALIVE,
    FrameType.PRINCIPAL_QUERY,
    FrameType.PRINCIPAL_ANSWER,
    FrameType.MIRROR,
)
_OPEN_TYPE_VALUES = frozenset(int(t) for t in _OPEN_TYPES)
_LANE_TYPES = frozenset((_FRAGMENT, _FRAGMENTS))
"""Frames whose signatures a read checks together (large ones, where MD5 runs in lanes)."""
_MD5_PENDING = IntegrityError("signature not checked yet")
_Unsealed = tuple[FrameHeader, Buffer, Buffer, Exception]
"""A frame decrypted in a read's batch: its header, signature, payload, and
:data:`_MD5_PENDING` or the error it failed with."""
_TRANSITIONS: dict[tuple[State, Role, FrameType], _Handler] = {
    (State.START, Role.ACCEPTOR, FrameType.HELLO): BrokerConnection._on_hello,
    (State.SENT_HELLO, Role.INITIATOR, FrameType.HELLO_REPLY): BrokerConnection._on_hello_reply,
    (State.SENT_REPLY, Role.ACCEPTOR, FrameType.PROOF): BrokerConnection._on_proof,
    (State.SENT_PROOF, Role.INITIATOR, FrameType.WELCOME): BrokerConnection._on_welcome,
    **{
        (State.OPEN, role, frame_type): BrokerConnection._on_open_frame
        for role in Role
        for frame_type in _OPEN_TYPES
    },
}
"""The transition table described in the module docstring; CLOSE is handled apart."""
