"""Events of the adjacent-broker connection (``protocol/connection.py``).

``BrokerConnection.receive_data`` returns these; ``BrokerConnection.send`` takes
the sendable ones (marked below). Small frozen dataclasses, no construct
containers: the codec stops at the connection.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from protocol.errors import CloseCode
from protocol.frames import MirrorRole


@dataclass(frozen=True, slots=True)
class HandshakeComplete:
    """Received once: both sides authenticated each other and hold session keys."""

    peer_instance: str
    version: int
    encrypted: bool
    peer_max_frame_size: int


@dataclass(frozen=True, slots=True)
class Fragment:
    """Sendable. One dialog message fragment (its bytes are ``protocol/dialog.py``'s)."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class Ack:
    """Sendable. Dedicated acknowledgements (dialog-layer bytes)."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class Keepalive:
    """Sendable. Keeps an otherwise idle connection known to be alive."""


@dataclass(frozen=True, slots=True)
class Close:
    """Sendable. The connection ends; ``code`` and ``reason`` say why."""

    code: CloseCode
    reason: str


@dataclass(frozen=True, slots=True)
class PrincipalQuery:
    """Sendable. Is this instance principal for the database of (broker instance, service)?

    SPEC R-ROUTE-10. The nil UUID when the route names no broker instance: the
    database holding ``service`` is meant. ``epoch``: the highest mirroring epoch the
    asker has seen for the pair (R-ROUTE-15); a principal at a lower epoch learns from it
    that it has been superseded.
    """

    query_id: int
    broker_instance: uuid.UUID
    service: str
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class PrincipalAnswer:
    """Sendable. This instance's role for the queried database (SPEC R-ROUTE-10).

    ``query_id`` 0: unsolicited, sent by a mirror that refused a message. ``epoch``: the
    answering partner's mirroring epoch (R-ROUTE-15); senders prefer the highest.
    """

    query_id: int
    role: MirrorRole
    broker_instance: uuid.UUID
    service: str
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class Mirror:
    """Sendable and received: a database mirroring message (R-ROUTE-16), its bytes
    decoded by ``protocol.mirroring``."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class IntegrityFailure:
    """Received: a frame failed its integrity check and was dropped (SPEC R-DLG-8).

    The frame is never handed up and must not be acknowledged; the sender's
    retransmission brings the content again. Reported as ``corrupted_message``.
    """

    frame_type: int
    counter: int
    reason: str


Event = (
    HandshakeComplete
    | Fragment
    | Ack
    | Keepalive
    | Close
    | PrincipalQuery
    | PrincipalAnswer
    | Mirror
    | IntegrityFailure
)
SendableEvent = Fragment | Ack | Keepalive | Close | PrincipalQuery | PrincipalAnswer | Mirror
