"""The dialog engine's counters, shown by the ``stats`` view."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

DROP_REASONS_KEPT = 100
"""Drop reasons the ``drops`` view shows: the latest ones."""


@dataclass
class EngineStats:
    sent_messages: int = 0
    delivered_messages: int = 0
    received_by_application: int = 0
    rollbacks_counted: int = 0
    """Received messages put back by a ROLLBACK (or a lost client connection) and counted
    against poison-message handling (SPEC §6)."""
    poison_quarantined: int = 0
    """Conversations quarantined for a message rolled back too often."""
    poison_released: int = 0
    poison_ended: int = 0
    """Quarantined conversations released, and ended with an error."""
    poison_queues_disabled: int = 0
    """Queues disabled by ``poison_message_handling = "disable"``."""
    fragments_sent: int = 0
    fragments_received: int = 0
    fragments_in_runs: int = 0
    """Of those, the ones that followed a run's first in the same turn, with nothing new
    to check beyond their own contract and validation (queued, or relayed by a
    forwarder, without a new decision): see ``local_arrivals`` and ``remote_arrivals``."""
    retransmissions: int = 0
    duplicates: int = 0
    recut_messages: int = 0
    """Messages whose held fragments were dropped because the message arrived cut at
    another fragment size (its sender cut it again, R-DLG-7)."""
    fragments_refused: int = 0
    """Fragments of messages of several dropped for what they say of their message
    (R-DLG-7): not of a cut at one size, cut below the least fragment size, or naming
    another length than the fragments held of it."""
    partial_refusals: int = 0
    """First fragments of messages of several dropped while their database held
    ``limits.partial_messages`` partial messages (the sender sends them again)."""
    acks_sent: int = 0
    """Acknowledgements given to connections to send; one that a newer one of the same
    endpoint replaced while the connection's writes were stopped is counted too."""
    acks_received: int = 0
    corrupted_messages: int = 0
    dropped: int = 0
    broker_errors_sent: int = 0
    """Broker errors given to connections to send (R-DLG-2); one a connection dropped
    because too many already waited is counted too, and in its ``broker_errors_dropped``."""
    binding_refusals: int = 0
    """Messages, acknowledgements and errors refused because they did not come from the
    broker the conversation is bound to (R-DLG-14)."""
    dialog_security_refusals: int = 0
    """Frames of secured dialogs refused: altered, not sealed with the dialog key, or not
    secured at all (R-DLG-14)."""
    closed_endpoints_removed: int = 0
    """Closed endpoints removed from memory and from their files (SPEC §5)."""
    drop_reasons: deque[str] = field(default_factory=lambda: deque(maxlen=DROP_REASONS_KEPT))
    """The latest reasons a message was dropped (the ``drops`` view)."""
