"""Dialog security codecs and crypto (SPEC R-DLG-14), byte for byte.

``golden/dialog_security_v2.json`` pins a key exchange (made at a fixed time), a secured
first fragment (carrying it) and a secured dedicated acknowledgement, made with fixed keys and
counter "entropy" (the ECDSA signature inside the key exchange is randomised, so the
vectors were generated once and are checked by opening them, and by re-sealing
where the output is deterministic).
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from protocol.dialog import (
    FLAG_ERROR,
    FLAG_INITIATOR,
    FLAG_SECURED,
    FLAG_SEQUENCED,
    MAX_KEY_EXCHANGE_SIZE,
    SECURED_DIALOG_HEADER,
    Acknowledgement,
    DialogHeader,
    Security,
    declaration_of,
    decode_acks,
    decode_fragment,
    encode_acks,
    encode_fragment,
    encode_header,
    to_construct_value,
    validate_header,
)
from protocol.dialog_security import (
    KEY_EXCHANGE_SIZE,
    DialogKeys,
    DialogSecurityError,
    make_key_exchange,
    open_key_exchange,
)
from protocol.errors import LocalProtocolError, RemoteProtocolError

GOLDEN = json.loads((Path(__file__).parent / "golden" / "dialog_security_v2.json").read_text())
CONV = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
A = uuid.UUID(int=0x11111111111111111111111111111111)
B = uuid.UUID(int=0x66666666666666666666666666666666)
INITIATOR_KEY = ec.derive_private_key(0x1234567890ABCDEF, ec.SECP256R1())
TARGET_KEY = ec.derive_private_key(0xFEDCBA0987654321, ec.SECP256R1())
OTHER_KEY = ec.derive_private_key(0x5555, ec.SECP256R1())
DIALOG_KEY = bytes(range(32))
FROM, TO = "//alpha/Initiator", "//beta/Target"
HOP_COUNT_OFFSET = 2 + 16 + 2 + 8 + 4 + 4 + 8 + 8 + 4
"""Where the hop count sits in a FRAGMENT payload (after the u16 header length)."""


def counter(seed: int) -> Callable[[int], bytes]:
    c = itertools.count(seed)
    return lambda n: bytes(next(c) % 256 for _ in range(n))


def first_message() -> DialogHeader:
    return DialogHeader(
        CONV,
        FROM,
        TO,
        A,
        None,
        "//brokerd/Contract",
        "//brokerd/Request",
        FLAG_INITIATOR | FLAG_SEQUENCED,
        1,
        0,
        1,
        0,
        12,
        3600,
        0,
    )


def test_golden_key_exchange_opens_to_the_dialog_key() -> None:
    blob = bytes.fromhex(GOLDEN["kx"])
    assert len(blob) == KEY_EXCHANGE_SIZE == 185
    opened = open_key_exchange(blob, CONV, FROM, TO, TARGET_KEY, INITIATOR_KEY.public_key())
    assert opened == (DIALOG_KEY, GOLDEN["made_at"])
    assert blob[113:121] == GOLDEN["made_at"].to_bytes(8, "big")  # after ephemeral, wrapped
    assert opened.age(GOLDEN["made_at"] + 90_000) == 90.0


def test_golden_secured_first_fragment() -> None:
    """Layout: the version-1 header with flags INITIATOR | SEQUENCED | SECURED (0x0013),
    then between the (empty) acknowledgement lists and the names the security trailer:
    nonce (12) | tag (16) | u16 185 | key exchange; the body is the ciphertext, as long
    as the plaintext."""
    payload = bytes.fromhex(GOLDEN["fragment"])
    header, body = decode_fragment(payload)
    assert payload[18:20] == b"\x00\x13"
    assert header.security is not None
    assert header.security.nonce == bytes(range(100, 112))
    assert header.security.key_exchange == bytes.fromhex(GOLDEN["kx"])
    assert len(body) == header.message_length == 12
    assert DialogKeys(DIALOG_KEY).open(header, body) == b"hello, world"
    # Sealing again with the same nonce and key exchange gives the same bytes.
    sealed = DialogKeys(DIALOG_KEY).seal(
        first_message(), b"hello, world", header.security.key_exchange, counter(100)
    )
    assert encode_fragment(*sealed) == payload


def test_golden_secured_acknowledgement() -> None:
    payload = bytes.fromhex(GOLDEN["acks"])
    (header,) = decode_acks(payload)
    assert header.flags == FLAG_SECURED and header.ack == Acknowledgement(1)
    assert DialogKeys(DIALOG_KEY).open(header, b"") == b""
    ack = DialogHeader(CONV, TO, FROM, B, A, "//brokerd/Contract", flags=0, ack=Acknowledgement(1))
    sealed, _ = DialogKeys(DIALOG_KEY).seal(ack, b"", b"", counter(200))
    assert encode_acks([sealed]) == payload


def test_the_construct_declaration_lays_out_a_secured_header_as_the_hot_path() -> None:
    header, _ = decode_fragment(bytes.fromhex(GOLDEN["fragment"]))
    assert declaration_of(header) is SECURED_DIALOG_HEADER
    assert SECURED_DIALOG_HEADER.build(to_construct_value(header)) == encode_header(header)


def test_every_byte_but_the_hop_count_is_authenticated() -> None:
    """A forwarder may only raise the hop count; any other change is refused (or does not
    even parse)."""
    payload = bytes.fromhex(GOLDEN["fragment"])
    keys = DialogKeys(DIALOG_KEY)
    for at in range(len(payload)):
        altered = bytearray(payload)
        altered[at] ^= 0x01
        try:
            header, body = decode_fragment(bytes(altered))
            plain = keys.open(header, body)
        except (RemoteProtocolError, DialogSecurityError):
            assert at != HOP_COUNT_OFFSET
            continue
        assert at == HOP_COUNT_OFFSET, f"byte {at} altered without notice"
        assert plain == b"hello, world"


def test_a_frame_is_bound_to_its_direction_and_its_dialog_key() -> None:
    header, body = decode_fragment(bytes.fromhex(GOLDEN["fragment"]))
    with pytest.raises(DialogSecurityError):  # reflected back as if from the target
        DialogKeys(DIALOG_KEY).open(header._replace(flags=header.flags & ~FLAG_INITIATOR), body)
    with pytest.raises(DialogSecurityError):
        DialogKeys(bytes(32)).open(header, body)
    with pytest.raises(DialogSecurityError, match="this frame is not"):
        DialogKeys(DIALOG_KEY).open(header._replace(flags=FLAG_SEQUENCED, security=None), body)


def test_a_key_exchange_is_for_one_target_and_from_one_initiator() -> None:
    blob = make_key_exchange(
        CONV, FROM, TO, DIALOG_KEY, INITIATOR_KEY, TARGET_KEY.public_key(), made_at=1
    )
    assert open_key_exchange(blob, CONV, FROM, TO, TARGET_KEY, INITIATOR_KEY.public_key()) == (
        DIALOG_KEY,
        1,
    )
    with pytest.raises(DialogSecurityError, match="not signed"):
        open_key_exchange(blob, CONV, FROM, TO, TARGET_KEY, OTHER_KEY.public_key())
    with pytest.raises(DialogSecurityError, match="not wrapped for this service"):
        open_key_exchange(blob, CONV, FROM, TO, OTHER_KEY, INITIATOR_KEY.public_key())
    with pytest.raises(DialogSecurityError, match="not signed"):  # another conversation
        open_key_exchange(blob, uuid.uuid4(), FROM, TO, TARGET_KEY, INITIATOR_KEY.public_key())
    with pytest.raises(DialogSecurityError, match="not signed"):  # another service
        open_key_exchange(blob, CONV, "//mallory", TO, TARGET_KEY, INITIATOR_KEY.public_key())
    later = blob[:113] + (2).to_bytes(8, "big") + blob[121:]
    with pytest.raises(DialogSecurityError, match="not signed"):  # its time changed
        open_key_exchange(later, CONV, FROM, TO, TARGET_KEY, INITIATOR_KEY.public_key())
    with pytest.raises(DialogSecurityError, match="185"):
        open_key_exchange(blob[:-1], CONV, FROM, TO, TARGET_KEY, INITIATOR_KEY.public_key())
    bad_point = b"\x04" + bytes(64) + blob[65:]
    with pytest.raises(DialogSecurityError):
        open_key_exchange(bad_point, CONV, FROM, TO, TARGET_KEY, INITIATOR_KEY.public_key())


def test_an_error_body_is_encrypted_and_keeps_its_length() -> None:
    error = DialogHeader(
        CONV, TO, FROM, B, A, "//brokerd/Contract", "E", FLAG_ERROR, message_length=9
    )
    sealed, body = DialogKeys(DIALOG_KEY).seal(error, b"secret 42")
    assert body != b"secret 42" and len(body) == 9
    assert validate_header(sealed, len(body)) is None
    again, again_body = decode_fragment(encode_fragment(sealed, body))
    assert DialogKeys(DIALOG_KEY).open(again, again_body) == b"secret 42"


def test_the_trailer_is_bounded_and_goes_with_its_flag() -> None:
    header, body = decode_fragment(bytes.fromhex(GOLDEN["fragment"]))
    assert header.security is not None
    with pytest.raises(LocalProtocolError, match="go together"):
        encode_fragment(header._replace(flags=FLAG_INITIATOR | FLAG_SEQUENCED), body)
    with pytest.raises(LocalProtocolError, match="go together"):
        encode_fragment(header._replace(security=None), body)
    huge = header._replace(
        security=Security(bytes(12), bytes(16), bytes(MAX_KEY_EXCHANGE_SIZE + 1))
    )
    with pytest.raises(LocalProtocolError, match="exceeds"):
        encode_fragment(huge, body)
    # On the wire: an announced key exchange over the bound, and a truncated trailer.
    raw = bytearray(bytes.fromhex(GOLDEN["fragment"]))
    size_at = HOP_COUNT_OFFSET + 1 + 16 + 16 + 8 + 1 + 1 + 12 + 16
    assert raw[size_at : size_at + 2] == (185).to_bytes(2, "big")
    raw[size_at : size_at + 2] = (MAX_KEY_EXCHANGE_SIZE + 1).to_bytes(2, "big")
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        decode_fragment(bytes(raw))
    short = DialogHeader(CONV, FROM, TO, A, flags=FLAG_SECURED | FLAG_SEQUENCED)
    encoded = encode_header(short._replace(flags=FLAG_SEQUENCED))
    truncated = encoded[: HOP_COUNT_OFFSET - 2 + 1 + 16 + 16 + 8 + 2]
    patched = truncated[:16] + (FLAG_SECURED | FLAG_SEQUENCED).to_bytes(2, "big") + truncated[18:]
    with pytest.raises(RemoteProtocolError, match="security trailer is truncated"):
        decode_fragment(len(patched).to_bytes(2, "big") + patched)
