"""What poison-message handling knows of one database (SPEC §6, R-OBJ-3): each received
message's rollback count and the last reason given, and the conversations quarantined.

A :class:`PoisonLedger` is the in-memory image of the ``message_rollbacks`` and
``quarantined_conversations`` tables (:mod:`brokerd.storage.poison_rows`), loaded by
recovery and changed by the poison verbs (:mod:`brokerd.dialogs.verbs.poison`): a
rollback's counts and quarantine at once (so the next rollback counts from them, and no
RECEIVE takes a message just quarantined), with their write in flight; the views that
show them wait for that write. The messages
of a quarantined conversation are set aside by its queue's ready index
(:meth:`~brokerd.dialogs.endpoints.ready.ReadyIndex.set_aside`).

May import: ``brokerd.dialogs.endpoints.ready`` (the item type) and the standard library.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from brokerd.dialogs.endpoints.ready import Item


@dataclass(slots=True)
class Rollbacks:
    """How many times one message was rolled back, and the last reason given."""

    count: int
    last_error: str


@dataclass(slots=True)
class Quarantine:
    """A conversation set aside for one message rolled back too often."""

    handle: uuid.UUID
    seq: int
    """The failing message's sequence number."""
    message_type: str
    rollbacks: int
    last_error: str
    since: float
    """Wall-clock time it was quarantined."""


@dataclass
class PoisonLedger:
    """Rollback counts by message, and quarantined conversations by handle."""

    counts: dict[Item, Rollbacks] = field(default_factory=dict)
    quarantined: dict[uuid.UUID, Quarantine] = field(default_factory=dict)

    def forget_conversation(self, handle: uuid.UUID) -> None:
        """Every count of a conversation's messages goes (released, or ended)."""
        for item in [item for item in self.counts if item[0] == handle]:
            del self.counts[item]
