"""Dialog security: end-to-end keys per dialog, as Service Broker's dialog security (R-DLG-14).

Each service that takes part in secured dialogs has a key pair (EC P-256) and a
certificate from the deployment CA; each side knows the other service's
certificate (a *remote service binding*).

* **Key exchange.** The initiator draws a random 32-byte dialog key and sends it
  with its messages until the target has answered, in the security trailer of
  their headers (``KEY_EXCHANGE``, 185 bytes)::

      ephemeral (65: uncompressed P-256 point) | wrapped (48) | u64 made_at | signature (64)

  ``wrapped`` = AES-256-GCM(KEK, nonce 0, dialog key), KEK = HKDF-SHA256 of
  ECDH(ephemeral, target service key), salted with the conversation id, with the
  two service names as info: only the target service can unwrap it. ``made_at`` is
  when the exchange was made, in milliseconds since the Unix epoch (UTC): a target
  takes a dialog's first message only with an exchange younger than the time it keeps
  a closed endpoint, so that a first message recorded and replayed after the target
  has removed the dialog begins nothing (SPEC §5, R-DLG-4); the initiator makes its
  exchange again while it waits that long. ``signature`` = ECDSA-SHA256 by the
  initiator service's key over the conversation id, both service names,
  ``ephemeral``, ``wrapped`` and ``made_at``: only the initiator service can have made
  it.
* **Protection.** From the dialog key, HKDF-SHA256 derives one AES-256-GCM key per
  direction. Every header of the dialog (a message fragment, a dedicated
  acknowledgement, a broker error) carries a fresh random 12-byte nonce and a
  16-byte tag: the body is encrypted (same length), and the associated data is
  the whole header as encoded with hop count 0 and a zero tag, so the
  conversation id, direction, sequence number, fragment position, message type,
  flags, lifetime, the piggybacked acknowledgement and the key exchange are all
  authenticated. Forwarders change only the hop count.

No I/O and no clock: randomness comes from the caller's ``entropy`` (default
``os.urandom``) and times from the caller, so golden vectors are reproducible.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import NamedTuple

import construct as c
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import (
    decode_dss_signature,
    encode_dss_signature,
)
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from protocol.buffers import Buffer
from protocol.dialog import (
    FLAG_INITIATOR,
    FLAG_SECURED,
    NONCE_SIZE,
    TAG_SIZE,
    DialogHeader,
    Security,
    encode_header,
)
from protocol.errors import ProtocolError

KEY_SIZE = 32
POINT_SIZE = 65
WRAPPED_SIZE = KEY_SIZE + TAG_SIZE
SIGNATURE_SIZE = 64
"""The signature travels as r || s, 32 bytes each (fixed size, unlike DER)."""

KEY_EXCHANGE = c.Struct(
    "ephemeral" / c.Bytes(POINT_SIZE),
    "wrapped" / c.Bytes(WRAPPED_SIZE),
    "made_at" / c.Int64ub,
    "signature" / c.Bytes(SIGNATURE_SIZE),
    c.Terminated,
)
"""The key exchange a secured dialog's first messages carry (185 bytes)."""
KEY_EXCHANGE_SIZE = POINT_SIZE + WRAPPED_SIZE + 8 + SIGNATURE_SIZE
MAX_MADE_AT = 2**63 - 1
"""The latest ``made_at`` (milliseconds since the Unix epoch) an exchange may carry."""

_ZERO_TAG = bytes(TAG_SIZE)
_ZERO_NONCE = bytes(NONCE_SIZE)


class DialogSecurityError(ProtocolError):
    """A secured dialog frame or key exchange failed its check; it is refused, not applied."""


def _require_p256(key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) -> None:
    if not isinstance(key.curve, ec.SECP256R1):
        raise DialogSecurityError(f"service keys must be EC P-256, not {key.curve.name}")


def _signed_bytes(
    conversation_id: uuid.UUID,
    from_service: str,
    to_service: str,
    ephemeral: bytes,
    wrapped: bytes,
    made_at: int,
) -> bytes:
    names = from_service.encode() + b"\0" + to_service.encode()
    return (
        b"brokerd dialog key v2\0"
        + conversation_id.bytes
        + names
        + b"\0"
        + ephemeral
        + wrapped
        + made_at.to_bytes(8, "big")
    )


def _kek(shared: bytes, conversation_id: uuid.UUID, from_service: str, to_service: str) -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(),
        length=KEY_SIZE,
        salt=conversation_id.bytes,
        info=b"brokerd dialog key wrap\0" + from_service.encode() + b"\0" + to_service.encode(),
    ).derive(shared)


def make_key_exchange(
    conversation_id: uuid.UUID,
    from_service: str,
    to_service: str,
    dialog_key: bytes,
    initiator_key: ec.EllipticCurvePrivateKey,
    target_public: ec.EllipticCurvePublicKey,
    made_at: int,
    entropy: Callable[[int], bytes] = os.urandom,
) -> bytes:
    """The initiator's key exchange for ``dialog_key`` (KEY_EXCHANGE bytes), made at
    ``made_at`` (milliseconds since the Unix epoch)."""
    if len(dialog_key) != KEY_SIZE:
        raise DialogSecurityError("a dialog key is 32 bytes")
    if not 0 <= made_at <= MAX_MADE_AT:
        raise DialogSecurityError(f"made_at {made_at} is not a time in milliseconds")
    _require_p256(initiator_key)
    _require_p256(target_public)
    ephemeral_key = ec.derive_private_key(
        int.from_bytes(entropy(32), "big") % (2**256 - 2**224) + 1, ec.SECP256R1()
    )
    ephemeral = ephemeral_key.public_key().public_bytes(
        Encoding.X962, PublicFormat.UncompressedPoint
    )
    kek = _kek(
        ephemeral_key.exchange(ec.ECDH(), target_public), conversation_id, from_service, to_service
    )
    wrapped = AESGCM(kek).encrypt(_ZERO_NONCE, dialog_key, None)
    der = initiator_key.sign(
        _signed_bytes(conversation_id, from_service, to_service, ephemeral, wrapped, made_at),
        ec.ECDSA(hashes.SHA256()),
    )
    r, s = decode_dss_signature(der)
    signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    return bytes(
        KEY_EXCHANGE.build(
            dict(ephemeral=ephemeral, wrapped=wrapped, made_at=made_at, signature=signature)
        )
    )


class OpenedExchange(NamedTuple):
    """What a key exchange carries, checked: the dialog key and when it was made
    (milliseconds since the Unix epoch, by the initiator's clock)."""

    dialog_key: bytes
    made_at: int

    def age(self, now: int) -> float:
        """Seconds since it was made, at ``now`` (milliseconds since the Unix epoch);
        negative when the initiator's clock is ahead."""
        return (now - self.made_at) / 1000


def open_key_exchange(
    blob: bytes,
    conversation_id: uuid.UUID,
    from_service: str,
    to_service: str,
    target_key: ec.EllipticCurvePrivateKey,
    initiator_public: ec.EllipticCurvePublicKey,
) -> OpenedExchange:
    """The dialog key ``blob`` carries and when it was made, after checking the initiator
    service's signature; DialogSecurityError if it is malformed, not signed by that
    service, or not for this target service. How old an exchange may be is the caller's
    to judge (:meth:`OpenedExchange.age`)."""
    if len(blob) != KEY_EXCHANGE_SIZE:
        raise DialogSecurityError(
            f"key exchange of {len(blob)} bytes (expected {KEY_EXCHANGE_SIZE})"
        )
    parsed = KEY_EXCHANGE.parse(blob)
    ephemeral, wrapped, signature = parsed.ephemeral, parsed.wrapped, parsed.signature
    made_at = int(parsed.made_at)
    der = encode_dss_signature(
        int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
    )
    try:
        initiator_public.verify(
            der,
            _signed_bytes(conversation_id, from_service, to_service, ephemeral, wrapped, made_at),
            ec.ECDSA(hashes.SHA256()),
        )
    except InvalidSignature:
        raise DialogSecurityError(
            f"the key exchange is not signed by the certificate bound to {from_service!r}"
        ) from None
    try:
        point = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), ephemeral)
        shared = target_key.exchange(ec.ECDH(), point)
    except ValueError:
        raise DialogSecurityError("the key exchange's ephemeral key is not a P-256 point") from None
    kek = _kek(shared, conversation_id, from_service, to_service)
    try:
        return OpenedExchange(AESGCM(kek).decrypt(_ZERO_NONCE, wrapped, None), made_at)
    except InvalidTag:
        raise DialogSecurityError(
            f"the dialog key is not wrapped for this service's key ({to_service!r})"
        ) from None


class _Directions(NamedTuple):
    from_initiator: AESGCM
    from_target: AESGCM


def _direction_keys(dialog_key: bytes) -> _Directions:
    def expand(label: bytes) -> AESGCM:
        return AESGCM(
            HKDF(algorithm=hashes.SHA256(), length=KEY_SIZE, salt=None, info=label).derive(
                dialog_key
            )
        )

    return _Directions(
        expand(b"brokerd dialog initiator->target"), expand(b"brokerd dialog target->initiator")
    )


class DialogKeys:
    """Seals and opens the headers and bodies of one dialog under its dialog key."""

    __slots__ = ("_keys", "key")

    def __init__(self, dialog_key: bytes) -> None:
        if len(dialog_key) != KEY_SIZE:
            raise DialogSecurityError("a dialog key is 32 bytes")
        self.key = dialog_key
        self._keys = _direction_keys(dialog_key)

    def _aead(self, header: DialogHeader) -> AESGCM:
        keys = self._keys
        return keys.from_initiator if header.flags & FLAG_INITIATOR else keys.from_target

    def seal(
        self,
        header: DialogHeader,
        body: Buffer,
        key_exchange: bytes = b"",
        entropy: Callable[[int], bytes] = os.urandom,
    ) -> tuple[DialogHeader, bytes]:
        """``header`` (unsecured) and its plaintext ``body`` (b"" for an acknowledgement),
        secured: the header with the SECURED flag and trailer, and the encrypted body."""
        nonce = entropy(NONCE_SIZE)
        pending = header._replace(
            flags=header.flags | FLAG_SECURED,
            security=Security(nonce, _ZERO_TAG, key_exchange),
        )
        associated = encode_header(pending._replace(hop_count=0))
        sealed = self._aead(header).encrypt(nonce, body, associated)
        cut = len(sealed) - TAG_SIZE
        return pending._replace(security=Security(nonce, sealed[cut:], key_exchange)), sealed[:cut]

    def open(self, header: DialogHeader, body: bytes) -> bytes:
        """The plaintext of a secured ``header`` and ``body``; DialogSecurityError if the
        header is not secured or anything covered was altered or sealed with another key."""
        sec = header.security
        if sec is None:
            raise DialogSecurityError("the dialog is secured, but this frame is not")
        associated = encode_header(
            header._replace(hop_count=0, security=sec._replace(tag=_ZERO_TAG))
        )
        try:
            return self._aead(header).decrypt(sec.nonce, body + sec.tag, associated)
        except InvalidTag:
            raise DialogSecurityError(
                "dialog authentication failed (altered on the way, or not sealed with "
                "this dialog's key)"
            ) from None
