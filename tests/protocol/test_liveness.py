"""Heartbeats and the silence deadline of an open connection (protocol/liveness.py).

SPEC R-PROTO-5: an open connection sends a KEEPALIVE after ``heartbeat_interval``
without sending anything, and is closed after ``deadline`` without receiving
anything. Sans-I/O: a simulated clock, and two connections paired through an
in-memory link (tests/conftest.py) that a test can partition.
"""

from __future__ import annotations

import pytest

from protocol import BrokerConnection, frames
from protocol.events import Fragment, Keepalive
from protocol.liveness import Liveness, LivenessAction, LivenessSettings
from protocol.security import PROTECTION_OVERHEAD
from tests.conftest import Pki, open_pair

SETTINGS = LivenessSettings(heartbeat_interval=5.0, deadline=20.0)


def test_defaults_and_settings_are_checked() -> None:
    assert LivenessSettings() == SETTINGS
    with pytest.raises(ValueError, match="positive"):
        LivenessSettings(heartbeat_interval=0.0)
    with pytest.raises(ValueError, match="exceed"):
        LivenessSettings(heartbeat_interval=5.0, deadline=5.0)


def test_heartbeat_after_the_interval_without_sending() -> None:
    live = Liveness(SETTINGS, now=100.0)
    assert live.poll(104.9) is LivenessAction.NONE
    assert live.poll(105.0) is LivenessAction.HEARTBEAT
    live.sent(105.0)
    assert live.poll(109.9) is LivenessAction.NONE
    assert live.next_due() == 110.0


def test_dead_after_the_deadline_without_receiving_even_while_sending() -> None:
    live = Liveness(SETTINGS, now=0.0)
    for t in range(0, 20, 5):  # heartbeats go out, nothing comes back
        live.sent(float(t))
        assert live.poll(float(t)) is LivenessAction.NONE
    assert live.poll(19.99) is LivenessAction.NONE
    assert live.poll(20.0) is LivenessAction.DEAD
    assert live.silence(20.0) == 20.0


def test_anything_heard_postpones_the_deadline() -> None:
    live = Liveness(SETTINGS, now=0.0)
    live.heard(15.0)
    live.sent(15.0)
    assert live.poll(34.9) is not LivenessAction.DEAD
    assert live.poll(35.0) is LivenessAction.DEAD
    live.heard(10.0)  # a late report never moves the clock back
    assert live.last_heard == 15.0
    assert live.next_due() == 20.0  # the next heartbeat comes before the deadline


def _tick(
    now: float,
    sender: BrokerConnection,
    live: Liveness,
    peer: BrokerConnection,
    peer_live: Liveness,
    partitioned: bool,
) -> LivenessAction:
    """One poll of ``sender``'s liveness; a heartbeat crosses to ``peer`` unless partitioned."""
    action = live.poll(now)
    if action is LivenessAction.HEARTBEAT:
        frame = sender.send(Keepalive())
        live.sent(now)
        if not partitioned:
            assert peer.receive_data(frame) == [Keepalive()]
            peer_live.heard(now)
    return action


def test_heartbeats_keep_a_quiet_pair_alive_and_a_partition_is_found(pki: Pki) -> None:
    """Two open connections exchange only heartbeats: neither side ever reaches the
    deadline; once the link between them drops everything, both do, at the deadline."""
    i, a = open_pair(pki)
    li, la = Liveness(SETTINGS, 0.0), Liveness(SETTINGS, 0.0)
    now = 0.0
    while now < 300.0:
        assert _tick(now, i, li, a, la, False) is not LivenessAction.DEAD
        assert _tick(now, a, la, i, li, False) is not LivenessAction.DEAD
        now += 0.5
    cut = now
    outcomes: dict[str, float] = {}
    while len(outcomes) < 2:
        for name, (s, ls, p, lp) in {"i": (i, li, a, la), "a": (a, la, i, li)}.items():
            if name not in outcomes and _tick(now, s, ls, p, lp, True) is LivenessAction.DEAD:
                outcomes[name] = now
        now += 0.5
    last_heartbeat_before_cut = cut - 0.5
    for when in outcomes.values():
        assert cut <= when <= last_heartbeat_before_cut + SETTINGS.deadline + 0.5


def test_a_heartbeat_is_one_protected_keepalive_frame_with_an_empty_body(pki: Pki) -> None:
    i, a = open_pair(pki)
    frame = i.send(Keepalive())
    (header,) = frames.iter_frame_headers(frame)
    assert header.frame_type == frames.FrameType.KEEPALIVE
    assert header.flags == frames.FrameFlags.PROTECTED | frames.FrameFlags.ENCRYPTED
    assert header.length == len(frame) - frames.HEADER_SIZE == PROTECTION_OVERHEAD
    # Between dialog frames it takes its place in the counter sequence like any frame.
    data = i.send(Fragment(b"x")) + i.send(Keepalive()) + i.send(Fragment(b"y"))
    assert a.receive_data(frame + data) == [
        Keepalive(),
        Fragment(b"x"),
        Keepalive(),
        Fragment(b"y"),
    ]
