"""Connection security: identities, certificate checks, key schedule, fragment protection.

Implements SPEC R-DLG-8 (MD5 signature of the content, encrypted with the
session key, checked by the receiver; a mismatch discards the frame unacknowledged)
and R-OBJ-7 (encryption ``required`` / ``supported`` / ``disabled``).

* Authentication: X.509 certificates issued by a deployment CA; the subject
  common name is the instance name. Proof of key possession is a signature over
  the handshake transcript (Ed25519, ECDSA with SHA-256, or RSA-PSS keys).
* Key schedule: ephemeral X25519, HKDF-SHA256 salted with a transcript hash,
  one AES-256-GCM key per direction.
* Protection of one frame with counter ``n`` (nonce = 4 zero bytes + n, big endian;
  associated data = the 22-byte frame header, so type, flags, length and counter
  are all authenticated):

  - encrypted: ``body = AEAD(md5(payload) || payload)``; the first 16 bytes of the
    body are the encrypted MD5 signature, the last 16 the AEAD tag.
  - signed only: ``body = AEAD(md5(payload), aad=header || payload) || payload``;
    the payload travels in clear, the 32-byte encrypted signature in front of it.

No I/O and no clock: the caller passes ``now`` for certificate validity.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.x509.oid import NameOID

from protocol.buffers import Buffer, blank
from protocol.digests import md5_each
from protocol.errors import CloseCode, HandshakeRefused, ProtocolError
from protocol.frames import (
    HEADER_SIZE,
    EncryptionMode,
    FrameFlags,
    FrameHeader,
    encode_header,
)

SigningKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

SIGNATURE_SIZE = 16
"""MD5 digest size; the encrypted signature adds a 16-byte AEAD tag."""
PROTECTION_OVERHEAD = 32
"""Bytes a protected body carries beyond its payload, in both modes."""
ENCRYPTED_FLAGS = int(FrameFlags.PROTECTED | FrameFlags.ENCRYPTED)
SIGNED_FLAGS = int(FrameFlags.PROTECTED)


class IntegrityError(ProtocolError):
    """A frame failed its integrity check; it is dropped, the connection goes on."""


@dataclass(frozen=True)
class Identity:
    """What one broker instance proves itself with, and whom it trusts."""

    certificate: x509.Certificate
    private_key: SigningKey
    trusted_cas: tuple[x509.Certificate, ...]
    certificate_der: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "certificate_der", self.certificate.public_bytes(serialization.Encoding.DER)
        )
        if not self.trusted_cas:
            raise ValueError("an identity needs at least one trusted CA certificate")

    @property
    def instance_name(self) -> str:
        return certificate_name(self.certificate)

    @classmethod
    def from_pem(cls, certificate_pem: bytes, key_pem: bytes, ca_pem: bytes) -> Identity:
        """Load an identity from PEM bytes (the caller reads the files)."""
        return cls(
            certificate=x509.load_pem_x509_certificate(certificate_pem),
            private_key=load_signing_key(key_pem),
            trusted_cas=tuple(x509.load_pem_x509_certificates(ca_pem)),
        )


def load_signing_key(key_pem: bytes) -> SigningKey:
    """A private key from PEM bytes, of a kind a handshake can sign with; ValueError."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(
        key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
    ):
        raise ValueError(f"unsupported private key type {type(key).__name__}")
    return key


def key_of(certificate: x509.Certificate, key: SigningKey) -> bool:
    """Whether ``key`` is the private key of ``certificate`` (their public keys agree): a
    handshake signed with another key never verifies at the peer."""
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    return key.public_key().public_bytes(der, spki) == certificate.public_key().public_bytes(
        der, spki
    )


def certificate_name(cert: x509.Certificate) -> str:
    """The instance name a certificate speaks for: its subject common name."""
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise ValueError("certificate subject must have exactly one common name")
    value = names[0].value
    return value if isinstance(value, str) else value.decode("utf-8")


def verify_peer_certificate(
    der: bytes, trusted_cas: Sequence[x509.Certificate], now: datetime
) -> x509.Certificate:
    """Accept a peer certificate only if a trusted CA issued it and it is valid at ``now``.

    The cryptography package parses certificate fields lazily and raises a variety
    of exceptions on hostile DER (ValueError, x509.InvalidVersion,
    UnsupportedAlgorithm, ...), from any field access: all of it runs under one
    deliberately wide guard, so a bad certificate is always a refusal.
    """
    try:
        return _verify_certificate(der, trusted_cas, now)
    except HandshakeRefused:
        raise
    except Exception as exc:
        raise HandshakeRefused(
            f"malformed peer certificate: {exc}", CloseCode.UNTRUSTED_CERTIFICATE
        ) from None


def _verify_certificate(
    der: bytes, trusted_cas: Sequence[x509.Certificate], now: datetime
) -> x509.Certificate:
    cert = x509.load_der_x509_certificate(der)
    name = certificate_name(cert)
    for ca in trusted_cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        break
    else:
        raise HandshakeRefused(
            f"certificate of {name!r} (issuer {cert.issuer.rfc4514_string()!r}) "
            "is not issued by a trusted CA",
            CloseCode.UNTRUSTED_CERTIFICATE,
        )
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise HandshakeRefused(
            f"certificate of {name!r} is not valid at {now.isoformat()} "
            f"(valid {cert.not_valid_before_utc.isoformat()} .. "
            f"{cert.not_valid_after_utc.isoformat()})",
            CloseCode.UNTRUSTED_CERTIFICATE,
        )
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is not None and constraints.ca:
        raise HandshakeRefused(
            f"certificate of {name!r} is a CA certificate, not an instance certificate",
            CloseCode.UNTRUSTED_CERTIFICATE,
        )
    return cert


def sign(key: SigningKey, data: bytes) -> bytes:
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(data)
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(data, ec.ECDSA(hashes.SHA256()))
    return key.sign(data, _PSS, hashes.SHA256())


def signature_valid(cert: x509.Certificate, signature: bytes, data: bytes) -> bool:
    public = cert.public_key()
    try:
        if isinstance(public, ed25519.Ed25519PublicKey):
            public.verify(signature, data)
        elif isinstance(public, ec.EllipticCurvePublicKey):
            public.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        elif isinstance(public, rsa.RSAPublicKey):
            public.verify(signature, data, _PSS, hashes.SHA256())
        else:
            return False
    except InvalidSignature:
        return False
    return True


_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.DIGEST_LENGTH)


def negotiate_encryption(initiator: EncryptionMode, acceptor: EncryptionMode) -> bool:
    """SPEC R-OBJ-7: encrypt unless one side disables it; required vs disabled is refused."""
    modes = {initiator, acceptor}
    if modes == {EncryptionMode.REQUIRED, EncryptionMode.DISABLED}:
        raise HandshakeRefused(
            f"encryption mode mismatch: initiator {initiator.name.lower()}, "
            f"acceptor {acceptor.name.lower()}",
            CloseCode.ENCRYPTION_MISMATCH,
        )
    return EncryptionMode.DISABLED not in modes


@dataclass(frozen=True)
class SessionKeys:
    initiator_to_acceptor: bytes
    acceptor_to_initiator: bytes


def derive_session_keys(shared_secret: bytes, transcript_hash: bytes) -> SessionKeys:
    """HKDF-SHA256 of the X25519 secret, salted with the transcript hash; one key per direction."""

    def expand(label: bytes) -> bytes:
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=transcript_hash, info=label).derive(
            shared_secret
        )

    return SessionKeys(
        initiator_to_acceptor=expand(b"brokerd/1 key initiator->acceptor"),
        acceptor_to_initiator=expand(b"brokerd/1 key acceptor->initiator"),
    )


def _nonce(counter: int) -> bytes:
    return b"\x00\x00\x00\x00" + counter.to_bytes(8, "big")


class FrameSealer:
    """Protects outgoing frames of one direction with its session key."""

    __slots__ = ("_aead", "encrypt", "flags", "version")

    def __init__(self, key: bytes, encrypt: bool, version: int) -> None:
        self._aead = AESGCM(key)
        self.encrypt = encrypt
        self.version = version
        self.flags = ENCRYPTED_FLAGS if encrypt else SIGNED_FLAGS

    def seal(self, frame_type: int, payload: Buffer, counter: int) -> bytes:
        """The whole frame (header + protected body) carrying ``payload``."""
        signature = hashlib.md5(payload, usedforsecurity=False).digest()
        if not self.encrypt:
            return self._signed(frame_type, payload, signature, counter)
        header = encode_header(
            self.version, frame_type, self.flags, len(payload) + PROTECTION_OVERHEAD, counter
        )
        return header + self._aead.encrypt(_nonce(counter), signature + payload, header)

    def seal_pieces(
        self, frame_type: int, pieces: Sequence[Buffer], counter: int
    ) -> bytes | bytearray:
        """The whole frame carrying the payload that ``pieces`` make once joined.

        A large payload's bytes are copied once, into the plaintext behind its
        signature, and encrypted once, into the frame: a fragment's header and its bytes
        need not be joined first (for 1 MiB of fragments, every copy saved is about
        0.1 ms). A small one is joined and sealed as :meth:`seal` does, which costs
        fewer Python calls."""
        if len(pieces) == 1 and (len(pieces[0]) < IN_PLACE_FROM or not self.encrypt):
            return self.seal(frame_type, pieces[0], counter)
        plain = _JOIN((_UNSIGNED, *pieces))
        if len(plain) - SIGNATURE_SIZE < IN_PLACE_FROM or not self.encrypt:
            return self.seal(frame_type, memoryview(plain)[SIGNATURE_SIZE:], counter)
        with memoryview(plain) as view:
            signature = hashlib.md5(view[SIGNATURE_SIZE:], usedforsecurity=False).digest()
        return self._encrypted_in_place(frame_type, plain, signature, counter)

    def seal_each(
        self, payloads: Sequence[tuple[int, Sequence[Buffer]]], counter: int
    ) -> list[Buffer]:
        """The frames carrying several payloads, each given as its frame type and its
        pieces (as :meth:`seal_pieces` takes them), numbered from ``counter``: their MD5
        signatures are taken together (:func:`protocol.digests.md5_each`, in SIMD
        lanes), then each frame is sealed as :meth:`seal_pieces` seals a large one."""
        if not self.encrypt:
            joined = [b"".join(pieces) for _, pieces in payloads]
            return [
                self._signed(payloads[n][0], payload, signature, counter + n)
                for n, (payload, signature) in enumerate(zip(joined, md5_each(joined), strict=True))
            ]
        plains = [_JOIN((_UNSIGNED, *pieces)) for _, pieces in payloads]
        views = [memoryview(plain)[SIGNATURE_SIZE:] for plain in plains]
        signatures = md5_each(views)
        for view in views:
            view.release()
        return [
            self._encrypted_in_place(payloads[n][0], plain, signature, counter + n)
            for n, (plain, signature) in enumerate(zip(plains, signatures, strict=True))
        ]

    def _signed(self, frame_type: int, payload: Buffer, signature: bytes, counter: int) -> bytes:
        """A signed-only frame: the payload in clear behind its encrypted signature."""
        header = encode_header(
            self.version, frame_type, self.flags, len(payload) + PROTECTION_OVERHEAD, counter
        )
        sealed_signature = self._aead.encrypt(_nonce(counter), signature, header + payload)
        return b"".join((header, sealed_signature, payload))

    def _encrypted_in_place(
        self, frame_type: int, plain: bytearray, signature: bytes, counter: int
    ) -> bytearray:
        """An encrypted frame of ``plain`` (the signature's place, then the payload), its
        signature written in and the whole encrypted straight into the frame."""
        plain[:SIGNATURE_SIZE] = signature
        header = encode_header(
            self.version, frame_type, self.flags, len(plain) + _TAG_SIZE, counter
        )
        frame = blank(HEADER_SIZE + len(plain) + _TAG_SIZE)  # every byte written below
        frame[:HEADER_SIZE] = header
        with memoryview(frame) as out:
            self._aead.encrypt_into(_nonce(counter), plain, header, out[HEADER_SIZE:])
        return frame


IN_PLACE_FROM = 16 * 1024
"""Bytes from which a payload is sealed in place (:meth:`FrameSealer.seal_pieces`) and a
frame opened where it lies, its payload handed on as a view of the opened plaintext
(:meth:`FrameOpener.open_view`). Below it a copy costs less than the views' calls."""
_JOIN = bytearray().join
_UNSIGNED = bytes(SIGNATURE_SIZE)
"""The place of the signature in a plaintext, filled once the payload is hashed."""
_TAG_SIZE = PROTECTION_OVERHEAD - SIGNATURE_SIZE
"""AES-GCM's authentication tag."""


class FrameOpener:
    """Checks and opens incoming frames of one direction; raises IntegrityError."""

    __slots__ = ("_aead", "encrypt", "flags")

    def __init__(self, key: bytes, encrypt: bool) -> None:
        self._aead = AESGCM(key)
        self.encrypt = encrypt
        self.flags = ENCRYPTED_FLAGS if encrypt else SIGNED_FLAGS

    def open(self, header: FrameHeader, header_bytes: bytes, body: Buffer) -> bytes:
        """The payload of a protected frame, after its AEAD tag and MD5 signature check out."""
        return bytes(self.open_view(header, header_bytes, body))  # bytes: not copied

    def open_view(self, header: FrameHeader, header_bytes: bytes, body: Buffer) -> Buffer:
        """As :meth:`open`; a large payload as a view of the opened plaintext, not copied
        (a FRAGMENTS frame's fragments are copied out of it once each)."""
        signature, payload = self.unseal(header, header_bytes, body)
        if hashlib.md5(payload, usedforsecurity=False).digest() != signature:
            raise IntegrityError(MD5_MISMATCH)
        return payload

    def unseal(
        self, header: FrameHeader, header_bytes: bytes, body: Buffer
    ) -> tuple[Buffer, Buffer]:
        """The MD5 signature and the payload of a protected frame whose flags and AEAD
        tag check out; the caller compares the signature with the payload's MD5
        (:meth:`open_view`, or several frames' at once: :func:`protocol.digests.md5_each`)
        and raises :class:`IntegrityError` (:data:`MD5_MISMATCH`) if they differ."""
        if header.flags != self.flags:
            raise IntegrityError(
                f"frame flags {header.flags:#04x} do not match the negotiated protection "
                f"{self.flags:#04x}"
            )
        if len(body) < PROTECTION_OVERHEAD:
            raise IntegrityError(f"protected body of {len(body)} bytes is too short")
        nonce = _nonce(header.counter)
        try:
            if self.encrypt:
                plain = self._aead.decrypt(nonce, body, header_bytes)
                signature = plain[:SIGNATURE_SIZE]
                payload = (
                    plain[SIGNATURE_SIZE:]
                    if len(plain) < IN_PLACE_FROM
                    else memoryview(plain)[SIGNATURE_SIZE:]
                )
            else:
                view = memoryview(body)
                payload = view[PROTECTION_OVERHEAD:]
                signature = self._aead.decrypt(
                    nonce, view[:PROTECTION_OVERHEAD], header_bytes + payload
                )
        except InvalidTag:
            raise IntegrityError(
                "authentication tag mismatch (frame altered or wrong key)"
            ) from None
        return signature, payload


MD5_MISMATCH = "MD5 signature mismatch"
"""The reason of a frame whose payload's MD5 is not its signature (R-DLG-8)."""
