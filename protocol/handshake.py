"""The adjacent-broker handshake: who the peer is, what both speak, and the session keys.

SPEC R-PROTO-1/2, R-OBJ-7 (encryption modes). ``I`` = initiator, ``A`` = acceptor;
counters per direction from 0 (``protocol.session``)::

    I -> A  HELLO        versions, name, random, X25519 key, encryption mode,
                         max frame size, certificate                 (clear)
    A -> I  HELLO_REPLY  chosen version, name, random, X25519 key, mode, encrypted?,
                         max frame size, certificate; signature over
                         T(ctx_A, HELLO frame, reply core)                  (clear)
            both derive keys: HKDF(X25519 secret, salt=T(ctx_salt, HELLO frame, reply core))
    I -> A  PROOF        signature over T(ctx_I, HELLO frame, HELLO_REPLY frame)
                                                                    (protected)
    A -> I  WELCOME      (protected; confirms A's keys)

    T(ctx, parts...) = SHA-256(ctx || len(part) u32 || part || ...)

Either side refuses with an unprotected CLOSE carrying a CloseCode and a reason
(``HandshakeRefused``): an untrusted or expired certificate, a name that does not
match the certificate, a failed proof of key possession, no common version, required
vs disabled. The connection (``protocol.connection``) decides which message may come
in which state and sends what :class:`Handshake` returns; the handshake checks the
messages, keeps the transcript and installs the keys in the connection's
:class:`~protocol.session.Session`.

May import: ``protocol.frames``, ``protocol.security``, ``protocol.session``,
``protocol.errors``. Sans-I/O: ``now`` (certificate validity) and the entropy source
are passed in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from protocol import frames
from protocol.errors import CloseCode, HandshakeRefused, RemoteProtocolError
from protocol.frames import EncryptionMode, FrameHeader, FrameType
from protocol.security import (
    Identity,
    IntegrityError,
    certificate_name,
    derive_session_keys,
    negotiate_encryption,
    sign,
    signature_valid,
    verify_peer_certificate,
)
from protocol.session import Session

_ACCEPTOR_CONTEXT = b"brokerd handshake v1: acceptor signature\x00"
_INITIATOR_CONTEXT = b"brokerd handshake v1: initiator signature\x00"
_SALT_CONTEXT = b"brokerd handshake v1: key salt\x00"


_NAME = 2 + frames.MAX_NAME_BYTES
_CERTIFICATE = 2 + frames.MAX_CERTIFICATE_BYTES
_MAX_HELLO_BODY = (1 + 2 * frames.MAX_VERSIONS) + _NAME + (32 + 32 + 1 + 4) + _CERTIFICATE
"""versions, instance name, (random, ephemeral key, encryption, max frame size), certificate"""
_MAX_REPLY_CORE = 2 + _NAME + (32 + 32 + 1 + 1 + 4) + _CERTIFICATE
"""version, instance name, (random, ephemeral key, encryption, encrypted, max frame size),
certificate"""
_MAX_HELLO_REPLY_BODY = 2 + _MAX_REPLY_CORE + 2 + frames.MAX_SIGNATURE_BYTES

HANDSHAKE_MAX_FRAME_SIZE = max(_MAX_HELLO_BODY, _MAX_HELLO_REPLY_BODY)
"""Largest frame body accepted before the handshake completes: the largest handshake
frame the bounds of its fields allow (a HELLO_REPLY with a 16 KiB certificate, a name of
1024 bytes and a 1024-byte signature: 18,512 bytes; SPEC R-PROTO-2). An unauthenticated
peer can make this side buffer no more, and a peer whose certificate is within its bound
(16,384 bytes) is never refused as too large."""


class HandshakeSettings(Protocol):
    """What the handshake reads of one side's ``ConnectionSettings``."""

    @property
    def identity(self) -> Identity: ...

    @property
    def encryption(self) -> EncryptionMode: ...

    @property
    def max_frame_size(self) -> int: ...

    @property
    def versions(self) -> tuple[int, ...]: ...

    @property
    def expected_peer(self) -> str | None: ...


class Handshake:
    """One side's part in the handshake: its ephemeral key and random, the transcript,
    and what it learns of the peer."""

    def __init__(
        self,
        initiator: bool,
        settings: HandshakeSettings,
        session: Session,
        entropy: Callable[[int], bytes],
    ) -> None:
        self.peer_instance: str | None = None
        """The peer's instance name, as its certificate gives it (once checked)."""
        self.peer_certificate: x509.Certificate | None = None
        self.peer_max_frame_size = frames.MIN_MAX_FRAME_SIZE
        """Largest frame body the peer accepts, as it announced."""
        self._initiator = initiator
        self._settings = settings
        self._session = session
        self._ephemeral = X25519PrivateKey.from_private_bytes(entropy(32))
        self._random = entropy(32)
        self._hello_frame = b""
        self._reply_core = b""
        self._reply_frame = b""

    def hello(self) -> bytes:
        """Initiator: the HELLO frame that opens the handshake."""
        settings = self._settings
        identity = settings.identity
        body = frames.encode_body(
            FrameType.HELLO,
            {
                "versions": list(settings.versions),
                "instance_name": identity.instance_name,
                "random": self._random,
                "ephemeral_key": self._ephemeral.public_key().public_bytes_raw(),
                "encryption": int(settings.encryption),
                "max_frame_size": settings.max_frame_size,
                "certificate": identity.certificate_der,
            },
        )
        self._hello_frame = self._session.clear_frame(FrameType.HELLO, body, frames.HELLO_VERSION)
        return self._hello_frame

    def on_hello(
        self, header: FrameHeader, header_bytes: bytes, body: bytes, now: datetime
    ) -> bytes:
        """Acceptor: check the HELLO, install the keys; the HELLO_REPLY frame to send."""
        session = self._session
        settings = self._settings
        session.check_clear(header, frames.HELLO_VERSION)
        hello = frames.decode_body(FrameType.HELLO, body)
        self._hello_frame = header_bytes + body
        common = sorted(set(hello.versions) & set(settings.versions))
        if not common:
            raise HandshakeRefused(
                f"no common protocol version: peer offers {list(hello.versions)}, "
                f"this broker speaks {list(settings.versions)}",
                CloseCode.VERSION_MISMATCH,
            )
        version = common[-1]
        peer_mode = _mode(hello.encryption)
        encrypted = negotiate_encryption(peer_mode, settings.encryption)
        peer_cert = self._authenticate_peer(hello.certificate, hello.instance_name, now)
        self._set_peer_frame_limit(hello.max_frame_size)
        shared = self._exchange(hello.ephemeral_key)
        identity = settings.identity
        self._reply_core = frames.encode_reply_core(
            {
                "version": version,
                "instance_name": identity.instance_name,
                "random": self._random,
                "ephemeral_key": self._ephemeral.public_key().public_bytes_raw(),
                "encryption": int(settings.encryption),
                "encrypted": int(encrypted),
                "max_frame_size": settings.max_frame_size,
                "certificate": identity.certificate_der,
            }
        )
        signature = sign(
            identity.private_key,
            _transcript(_ACCEPTOR_CONTEXT, self._hello_frame, self._reply_core),
        )
        body_out = frames.encode_body(
            FrameType.HELLO_REPLY, {"core": self._reply_core, "signature": signature}
        )
        self._reply_frame = session.clear_frame(FrameType.HELLO_REPLY, body_out, version)
        self._establish(shared, version, encrypted, peer_cert)
        return self._reply_frame

    def on_hello_reply(
        self, header: FrameHeader, header_bytes: bytes, body: bytes, now: datetime
    ) -> bytes:
        """Initiator: check the HELLO_REPLY, install the keys; the PROOF frame to send."""
        settings = self._settings
        reply = frames.decode_body(FrameType.HELLO_REPLY, body)
        core = frames.decode_reply_core(reply.core)
        self._session.check_clear(header, core.version)
        self._reply_core = reply.core
        self._reply_frame = header_bytes + body
        if core.version not in settings.versions:
            raise HandshakeRefused(
                f"acceptor chose protocol version {core.version}, which was not offered",
                CloseCode.VERSION_MISMATCH,
            )
        encrypted = negotiate_encryption(settings.encryption, _mode(core.encryption))
        if core.encrypted not in (0, 1) or bool(core.encrypted) != encrypted:
            raise HandshakeRefused(
                f"acceptor decided encrypted={bool(core.encrypted)} but the modes give "
                f"encrypted={encrypted}",
                CloseCode.ENCRYPTION_MISMATCH,
            )
        peer_cert = self._authenticate_peer(core.certificate, core.instance_name, now)
        _require_signature(
            peer_cert,
            reply.signature,
            _transcript(_ACCEPTOR_CONTEXT, self._hello_frame, self._reply_core),
            f"acceptor {core.instance_name!r}",
        )
        self._set_peer_frame_limit(core.max_frame_size)
        self._establish(self._exchange(core.ephemeral_key), core.version, encrypted, peer_cert)
        signature = sign(
            settings.identity.private_key,
            _transcript(_INITIATOR_CONTEXT, self._hello_frame, self._reply_frame),
        )
        return self._session.seal(
            FrameType.PROOF, frames.encode_body(FrameType.PROOF, {"signature": signature})
        )

    def on_proof(self, header: FrameHeader, header_bytes: bytes, body: bytes) -> bytes:
        """Acceptor: check the initiator's proof; the WELCOME frame to send."""
        payload = self._open_handshake(header, header_bytes, body, "initiator")
        proof = frames.decode_body(FrameType.PROOF, payload)
        assert self.peer_certificate is not None
        _require_signature(
            self.peer_certificate,
            proof.signature,
            _transcript(_INITIATOR_CONTEXT, self._hello_frame, self._reply_frame),
            f"initiator {self.peer_instance!r}",
        )
        return self._session.seal(FrameType.WELCOME, frames.encode_body(FrameType.WELCOME, {}))

    def on_welcome(self, header: FrameHeader, header_bytes: bytes, body: bytes) -> None:
        """Initiator: the WELCOME confirms the acceptor's keys."""
        payload = self._open_handshake(header, header_bytes, body, "acceptor")
        frames.decode_body(FrameType.WELCOME, payload)

    # -------------------------------------------------------------- internals

    def _open_handshake(
        self, header: FrameHeader, header_bytes: bytes, body: bytes, who: str
    ) -> bytes:
        """A protected handshake frame (PROOF, WELCOME) must open: it proves the keys."""
        try:
            return self._session.open(header, header_bytes, body)
        except IntegrityError as exc:
            raise HandshakeRefused(
                f"{who} failed to prove the session key: {exc}", CloseCode.AUTHENTICATION_FAILED
            ) from None

    def _authenticate_peer(
        self, certificate_der: bytes, claimed_name: str, now: datetime
    ) -> x509.Certificate:
        settings = self._settings
        cert = verify_peer_certificate(certificate_der, settings.identity.trusted_cas, now)
        cert_name = certificate_name(cert)
        if cert_name != claimed_name:
            raise HandshakeRefused(
                f"peer calls itself {claimed_name!r} but its certificate names {cert_name!r}",
                CloseCode.PEER_NAME_MISMATCH,
            )
        expected = settings.expected_peer
        if expected is not None and cert_name != expected:
            raise HandshakeRefused(
                f"expected instance {expected!r}, peer is {cert_name!r}",
                CloseCode.PEER_NAME_MISMATCH,
            )
        self.peer_instance = cert_name
        self.peer_certificate = cert
        return cert

    def _set_peer_frame_limit(self, limit: int) -> None:
        if limit < frames.MIN_MAX_FRAME_SIZE:
            raise RemoteProtocolError(
                f"peer frame limit {limit} is below the minimum {frames.MIN_MAX_FRAME_SIZE}"
            )
        self.peer_max_frame_size = limit

    def _exchange(self, peer_ephemeral: bytes) -> bytes:
        """The X25519 shared secret; refuses low-order or malformed keys."""
        try:
            return self._ephemeral.exchange(X25519PublicKey.from_public_bytes(peer_ephemeral))
        except ValueError as exc:
            raise HandshakeRefused(
                f"bad ephemeral key: {exc}", CloseCode.AUTHENTICATION_FAILED
            ) from None

    def _establish(
        self, shared: bytes, version: int, encrypted: bool, peer_cert: x509.Certificate
    ) -> None:
        keys = derive_session_keys(
            shared, _transcript(_SALT_CONTEXT, self._hello_frame, self._reply_core)
        )
        if self._initiator:
            send_key, recv_key = keys.initiator_to_acceptor, keys.acceptor_to_initiator
        else:
            send_key, recv_key = keys.acceptor_to_initiator, keys.initiator_to_acceptor
        self._session.install(send_key, recv_key, version, encrypted)
        self.peer_certificate = peer_cert


def _transcript(context: bytes, *parts: bytes) -> bytes:
    digest = hashlib.sha256(context)
    for part in parts:
        digest.update(len(part).to_bytes(4, "big"))
        digest.update(part)
    return digest.digest()


def _require_signature(cert: x509.Certificate, signature: bytes, data: bytes, who: str) -> None:
    """Proof of key possession: the peer's transcript signature must verify."""
    if not signature_valid(cert, signature, data):
        raise HandshakeRefused(
            f"{who} failed to prove possession of its certificate key (bad handshake signature)",
            CloseCode.AUTHENTICATION_FAILED,
        )


def _mode(value: int) -> EncryptionMode:
    try:
        return EncryptionMode(value)
    except ValueError:
        raise RemoteProtocolError(f"unknown encryption mode {value}") from None
