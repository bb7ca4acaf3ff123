"""Property: any bytes fed to a connection yield events or RemoteProtocolError, nothing
else, and the receive buffer stays bounded (docs/design.md: one error tree, bounded buffers).

Three starting points: a fresh acceptor (random bytes and mutated handshakes), an
initiator waiting for HELLO_REPLY, and an OPEN connection fed mutated real frames.
"""

from __future__ import annotations

import datetime as dt

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brokerd.tools.certs import create_ca, identity_for, issue_instance
from protocol import (
    BrokerConnection,
    ConnectionSettings,
    RemoteProtocolError,
    Role,
    frames,
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
from tests.conftest import make_pair, run_handshake

EVENT_TYPES = (
    HandshakeComplete,
    Fragment,
    Ack,
    Keepalive,
    Close,
    PrincipalQuery,
    PrincipalAnswer,
    IntegrityFailure,
)
MAX_FRAME = frames.MIN_MAX_FRAME_SIZE
NOW = dt.datetime.now(dt.UTC)
_CA = create_ca("fuzz CA", now=NOW)
ALPHA = identity_for(issue_instance(_CA, "alpha", now=NOW), _CA)
BETA = identity_for(issue_instance(_CA, "beta", now=NOW), _CA)


def _feed(conn: BrokerConnection, chunks: list[bytes]) -> None:
    for chunk in chunks:
        try:
            events = conn.receive_data(chunk)
        except RemoteProtocolError as exc:
            assert all(isinstance(e, EVENT_TYPES) for e in exc.events)
            assert conn.closed
            return
        assert all(isinstance(e, EVENT_TYPES) for e in events)
        assert conn.buffered_bytes <= frames.HEADER_SIZE + MAX_FRAME
        conn.data_to_send()


def _open_pair() -> tuple[BrokerConnection, BrokerConnection]:
    i, a = make_pair(ALPHA, BETA, max_frame_size=MAX_FRAME)
    run_handshake(i, a)
    return i, a


chunked = st.lists(st.binary(min_size=0, max_size=MAX_FRAME), min_size=1, max_size=8)
fuzz = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fuzz
@given(chunks=chunked)
def test_random_bytes_to_a_fresh_acceptor(chunks: list[bytes]) -> None:
    acceptor = BrokerConnection(
        Role.ACCEPTOR, ConnectionSettings(BETA, max_frame_size=MAX_FRAME), NOW
    )
    _feed(acceptor, chunks)


@fuzz
@given(chunks=chunked)
def test_random_bytes_to_an_initiator_awaiting_the_reply(chunks: list[bytes]) -> None:
    initiator = BrokerConnection(
        Role.INITIATOR, ConnectionSettings(ALPHA, max_frame_size=MAX_FRAME), NOW
    )
    initiator.start()
    _feed(initiator, chunks)


@fuzz
@given(data=st.data())
def test_mutated_hello_to_an_acceptor(data: st.DataObject) -> None:
    i, a = make_pair(ALPHA, BETA, max_frame_size=MAX_FRAME)
    hello = bytearray(i.start())
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(hello) - 1))
        hello[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(hello)))
    _feed(a, [bytes(hello[:cut]), bytes(hello[cut:])])


@fuzz
@given(
    payloads=st.lists(st.binary(max_size=2000), min_size=1, max_size=5),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=4),
    junk=st.binary(max_size=64),
    split=st.integers(0, 10**6),
)
def test_mutated_frames_to_an_open_connection(
    payloads: list[bytes], flips: list[tuple[int, int]], junk: bytes, split: int
) -> None:
    i, a = _open_pair()
    stream = bytearray(b"".join(i.send(Fragment(p)) for p in payloads) + junk)
    for position, mask in flips:
        stream[position % len(stream)] ^= mask
    cut = split % (len(stream) + 1)
    delivered: list[bytes] = []
    for chunk in (bytes(stream[:cut]), bytes(stream[cut:])):
        try:
            events = a.receive_data(chunk)
        except RemoteProtocolError as exc:
            events = exc.events
        delivered += [e.payload for e in events if isinstance(e, Fragment)]
        assert a.buffered_bytes <= frames.HEADER_SIZE + MAX_FRAME
        if a.closed:
            break
    # Whatever got through is genuine: a subsequence of what was sent, in order.
    remaining = iter(payloads)
    assert all(any(p == q for q in remaining) for p in delivered)
    if not flips:
        assert delivered == payloads
