"""The numbered frames of one adjacent-broker connection, and its session keys.

Each direction counts its frames from 0, from the first HELLO on. Until the handshake
installs the session keys (:meth:`Session.install`) frames travel in clear: a clear
frame must carry the exact next counter, no protection flags and a version this side
accepts. After, each frame is sealed under the sending direction's key and opened
under the receiving one's (``protocol.security``: AES-256-GCM, the MD5 signature of
R-DLG-8), in the version the handshake agreed; a counter below the next expected one
is a replay or a reordering, an integrity failure (gaps are allowed: a frame that
failed its check was dropped). The handshake (``protocol.handshake``) and the open
connection (``protocol.connection``) both frame through a :class:`Session`.

May import: ``protocol.frames``, ``protocol.security``, ``protocol.buffers``,
``protocol.errors``. Sans-I/O like the rest of ``protocol/``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from protocol import frames
from protocol.buffers import Buffer
from protocol.errors import CloseCode, RemoteProtocolError
from protocol.frames import FrameHeader, FrameType
from protocol.security import FrameOpener, FrameSealer, IntegrityError


class SentCounters(Protocol):
    """Where the frames and bytes sent are counted (``ConnectionStats``)."""

    frames_sent: int
    bytes_sent: int


class Session:
    """One connection's frame counters in each direction and, once the handshake has
    installed them, its session keys and agreed version."""

    def __init__(self, versions: tuple[int, ...], counters: SentCounters) -> None:
        self.version: int | None = None
        """The agreed protocol version, once the keys are installed."""
        self.encrypted: bool | None = None
        """Whether payloads are encrypted (or only signed), once the keys are installed."""
        self._versions = versions
        self._counters = counters
        self._send_counter = 0
        self._recv_next = 0
        self._sealer: FrameSealer | None = None
        self._opener: FrameOpener | None = None

    @property
    def keyed(self) -> bool:
        """Whether the session keys are installed (frames can be opened)."""
        return self._opener is not None

    def install(self, send_key: bytes, recv_key: bytes, version: int, encrypted: bool) -> None:
        """From now on seal under ``send_key`` and open under ``recv_key``, in ``version``."""
        self._sealer = FrameSealer(send_key, encrypted, version)
        self._opener = FrameOpener(recv_key, encrypted)
        self.version = version
        self.encrypted = encrypted

    # ------------------------------------------------------------------ sending

    def clear_frame(self, frame_type: FrameType, body: bytes, version: int) -> bytes:
        """The unprotected frame carrying ``body`` (the handshake's, a refusal)."""
        frame = frames.encode_header(version, frame_type, 0, len(body), self._send_counter) + body
        self._sent(frame)
        return frame

    def seal(self, frame_type: FrameType, payload: bytes) -> bytes:
        """The protected frame carrying ``payload``."""
        assert self._sealer is not None
        frame = self._sealer.seal(frame_type, payload, self._send_counter)
        self._sent(frame)
        return frame

    def seal_pieces(self, frame_type: int, pieces: Sequence[Buffer]) -> Buffer:
        """The protected frame of the payload ``pieces`` make once joined."""
        assert self._sealer is not None
        frame = self._sealer.seal_pieces(frame_type, pieces, self._send_counter)
        self._sent(frame)
        return frame

    def seal_each(self, payloads: Sequence[tuple[int, Sequence[Buffer]]]) -> list[Buffer]:
        """The protected frames of several payloads (each as its frame type and its
        pieces), numbered in order, their MD5 signatures taken together."""
        assert self._sealer is not None
        out = self._sealer.seal_each(payloads, self._send_counter)
        for frame in out:
            self._sent(frame)
        return out

    def _sent(self, frame: Buffer) -> None:
        self._send_counter += 1
        counters = self._counters
        counters.frames_sent += 1
        counters.bytes_sent += len(frame)

    # ---------------------------------------------------------------- receiving

    def check_clear(self, header: FrameHeader, version: int | None = None) -> None:
        """Unprotected frames: exact counter, no protection flags, the expected version
        (HELLO: the frozen HELLO_VERSION; HELLO_REPLY: the version it chooses; later
        clear CLOSEs: one this side speaks)."""
        if header.flags != 0:
            raise RemoteProtocolError(f"clear frame with protection flags {header.flags:#x}")
        if header.counter != self._recv_next:
            raise RemoteProtocolError(
                f"clear frame counter {header.counter}, expected {self._recv_next}"
            )
        if version is not None and header.version != version:
            raise RemoteProtocolError(
                f"frame version {header.version}, expected {version}", CloseCode.VERSION_MISMATCH
            )
        if (
            version is None
            and header.version not in self._versions
            and header.version != frames.HELLO_VERSION
        ):
            raise RemoteProtocolError(
                f"frame version {header.version} not spoken here", CloseCode.VERSION_MISMATCH
            )
        self._recv_next += 1

    def open(self, header: FrameHeader, header_bytes: bytes, body: bytes) -> bytes:
        """Verify a protected frame: version, counter (replay/reorder), AEAD tag, MD5 signature."""
        return bytes(self.open_view(header, header_bytes, body))  # bytes: not copied

    def open_view(self, header: FrameHeader, header_bytes: bytes, body: Buffer) -> Buffer:
        """As :meth:`open`; a large payload as a view of the opened plaintext."""
        self._check_header(header)
        assert self._opener is not None
        payload = self._opener.open_view(header, header_bytes, body)
        self._recv_next = header.counter + 1
        return payload

    def unseal(
        self, header: FrameHeader, header_bytes: bytes, body: Buffer
    ) -> tuple[Buffer, Buffer]:
        """As :meth:`open_view`, but the MD5 signature is returned with the payload, not
        compared (several frames' are compared at once: ``BrokerConnection``). The frame
        counts as received: a frame whose signature then fails is not accepted again
        under its counter (it is a replay)."""
        self._check_header(header)
        assert self._opener is not None
        opened = self._opener.unseal(header, header_bytes, body)
        self._recv_next = header.counter + 1
        return opened

    def _check_header(self, header: FrameHeader) -> None:
        if header.version != self.version:
            raise RemoteProtocolError(
                f"frame version {header.version} after negotiating {self.version}",
                CloseCode.VERSION_MISMATCH,
            )
        if header.counter < self._recv_next:
            raise IntegrityError(
                f"replayed or reordered frame: counter {header.counter}, "
                f"expected at least {self._recv_next}"
            )
