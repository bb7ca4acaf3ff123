"""Edges of the wire formats: what a hostile or broken peer may send, at the bounds the
protocol reference gives (docs/protocol.md §2.3, §2.7b, §2.9), and what the client wire
must refuse (R-CLIENT-1: strict JSON meta).

SPEC R-PROTO-1, R-PROTO-2, R-CLIENT-1. Sans-I/O: byte-level, two connections talking
through memory (tests/conftest.py).
"""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from collections.abc import Callable

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID

from protocol import (
    CloseCode,
    Identity,
    LocalProtocolError,
    RemoteProtocolError,
    State,
    frames,
    mirroring,
)
from protocol.client_wire import (
    ClientFrameKind,
    ClientFrameReader,
    encode_meta,
)
from protocol.events import Fragment, HandshakeComplete
from tests.conftest import NOW, Pki, make_pair, open_pair, run_handshake

# --- handshake frames at their documented bounds ------------------------------------


def _identity_with_certificate_of(pki: Pki, name: str, size: int) -> Identity:
    """An instance identity under the test CA whose certificate's DER is ``size`` bytes,
    made large by an extension this project does not read."""
    ca = pki.ca
    key = ed25519.Ed25519PrivateKey.generate()

    def build(padding: int) -> x509.Certificate:
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca.certificate.subject)
            .public_key(key.public_key())
            .serial_number(1234)
            .not_valid_before(NOW - dt.timedelta(minutes=5))
            .not_valid_after(NOW + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.UnrecognizedExtension(
                    x509.ObjectIdentifier("1.3.6.1.4.1.55555.1"), b"\x04\x82" + bytes(padding)
                ),
                critical=False,
            )
            .sign(ca.private_key, None)
        )

    cert = build(1000)
    grow = size - len(cert.public_bytes(serialization.Encoding.DER))
    cert = build(1000 + grow)
    der = cert.public_bytes(serialization.Encoding.DER)
    assert len(der) == size, len(der)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return Identity.from_pem(
        cert.public_bytes(serialization.Encoding.PEM), key_pem, ca.certificate_pem
    )


@pytest.mark.parametrize("side", ["initiator", "acceptor"])
def test_a_certificate_at_the_documented_bound_completes_the_handshake(pki: Pki, side: str) -> None:
    """§2.3/§2.4: a certificate may be 16,384 bytes, a HELLO body 17,514 and a
    HELLO_REPLY body 18,512; a handshake frame within those bounds is not refused as too
    large before the handshake completes."""
    big = _identity_with_certificate_of(pki, "bigcert", frames.MAX_CERTIFICATE_BYTES)
    initiator, acceptor = (big, pki.beta) if side == "initiator" else (pki.alpha, big)
    i, a = make_pair(initiator, acceptor)
    i_events, a_events = run_handshake(i, a)
    assert i.state is State.OPEN and a.state is State.OPEN
    assert [type(e) for e in i_events] == [HandshakeComplete]
    assert [type(e) for e in a_events] == [HandshakeComplete]


# --- FRAGMENTS frames -----------------------------------------------------------------


def test_an_empty_fragment_among_others_does_not_kill_the_connection(pki: Pki) -> None:
    """§2.7b: a FRAGMENTS entry is 1 byte or more, and the receiver refuses an empty one
    as a malformed body; an empty FRAGMENT payload is accepted alone, so a sender must
    never put one in a FRAGMENTS frame."""
    i, a = open_pair(pki)
    assert i.version == frames.FRAGMENTS_VERSION
    sent = [b"one", b"", b"three"]
    out = i.send_fragments([((p,), len(p)) for p in sent])
    events = a.receive_data(b"".join(out))
    assert events == [Fragment(p) for p in sent]
    assert a.state is State.OPEN


def test_encode_fragments_refuses_what_decode_fragments_refuses() -> None:
    with pytest.raises(ValueError):
        frames.encode_fragments([b"x", b""])


# --- client wire meta ---------------------------------------------------------------


def _raw_request(meta: bytes) -> bytes:
    header = struct.pack(">2sBBIII", b"BC", 1, int(ClientFrameKind.REQUEST), 1, len(meta), 0)
    return header + meta


@pytest.mark.parametrize(
    "meta",
    [
        b'{"a":1e400}',
        b'{"a":-1e400}',
        b'{"a":"\\ud800"}',
        b'{"\\udfff":1}',
        b'{"n":12345678901234567890123,"a":"\\ud800"}',
        b'{"n":12345678901234567890123,"a":1e999}',
    ],
    ids=[
        "overflow",
        "negative-overflow",
        "lone-surrogate",
        "surrogate-key",
        "long-surr",
        "long-inf",
    ],
)
def test_meta_that_cannot_be_json_again_is_refused(meta: bytes) -> None:
    """The meta is strict JSON, valid UTF-8: a number that overflows to infinity or an
    escaped lone surrogate decodes to a value :func:`encode_meta` refuses, and which no
    UTF-8 text holds; the reader refuses it as it refuses NaN or an encoded surrogate."""
    reader = ClientFrameReader()
    with pytest.raises(RemoteProtocolError) as info:
        frames_ = reader.feed(_raw_request(meta))
        encode_meta(frames_[0].meta)  # what the daemon would do with it: fail later
    assert info.value.close_code is CloseCode.PROTOCOL_ERROR


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        (b'{"a":"\\ud83d\\ude00"}', {"a": "\U0001f600"}),
        (b'{"a":"\\\\ud800"}', {"a": "\\ud800"}),
        (
            b'{"a":1.5e300,"n":12345678901234567890123}',
            {"a": 1.5e300, "n": 12345678901234567890123},
        ),
    ],
    ids=["surrogate-pair", "escaped-backslash", "large-finite"],
)
def test_meta_that_is_strict_json_is_accepted(meta: bytes, expected: dict[str, object]) -> None:
    [frame] = ClientFrameReader().feed(_raw_request(meta))
    assert frame.meta == expected


def test_a_repeated_meta_is_decoded_afresh_for_each_frame() -> None:
    """Each frame's meta is what its bytes say, whatever the consumer did with the meta of
    the frame before (a nested value changed in place)."""
    reader = ClientFrameReader()
    wire = _raw_request(b'{"op":"x","options":{"limit":5},"ids":[1,2]}')
    [first] = reader.feed(wire)
    first.meta["options"]["limit"] = 99
    first.meta["ids"].append(3)
    [second] = reader.feed(wire)
    assert second.meta == {"op": "x", "options": {"limit": 5}, "ids": [1, 2]}


# --- mirroring messages: our own values that cannot travel ----------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: mirroring.encode(mirroring.Refuse(uuid.UUID(int=1), "bad \udcff")),
        lambda: mirroring.encode_statements([("SELECT ?", ["\ud800"])]),
        lambda: mirroring.encode_statements([("SELECT '\ud800'", [])]),
    ],
    ids=["refuse-reason", "text-value", "sql-text"],
)
def test_text_that_is_not_utf8_is_our_mistake(make: Callable[[], bytes]) -> None:
    """R-ROUTE-16: encoding a mirroring message raises LocalProtocolError for a value that
    cannot travel, a string no UTF-8 holds (a lone surrogate) included."""
    with pytest.raises(LocalProtocolError):
        make()
