"""Liveness of one adjacent-broker connection: heartbeats and a silence deadline (SPEC R-PROTO-5).

A connection that goes silent without a reset (a partition, a hung peer, a
middlebox that drops everything) must not hold its dialogs until the idle
timeout. So once a connection is OPEN, each side sends a KEEPALIVE frame
(``frames.FrameType.KEEPALIVE``, empty protected body) whenever it has sent
nothing for ``heartbeat_interval``, and closes the connection when it has
received nothing at all (no byte of any frame, heartbeats included) for
``deadline``. The owner of an outgoing connection then dials again.

Sans-I/O like the rest of ``protocol/``: no clock is read here; every method
takes ``now`` (seconds on one monotonic clock of the caller's choosing), and
:meth:`Liveness.poll` says what to do; the caller sends the heartbeat (with
``BrokerConnection.send(Keepalive())``) or closes the connection.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class LivenessAction(enum.Enum):
    NONE = "none"
    HEARTBEAT = "heartbeat"
    """Nothing was sent for the heartbeat interval: send a KEEPALIVE now."""
    DEAD = "dead"
    """Nothing was received for the deadline: close the connection."""


@dataclass(frozen=True)
class LivenessSettings:
    heartbeat_interval: float = 5.0
    """Send a heartbeat after this many seconds without sending anything."""
    deadline: float = 20.0
    """Close the connection after this many seconds without receiving anything."""

    def __post_init__(self) -> None:
        if not self.heartbeat_interval > 0:
            raise ValueError("heartbeat_interval must be positive")
        if not self.deadline > self.heartbeat_interval:
            raise ValueError("deadline must exceed heartbeat_interval")


class Liveness:
    """Heartbeat and deadline bookkeeping for one open connection."""

    def __init__(self, settings: LivenessSettings, now: float) -> None:
        self.settings = settings
        self.last_heard = now
        self.last_sent = now

    def heard(self, now: float) -> None:
        """Bytes arrived from the peer (any frame, or part of one)."""
        self.last_heard = max(self.last_heard, now)

    def sent(self, now: float) -> None:
        """Bytes were written to the peer (a heartbeat or any other frame)."""
        self.last_sent = max(self.last_sent, now)

    def silence(self, now: float) -> float:
        """Seconds since anything arrived."""
        return max(0.0, now - self.last_heard)

    def poll(self, now: float) -> LivenessAction:
        """What the connection must do at ``now``; the deadline wins over a heartbeat."""
        if now - self.last_heard >= self.settings.deadline:
            return LivenessAction.DEAD
        if now - self.last_sent >= self.settings.heartbeat_interval:
            return LivenessAction.HEARTBEAT
        return LivenessAction.NONE

    def next_due(self) -> float:
        """The earliest time at which :meth:`poll` may return something else than NONE."""
        s = self.settings
        return min(self.last_heard + s.deadline, self.last_sent + s.heartbeat_interval)
