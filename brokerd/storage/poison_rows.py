"""The rows of poison-message handling (SPEC §6; schema step 9): how many times each
received message was rolled back (``message_rollbacks``), and the conversations set
aside for a message rolled back too often (``quarantined_conversations``).

Owns the statements that write and read those two tables. The counts are written with
the rollback that makes them (the ROLLBACK's answer waits for that commit), so a daemon
restarted, even by ``kill -9``, goes on counting from where it stood.

May import: ``brokerd.storage.schema`` (the standard library otherwise).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from brokerd.storage.schema import Statement

_COUNT = (
    "INSERT OR REPLACE INTO message_rollbacks "
    "(conversation_handle, message_sequence_number, rollbacks, last_error) VALUES (?, ?, ?, ?)"
)
_FORGET_COUNT = (
    "DELETE FROM message_rollbacks WHERE conversation_handle = ? AND message_sequence_number = ?"
)
_FORGET_COUNTS_OF = "DELETE FROM message_rollbacks WHERE conversation_handle = ?"
_FORGET_COUNTS_OF_QUEUE = (
    "DELETE FROM message_rollbacks WHERE conversation_handle IN "
    "(SELECT conversation_handle FROM queue_messages WHERE queue_name = ?)"
)
_QUARANTINE = (
    "INSERT OR REPLACE INTO quarantined_conversations (conversation_handle, "
    "message_sequence_number, message_type, rollbacks, last_error, quarantined_at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
_RELEASE = "DELETE FROM quarantined_conversations WHERE conversation_handle = ?"

READ_COUNTS = (
    "SELECT r.conversation_handle, r.message_sequence_number, r.rollbacks, r.last_error "
    "FROM message_rollbacks r JOIN queue_messages q "
    "ON q.conversation_handle = r.conversation_handle "
    "AND q.message_sequence_number = r.message_sequence_number AND q.status = 1"
)
"""The counts of messages still ready in their queue (a count whose message is gone, or
retained after it was received, is stale)."""
READ_QUARANTINED = (
    "SELECT conversation_handle, message_sequence_number, message_type, rollbacks, "
    "last_error, quarantined_at FROM quarantined_conversations"
)

ANY_ROWS = (
    "SELECT EXISTS (SELECT 1 FROM message_rollbacks), "
    "EXISTS (SELECT 1 FROM quarantined_conversations)"
)
"""Whether there is anything for :data:`SWEEP` to look at."""

SWEEP: list[Statement] = [
    (
        "DELETE FROM message_rollbacks WHERE NOT EXISTS (SELECT 1 FROM queue_messages q "
        "WHERE q.conversation_handle = message_rollbacks.conversation_handle "
        "AND q.message_sequence_number = message_rollbacks.message_sequence_number "
        "AND q.status = 1)",
        (),
    ),
    (
        "DELETE FROM quarantined_conversations WHERE conversation_handle NOT IN "
        "(SELECT conversation_handle FROM conversation_endpoints)",
        (),
    ),
]
"""Run after recovery: the counts of messages that left their queue without a commit that
knew of the count (an autocommit RECEIVE, an END CONVERSATION), and the quarantine of a
conversation that is gone."""


def counted(handle: uuid.UUID, seq: int, rollbacks: int, last_error: str) -> Statement:
    """A message's rollback count, and the last reason given."""
    return (_COUNT, (str(handle), seq, rollbacks, last_error))


def forget_counts(items: Iterable[tuple[uuid.UUID, int]]) -> list[Statement]:
    """Messages that left the queue (received and committed): their counts go."""
    return [(_FORGET_COUNT, (str(handle), seq)) for handle, seq in items]


def forget_counts_of_queue(queue: str) -> Statement:
    """A queue turned on again: every count of its messages starts over (SPEC §6)."""
    return (_FORGET_COUNTS_OF_QUEUE, (queue,))


def quarantine(
    handle: uuid.UUID, seq: int, message_type: str, rollbacks: int, last_error: str, at: float
) -> Statement:
    return (_QUARANTINE, (str(handle), seq, message_type, rollbacks, last_error, at))


def release(handle: uuid.UUID) -> list[Statement]:
    """A conversation leaves quarantine: its row and its messages' counts go."""
    return [(_RELEASE, (str(handle),)), (_FORGET_COUNTS_OF, (str(handle),))]
