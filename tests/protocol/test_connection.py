"""The adjacent-broker connection: handshake, refusals and fragment protection.

SPEC R-PROTO-1 (adjacent broker protocol), R-OBJ-7 (encryption modes),
R-DLG-8 (integrity: altered frames discarded, never handed up), R-ROUTE-10
(principal query/answer frames). Two sans-I/O connections talk through an
in-memory link (tests/conftest.py).
"""

from __future__ import annotations

import datetime as dt
import random
import tracemalloc
import uuid
from collections.abc import Iterator

import pytest

from brokerd.tools.certs import identity_for, issue_instance
from protocol import (
    BrokerConnection,
    CloseCode,
    ConnectionSettings,
    EncryptionMode,
    HandshakeRefused,
    Identity,
    LocalProtocolError,
    MirrorRole,
    RemoteProtocolError,
    Role,
    State,
    digests,
    frames,
    security,
)
from protocol.events import (
    Ack,
    Close,
    Fragment,
    HandshakeComplete,
    IntegrityFailure,
    Keepalive,
    PrincipalAnswer,
    PrincipalQuery,
)
from protocol.frames import SizedPayload
from protocol.handshake import HANDSHAKE_MAX_FRAME_SIZE
from tests.conftest import NOW, Pki, make_pair, open_pair, run_handshake

R, S, D = EncryptionMode.REQUIRED, EncryptionMode.SUPPORTED, EncryptionMode.DISABLED


@pytest.fixture(autouse=True, params=["lanes", "pure"])
def md5_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test runs with the frames' MD5 signatures in SIMD lanes (the compiled
    ``protocol._md5lanes``) and with ``hashlib`` alone (the pure path)."""
    if request.param == "lanes" and not digests.COMPILED:
        pytest.skip("protocol._md5lanes is not built here")
    digests.use_lanes(request.param == "lanes")
    yield request.param
    digests.use_lanes(True)


def test_handshake_completes_and_names_both_sides(pki: Pki) -> None:
    i, a = make_pair(pki.alpha, pki.beta)
    i_events, a_events = run_handshake(i, a)
    latest = frames.PROTOCOL_VERSIONS[-1]
    assert i_events == [HandshakeComplete("beta", latest, True, frames.DEFAULT_MAX_FRAME_SIZE)]
    assert a_events == [HandshakeComplete("alpha", latest, True, frames.DEFAULT_MAX_FRAME_SIZE)]
    assert i.state is State.OPEN and a.state is State.OPEN
    assert i.peer_instance == "beta" and a.peer_instance == "alpha"


def test_handshake_with_ecdsa_certificates(pki: Pki) -> None:
    ec_a = identity_for(issue_instance(pki.ca, "alpha", key_type="ec-p256", now=NOW), pki.ca)
    ec_b = identity_for(issue_instance(pki.ca, "beta", key_type="ec-p256", now=NOW), pki.ca)
    i, a = make_pair(ec_a, ec_b)
    i_events, _ = run_handshake(i, a)
    assert isinstance(i_events[0], HandshakeComplete)


def test_handshake_fed_byte_by_byte(pki: Pki) -> None:
    i, a = make_pair(pki.alpha, pki.beta)

    def dribble(conn: BrokerConnection, data: bytes) -> list[object]:
        out: list[object] = []
        for k in range(len(data)):
            out += conn.receive_data(data[k : k + 1])
        return out

    assert dribble(a, i.start()) == []
    assert dribble(i, a.data_to_send()) == []
    assert [type(e) for e in dribble(a, i.data_to_send())] == [HandshakeComplete]
    assert [type(e) for e in dribble(i, a.data_to_send())] == [HandshakeComplete]
    frame = i.send(Fragment(b"x" * 300))
    assert dribble(a, frame) == [Fragment(b"x" * 300)]


def test_all_sendable_events_cross_both_ways(pki: Pki) -> None:
    i, a = open_pair(pki)
    broker = uuid.uuid4()
    sent = [
        Fragment(b"payload"),
        Ack(b"ack bytes"),
        Keepalive(),
        PrincipalQuery(7, broker, "Expenses", 5),
        PrincipalAnswer(7, MirrorRole.PRINCIPAL, broker, "Expenses", 6),
    ]
    assert a.receive_data(b"".join(i.send(e) for e in sent)) == sent
    assert i.receive_data(b"".join(a.send(e) for e in sent)) == sent


def test_close_is_delivered_with_reason(pki: Pki) -> None:
    i, a = open_pair(pki)
    assert a.receive_data(i.close(CloseCode.IDLE, "idle for 90 s")) == [
        Close(CloseCode.IDLE, "idle for 90 s")
    ]
    assert i.state is State.CLOSED and a.state is State.CLOSED
    assert a.close_code is CloseCode.IDLE


# --------------------------------------------------------------- R-OBJ-7 modes


@pytest.mark.parametrize(
    ("mode_i", "mode_a", "encrypted"),
    [
        (R, R, True),
        (R, S, True),
        (S, R, True),
        (S, S, True),
        (S, D, False),
        (D, S, False),
        (D, D, False),
    ],
)
def test_encryption_negotiation(
    pki: Pki, mode_i: EncryptionMode, mode_a: EncryptionMode, encrypted: bool
) -> None:
    """R-OBJ-7: encrypted unless a side disables it; signed either way."""
    i, a = make_pair(pki.alpha, pki.beta, mode_i, mode_a)
    i_events, a_events = run_handshake(i, a)
    assert i_events[0].encrypted is encrypted  # type: ignore[union-attr]
    assert a_events[0].encrypted is encrypted  # type: ignore[union-attr]
    secret = b"the quarterly numbers " * 10
    frame = i.send(Fragment(secret))
    assert (secret in frame) is not encrypted
    assert a.receive_data(frame) == [Fragment(secret)]


@pytest.mark.parametrize(("mode_i", "mode_a"), [(R, D), (D, R)])
def test_required_against_disabled_is_refused(
    pki: Pki, mode_i: EncryptionMode, mode_a: EncryptionMode
) -> None:
    i, a = make_pair(pki.alpha, pki.beta, mode_i, mode_a)
    with pytest.raises(HandshakeRefused) as refused:
        run_handshake(i, a)
    assert refused.value.close_code is CloseCode.ENCRYPTION_MISMATCH
    assert a.state is State.CLOSED
    events = i.receive_data(a.data_to_send())
    assert events == [Close(CloseCode.ENCRYPTION_MISMATCH, str(refused.value))]
    assert "required" in str(refused.value) and "disabled" in str(refused.value)


def test_signed_only_payload_alteration_is_detected(pki: Pki) -> None:
    """Clear payload, but the encrypted MD5 signature still guards it (R-DLG-8)."""
    i, a = open_pair(pki, initiator_mode=S, acceptor_mode=D)
    frame = bytearray(i.send(Fragment(b"amount=100")))
    frame[frame.index(b"100")] = ord("9")
    events = a.receive_data(bytes(frame))
    assert [type(e) for e in events] == [IntegrityFailure]
    assert a.state is State.OPEN


# ------------------------------------------------------- authentication refusals


def test_certificate_from_another_ca_is_refused_by_acceptor(pki: Pki) -> None:
    i, a = make_pair(pki.stranger, pki.beta)
    with pytest.raises(HandshakeRefused) as refused:
        run_handshake(i, a)
    assert refused.value.close_code is CloseCode.UNTRUSTED_CERTIFICATE
    assert "not issued by a trusted CA" in str(refused.value)
    (close,) = i.receive_data(a.data_to_send())
    assert isinstance(close, Close) and close.code is CloseCode.UNTRUSTED_CERTIFICATE
    assert i.state is State.CLOSED


def test_certificate_from_another_ca_is_refused_by_initiator(pki: Pki) -> None:
    i, a = make_pair(pki.alpha, pki.stranger)
    with pytest.raises(HandshakeRefused) as refused:
        run_handshake(i, a)
    assert refused.value.close_code is CloseCode.UNTRUSTED_CERTIFICATE
    (close,) = a.receive_data(i.data_to_send())
    assert isinstance(close, Close) and close.code is CloseCode.UNTRUSTED_CERTIFICATE


def test_expired_certificate_is_refused(pki: Pki) -> None:
    old = identity_for(
        issue_instance(pki.ca, "alpha", days=1, now=NOW - dt.timedelta(days=30)), pki.ca
    )
    i, a = make_pair(old, pki.beta)
    with pytest.raises(HandshakeRefused, match="not valid at"):
        run_handshake(i, a)


def test_stolen_certificate_without_its_key_fails_the_proof(pki: Pki) -> None:
    """The initiator presents alpha's certificate but signs with beta's key."""
    impostor = Identity(pki.alpha.certificate, pki.beta.private_key, pki.alpha.trusted_cas)
    i, a = make_pair(impostor, pki.beta)
    with pytest.raises(HandshakeRefused) as refused:
        run_handshake(i, a)
    assert refused.value.close_code is CloseCode.AUTHENTICATION_FAILED
    assert "failed to prove possession" in str(refused.value)
    (close,) = i.receive_data(a.data_to_send())
    assert isinstance(close, Close) and close.code is CloseCode.AUTHENTICATION_FAILED


def test_acceptor_with_stolen_certificate_fails_the_proof(pki: Pki) -> None:
    impostor = Identity(pki.beta.certificate, pki.alpha.private_key, pki.beta.trusted_cas)
    i, a = make_pair(pki.alpha, impostor)
    with pytest.raises(HandshakeRefused) as refused:
        run_handshake(i, a)
    assert refused.value.close_code is CloseCode.AUTHENTICATION_FAILED


def test_expected_peer_name_is_enforced(pki: Pki) -> None:
    i = BrokerConnection(Role.INITIATOR, ConnectionSettings(pki.alpha, expected_peer="gamma"), NOW)
    a = BrokerConnection(Role.ACCEPTOR, ConnectionSettings(pki.beta), NOW)
    with pytest.raises(HandshakeRefused) as refused:
        run_handshake(i, a)
    assert refused.value.close_code is CloseCode.PEER_NAME_MISMATCH


def _rewrite(frame: bytes, frame_type: frames.FrameType, **changes: object) -> bytes:
    """Re-encode a clear handshake frame with altered body fields and a valid CRC."""
    header = frames.decode_header(frame, frames.DEFAULT_MAX_FRAME_SIZE)
    value = dict(frames.BODY_CODECS[frame_type].parse(frame[frames.HEADER_SIZE :]))
    value.pop("_io", None)
    value.update(changes)
    body = frames.BODY_CODECS[frame_type].build(value)
    return (
        frames.encode_header(
            header.version, header.frame_type, header.flags, len(body), header.counter
        )
        + body
    )


def test_no_common_version_is_refused(pki: Pki) -> None:
    i, a = make_pair(pki.alpha, pki.beta)
    hello = _rewrite(i.start(), frames.FrameType.HELLO, versions=[7, 9])
    with pytest.raises(HandshakeRefused) as refused:
        a.receive_data(hello)
    assert refused.value.close_code is CloseCode.VERSION_MISMATCH
    assert "[7, 9]" in str(refused.value)


def _tamper_hello(**changes: object):  # type: ignore[no-untyped-def]
    def tamper(direction: str, data: bytes) -> bytes:
        if direction == "i->a" and frames.iter_frame_headers(data)[0].frame_type == 1:
            return _rewrite(data, frames.FrameType.HELLO, **changes)
        return data

    return tamper


def test_downgrade_of_the_encryption_mode_in_flight_is_refused(pki: Pki) -> None:
    """A man in the middle rewriting HELLO to 'disabled' (with a valid CRC) cannot make
    the initiator accept an unencrypted session."""
    i, a = make_pair(pki.alpha, pki.beta, S, S)
    with pytest.raises(HandshakeRefused) as refused:
        run_handshake(i, a, _tamper_hello(encryption=int(D)))
    assert refused.value.close_code in (
        CloseCode.ENCRYPTION_MISMATCH,
        CloseCode.AUTHENTICATION_FAILED,
    )
    assert i.state is State.CLOSED


def test_hello_altered_in_flight_fails_the_transcript_signature(pki: Pki) -> None:
    i, a = make_pair(pki.alpha, pki.beta)
    with pytest.raises(HandshakeRefused) as refused:
        run_handshake(i, a, _tamper_hello(random=b"\x00" * 32))
    assert refused.value.close_code is CloseCode.AUTHENTICATION_FAILED
    assert "bad handshake signature" in str(refused.value)


def test_sending_before_the_handshake_is_a_local_error(pki: Pki) -> None:
    i, _ = make_pair(pki.alpha, pki.beta)
    with pytest.raises(LocalProtocolError, match="handshake"):
        i.send(Fragment(b"too early"))


def test_payload_over_the_peer_limit_is_a_local_error(pki: Pki) -> None:
    i, _ = open_pair(pki, max_frame_size=frames.MIN_MAX_FRAME_SIZE)
    assert i.max_payload_size == frames.MIN_MAX_FRAME_SIZE - 32
    i.send(Fragment(b"x" * i.max_payload_size))
    with pytest.raises(LocalProtocolError, match="exceeds the peer's frame limit"):
        i.send(Fragment(b"x" * (i.max_payload_size + 1)))


# ------------------------------------------------------------ R-DLG-8 integrity


@pytest.mark.parametrize("mode", [R, D])
def test_flipping_any_single_byte_of_a_fragment_frame_is_detected(
    pki: Pki, mode: EncryptionMode
) -> None:
    """Every position: the frame is never handed up; a body flip is an IntegrityFailure
    and the connection goes on, a header flip kills the connection."""
    payload = bytes(range(200))
    for position in range(frames.HEADER_SIZE + len(payload) + 32):
        i, a = open_pair(pki, initiator_mode=mode, acceptor_mode=mode)
        good = i.send(Fragment(payload))
        bad = bytearray(good)
        bad[position] ^= 0x01
        try:
            events = a.receive_data(bytes(bad))
        except RemoteProtocolError:
            assert position < frames.HEADER_SIZE, position
            assert a.state is State.CLOSED
            continue
        if position < frames.HEADER_SIZE:
            # A larger length: still waiting for the rest, nothing handed up.
            assert events == [] or [type(e) for e in events] == [IntegrityFailure]
            continue
        assert [type(e) for e in events] == [IntegrityFailure], position
        # The counter was not consumed: the genuine frame is still accepted.
        assert a.receive_data(good) == [Fragment(payload)]


def test_replayed_frame_is_rejected(pki: Pki) -> None:
    i, a = open_pair(pki)
    f1, f2 = i.send(Fragment(b"one")), i.send(Fragment(b"two"))
    assert a.receive_data(f1) == [Fragment(b"one")]
    (failure,) = a.receive_data(f1)
    assert isinstance(failure, IntegrityFailure) and "replayed" in failure.reason
    assert a.receive_data(f2) == [Fragment(b"two")]


def test_reordered_frame_is_rejected(pki: Pki) -> None:
    i, a = open_pair(pki)
    f1, f2 = i.send(Fragment(b"one")), i.send(Fragment(b"two"))
    assert a.receive_data(f2) == [Fragment(b"two")]
    assert [type(e) for e in a.receive_data(f1)] == [IntegrityFailure]


def test_frame_from_another_connection_is_rejected(pki: Pki) -> None:
    i1, _ = open_pair(pki)
    _, a2 = open_pair(pki)
    (failure,) = a2.receive_data(i1.send(Fragment(b"elsewhere")))
    assert isinstance(failure, IntegrityFailure) and "tag mismatch" in failure.reason


def test_truncated_frame_is_never_handed_up(pki: Pki) -> None:
    i, a = open_pair(pki)
    f1, f2 = i.send(Fragment(b"first" * 20)), i.send(Fragment(b"second" * 20))
    while f1[-1:] == f2[:1]:
        # The truncated frame borrows the next frame's first byte: when it equals the byte
        # cut off (one session key in 256), the frame is whole again. Take fresh keys.
        i, a = open_pair(pki)
        f1, f2 = i.send(Fragment(b"first" * 20)), i.send(Fragment(b"second" * 20))
    with pytest.raises(RemoteProtocolError) as failed:
        a.receive_data(f1[:-1] + f2)
    assert [type(e) for e in failed.value.events] == [IntegrityFailure]
    assert a.state is State.CLOSED


def test_injected_clear_close_is_ignored_once_open(pki: Pki) -> None:
    i, a = open_pair(pki)
    assert a.version is not None
    forged = (
        frames.encode_header(a.version, frames.FrameType.CLOSE, 0, 6, 99) + b"\x00\x00\x00\x02hi"
    )
    (failure,) = a.receive_data(forged)
    assert isinstance(failure, IntegrityFailure)
    assert a.state is State.OPEN
    assert a.receive_data(i.send(Fragment(b"still here"))) == [Fragment(b"still here")]


def test_too_many_integrity_failures_close_the_connection(pki: Pki) -> None:
    i, a = open_pair(pki, max_integrity_failures=3)
    frame = i.send(Fragment(b"x"))
    a.receive_data(frame)
    for _ in range(3):
        a.receive_data(frame)
    with pytest.raises(RemoteProtocolError) as failed:
        a.receive_data(frame)
    assert failed.value.close_code is CloseCode.INTEGRITY
    (close,) = i.receive_data(a.data_to_send())
    assert isinstance(close, Close) and close.code is CloseCode.INTEGRITY


def test_oversized_length_is_refused_before_buffering(pki: Pki) -> None:
    _, a = open_pair(pki, max_frame_size=frames.MIN_MAX_FRAME_SIZE)
    header = frames.encode_header(1, frames.FrameType.FRAGMENT, 3, 10**9, 50)
    with pytest.raises(RemoteProtocolError) as failed:
        a.receive_data(header)
    assert failed.value.close_code is CloseCode.FRAME_TOO_LARGE
    assert a.buffered_bytes == 0


def test_unknown_ca_certificate_reason_names_the_issuer(pki: Pki) -> None:
    i, a = make_pair(pki.stranger, pki.beta)
    with pytest.raises(HandshakeRefused, match=r"issuer .CN=someone else's CA."):
        run_handshake(i, a)


def test_bytearray_input_yields_immutable_payloads(pki: Pki) -> None:
    i, a = open_pair(pki)
    data = bytearray(i.send(Fragment(b"abc")))
    (event,) = a.receive_data(data)  # type: ignore[arg-type]
    assert isinstance(event, Fragment) and type(event.payload) is bytes
    data[-1] ^= 1  # the caller reusing its buffer does not change what was handed up
    assert event.payload == b"abc"


def test_close_with_unencodable_reason_still_closes_and_keeps_queued_bytes(pki: Pki) -> None:
    i, a = make_pair(pki.alpha, pki.beta)
    a.receive_data(i.start())
    a.receive_data(b"")  # HELLO_REPLY is queued in data_to_send()
    out = a.close(CloseCode.SHUTDOWN, "bye \udcff")
    assert a.state is State.CLOSED
    headers = frames.iter_frame_headers(out)
    assert [h.frame_type for h in headers] == [frames.FrameType.HELLO_REPLY, frames.FrameType.CLOSE]


def test_before_the_handshake_frames_are_small(pki: Pki) -> None:
    """An unauthenticated peer cannot make a connection buffer more than a handshake frame:
    a header announcing more is refused at once, whatever max_frame_size allows later."""
    _, a = make_pair(pki.alpha, pki.beta)
    header = frames.encode_header(1, frames.FrameType.HELLO, 0, HANDSHAKE_MAX_FRAME_SIZE + 1, 0)
    with pytest.raises(RemoteProtocolError) as failed:
        a.receive_data(header)
    assert failed.value.close_code is CloseCode.FRAME_TOO_LARGE
    assert a.buffered_bytes == 0


def test_large_frames_are_accepted_once_open_even_in_the_chunk_that_opens(pki: Pki) -> None:
    """The limit follows the state frame by frame: a big fragment that arrives in the same
    chunk as the acceptor's last handshake frame is accepted."""
    i, a = make_pair(pki.alpha, pki.beta)
    payload = b"x" * (HANDSHAKE_MAX_FRAME_SIZE * 4)
    events = []
    to_a = i.start()
    while to_a:
        a.receive_data(to_a)
        to_i = a.data_to_send()
        if a.state is State.OPEN:
            to_i += a.send(Fragment(payload))
        events += i.receive_data(to_i)
        to_a = i.data_to_send()
    assert i.state is State.OPEN
    fragments = [e for e in events if isinstance(e, Fragment)]
    assert [f.payload for f in fragments] == [payload]


@pytest.mark.parametrize("seed", range(8))
def test_frames_split_at_any_point_arrive_whole_and_in_order(pki: Pki, seed: int) -> None:
    """Reads end anywhere: inside a header, inside a body, on a boundary; a frame that
    straddles reads is completed from the next one and the rest of that read parsed
    where it is (large fragments, small ones, acknowledgements, keepalives mixed)."""
    rng = random.Random(seed)
    i, a = open_pair(pki)
    sent: list[object] = []
    stream = bytearray()
    for n in range(60):
        kind = rng.random()
        if kind < 0.1:
            stream += i.send(Keepalive())
            sent.append(Keepalive())
        elif kind < 0.3:
            payload = bytes([n]) * rng.randint(0, 40)
            stream += i.send(Ack(payload))
            sent.append(Ack(payload))
        else:
            payload = bytes([n % 251]) * rng.choice((1, 100, 70_000, 200_000, 1_000_000))
            stream += i.send(Fragment(payload))
            sent.append(Fragment(payload))
    got: list[object] = []
    pos = 0
    while pos < len(stream):
        step = rng.choice((1, 7, 21, 22, 23, 4096, 65_536, 262_144, 1_500_000))
        got += a.receive_data(bytes(stream[pos : pos + step]))
        pos += step
    assert got == sent
    assert a.buffered_bytes == 0


def test_a_frame_written_a_byte_at_a_time_holds_its_bytes_not_an_object_each(
    pki: Pki,
) -> None:
    """Bad input costs what it sends (R-PROTO-1): a peer that trickles a large frame in one-byte
    reads makes the connection hold about the frame's bytes while it waits, not a
    Python object per read (about 35 bytes each), and the frame arrives whole."""
    i, a = open_pair(pki)
    payload = bytes(range(256)) * 400  # a 100 KiB fragment
    frame = i.send(Fragment(payload))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for at in range(len(frame) - 1):
            assert a.receive_data(frame[at : at + 1]) == []
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert a.buffered_bytes == len(frame) - 1
    assert held < 2 * len(frame), f"{held} bytes held for a frame of {len(frame)}"
    assert a.receive_data(frame[-1:]) == [Fragment(payload)]
    assert a.buffered_bytes == 0


def test_a_read_that_ends_in_a_frame_s_first_bytes_keeps_about_those_bytes(pki: Pki) -> None:
    """A read of many whole frames that ends in the first bytes of a large one: the
    connection keeps about those bytes while it waits for the rest, not the whole read."""
    i, a = open_pair(pki)
    payload = bytes(range(256)) * 400
    small = [i.send(Keepalive()) for _ in range(20_000)]
    large = i.send(Fragment(payload))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        read = b"".join([*small, large[:5_000]])
        got = a.receive_data(read)
        assert len(got) == 20_000
        size = len(read)
        del read, got
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert a.buffered_bytes == 5_000
    assert held < size // 4, f"{held} bytes held for 5,000 of a read of {size}"
    assert a.receive_data(large[5_000:]) == [Fragment(payload)]


# -- FRAGMENTS (version 2): several fragments under one seal --------------------------------


def _whole(payloads: list[bytes]) -> list[SizedPayload]:
    """Payloads as ``send_fragments`` takes them: each one piece, with its size."""
    return [((payload,), len(payload)) for payload in payloads]


def test_fragments_of_a_round_share_one_frame_on_version_2(pki: Pki) -> None:
    """R-PROTO-1: one FRAGMENTS frame carries them, the peer gets one Fragment event each,
    in order."""
    i, a = open_pair(pki)
    assert i.version == a.version == 2
    payloads = [b"first", b"second" * 10, b"third"]
    sent = i.stats.frames_sent
    data = b"".join(i.send_fragments(_whole(payloads)))
    assert i.stats.frames_sent == sent + 1
    assert frames.decode_header(data, frames.DEFAULT_MAX_FRAME_SIZE).frame_type == (
        frames.FrameType.FRAGMENTS
    )
    assert a.receive_data(data) == [Fragment(p) for p in payloads]
    alone = b"".join(i.send_fragments(_whole([b"alone"])))
    assert a.receive_data(alone) == [Fragment(b"alone")]


def _seeded_pair(
    pki: Pki, version: int, encryption: EncryptionMode
) -> tuple[BrokerConnection, BrokerConnection]:
    """An open pair whose randomness is drawn from fixed seeds: two such pairs hold the
    same session keys, so their frames can be compared byte for byte."""
    draws = [random.Random(1), random.Random(2)]
    i = BrokerConnection(
        Role.INITIATOR,
        ConnectionSettings(pki.alpha, encryption=encryption, versions=(version,)),
        NOW,
        draws[0].randbytes,
    )
    a = BrokerConnection(
        Role.ACCEPTOR,
        ConnectionSettings(pki.beta, encryption=encryption, versions=(version,)),
        NOW,
        draws[1].randbytes,
    )
    run_handshake(i, a)
    return i, a


@pytest.mark.parametrize("encryption", [EncryptionMode.REQUIRED, EncryptionMode.DISABLED])
@pytest.mark.parametrize("version", [1, 2])
def test_a_payload_given_in_pieces_is_framed_as_the_joined_payload(
    pki: Pki, version: int, encryption: EncryptionMode
) -> None:
    """R-PROTO-1, R-DLG-8: a link frames a fragment's header and a view of its bytes
    without joining them first: the frames are byte for byte those of the joined
    payloads, small and large (sealed in place from 16 KiB), encrypted and signed only."""
    body = bytes(range(256)) * 300
    pieces = [
        (b"head-1", memoryview(body)[:40_000]),
        (b"head-2", memoryview(body)[40_000:40_100]),
        (b"head-3", memoryview(body)[40_100:]),
    ]
    joined = [b"".join(p) for p in pieces]
    one, other = _seeded_pair(pki, version, encryption)
    again, _ = _seeded_pair(pki, version, encryption)
    by_pieces = b"".join(one.send_fragments([(p, sum(map(len, p))) for p in pieces]))
    assert by_pieces == b"".join(again.send_fragments(_whole(joined)))
    assert other.receive_data(by_pieces) == [Fragment(p) for p in joined]


def test_a_version_1_peer_gets_one_fragment_frame_each(pki: Pki) -> None:
    """A broker that speaks version 2 and one that speaks only version 1 agree on 1, and
    FRAGMENTS is never sent to it."""
    i = BrokerConnection(Role.INITIATOR, ConnectionSettings(pki.alpha), NOW)
    a = BrokerConnection(Role.ACCEPTOR, ConnectionSettings(pki.beta, versions=(1,)), NOW)
    run_handshake(i, a)
    assert i.version == a.version == 1
    sent = i.stats.frames_sent
    data = b"".join(i.send_fragments(_whole([b"a", b"b", b"c"])))
    assert i.stats.frames_sent == sent + 3
    headers = frames.iter_frame_headers(data)
    assert {h.frame_type for h in headers} == {frames.FrameType.FRAGMENT}
    assert a.receive_data(data) == [Fragment(b"a"), Fragment(b"b"), Fragment(b"c")]


def test_fragments_are_split_at_the_peer_frame_limit(pki: Pki) -> None:
    i, a = open_pair(pki, max_frame_size=frames.MIN_MAX_FRAME_SIZE)
    payloads = [bytes([n]) * 10_000 for n in range(7)]
    data = b"".join(i.send_fragments(_whole(payloads)))
    headers = frames.iter_frame_headers(data)
    assert len(headers) == 3  # three 10,004-byte entries fit in 32 KiB, a fourth does not
    assert all(h.length <= frames.MIN_MAX_FRAME_SIZE for h in headers)
    assert a.receive_data(data) == [Fragment(p) for p in payloads]


def test_fragments_on_a_version_1_connection_is_a_protocol_error(pki: Pki) -> None:
    i, a = open_pair(pki, versions=(1,))
    forged = i._send_protected(frames.FrameType.FRAGMENTS, frames.encode_fragments([b"x", b"y"]))
    with pytest.raises(RemoteProtocolError, match="FRAGMENTS frame on a version 1"):
        a.receive_data(forged)


def test_a_malformed_fragments_body_is_a_protocol_error(pki: Pki) -> None:
    i, a = open_pair(pki)
    forged = i._send_protected(frames.FrameType.FRAGMENTS, b"\x00\x00\x00\x09short")
    with pytest.raises(RemoteProtocolError, match="runs past the end"):
        a.receive_data(forged)


LARGE = 20_000
"""A fragment this large is sealed in place, and in a frame of its own where MD5 runs in
lanes (``security.IN_PLACE_FROM`` is 16 KiB)."""


def _large_payloads(count: int, seed: int = 1) -> list[bytes]:
    rnd = random.Random(seed)
    return [rnd.randbytes(LARGE + n) for n in range(count)]


def test_large_fragments_leave_as_frames_whose_signatures_are_taken_together(
    pki: Pki, md5_path: str
) -> None:
    """R-DLG-8, R-PROTO-1: with lanes a large fragment goes in a FRAGMENT frame of its
    own (their MD5s are computed side by side), without them they share FRAGMENTS frames;
    either way the peer gets each fragment once, in order, small ones between them
    batched as before, whatever its own MD5 path and wherever the reads end."""
    payloads = _large_payloads(10)
    payloads[4:4] = [b"small-1", b"small-2"]
    i, a = open_pair(pki)
    data = b"".join(i.send_fragments(_whole(payloads)))
    kinds = [h.frame_type for h in frames.iter_frame_headers(data)]
    if md5_path == "lanes":
        assert (
            kinds
            == [frames.FrameType.FRAGMENT] * 4
            + [frames.FrameType.FRAGMENTS]
            + [frames.FrameType.FRAGMENT] * 6
        )
    else:
        assert kinds == [frames.FrameType.FRAGMENTS]
    expected = [Fragment(p) for p in payloads]
    for receiver_lanes in (True, False):
        digests.use_lanes(receiver_lanes and digests.COMPILED)
        i, a = open_pair(pki)
        digests.use_lanes(md5_path == "lanes")
        data = b"".join(i.send_fragments(_whole(payloads)))
        digests.use_lanes(receiver_lanes and digests.COMPILED)
        rng = random.Random(len(data))
        got: list[object] = []
        pos = 0
        while pos < len(data):
            step = rng.choice((5, 22, 1000, 40_000, 65_536, 262_144))
            got += a.receive_data(data[pos : pos + step])
            pos += step
        assert got == expected


@pytest.mark.parametrize("encrypt", [True, False])
def test_frames_sealed_together_are_byte_for_byte_those_sealed_one_by_one(encrypt: bool) -> None:
    """R-DLG-8: the signatures taken together (compiled lanes or hashlib) make the same
    frames as sealing each payload alone, in both protection modes."""
    key = bytes(range(32))
    payloads = [(int(frames.FrameType.FRAGMENT), [b"head", p]) for p in _large_payloads(9)]
    together = security.FrameSealer(key, encrypt, 2).seal_each(payloads, 100)
    alone = security.FrameSealer(key, encrypt, 2)
    one_by_one = [
        alone.seal_pieces(frame_type, pieces, 100 + n)
        for n, (frame_type, pieces) in enumerate(payloads)
    ]
    assert [bytes(f) for f in together] == [bytes(f) for f in one_by_one]


def test_a_bad_frame_among_those_of_a_read_fails_alone_and_in_its_place(
    pki: Pki, md5_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-DLG-8: in one read of six large frames, one whose MD5 signature is not its
    payload's (a sender that signed it wrong) and one altered on the way are each an
    IntegrityFailure where they stood; the four others are handed up in order."""
    if md5_path != "lanes":
        pytest.skip("without lanes large fragments share a frame")
    payloads = _large_payloads(6)
    real = security.md5_each

    def third_signed_wrong(buffers: list[bytes]) -> list[bytes]:
        signatures = real(buffers)
        signatures[2] = bytes(16)
        return signatures

    i, a = open_pair(pki)
    monkeypatch.setattr(security, "md5_each", third_signed_wrong)
    sent = i.send_fragments(_whole(payloads))
    monkeypatch.undo()
    assert len(sent) == 6
    altered = bytearray(sent[4])
    altered[frames.HEADER_SIZE + 100] ^= 0x01
    sent[4] = altered
    events = a.receive_data(b"".join(sent))
    assert [type(e) for e in events] == [
        Fragment,
        Fragment,
        IntegrityFailure,
        Fragment,
        IntegrityFailure,
        Fragment,
    ]
    assert [e.payload for e in events if isinstance(e, Fragment)] == [
        payloads[n] for n in (0, 1, 3, 5)
    ]
    failures = [e for e in events if isinstance(e, IntegrityFailure)]
    assert failures[0].reason == security.MD5_MISMATCH
    assert "authentication tag" in failures[1].reason
    assert a.stats.integrity_failures == 2
    assert a.state is State.OPEN
    # The wrongly signed frame's tag was good: its counter counts as received, and a
    # copy of it is refused as a replay.
    (again,) = a.receive_data(bytes(sent[2]))
    assert isinstance(again, IntegrityFailure) and "replayed" in again.reason
