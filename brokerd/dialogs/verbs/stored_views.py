"""The views read from the database files: a queue's rows with their status (R-OBJ-3)
and the oldest message waiting in each conversation (R-PROTO-4, Decision).

A mirror partner's database is left out: it holds no image, and its views list no
conversation or message of it (R-ROUTE-16).

May import: ``brokerd.dialogs`` models, ``brokerd.dialogs.verbs.paging``,
``brokerd.storage``, ``protocol``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.verbs.paging import PageRequest, int_part, parse_cursor
from brokerd.storage import queries
from protocol.errors import InvalidRequest

QUEUE_STATUS = {
    0: "received (retained)",
    1: "ready",
    2: "not yet complete",
    3: "sent (retained)",
}
"""A queue row's ``status`` (as SQL Server's queues have it, R-OBJ-3), in words."""
QUEUE_VIEW_KEY = ("database", "conversation_handle", "message_sequence_number")
WAITING_VIEW_KEY = ("oldest_enqueued_at", "database", "conversation_handle", "waiting_in")
_BEFORE_ANY = -(1 << 63)


def iso_us(t: float) -> str:
    """A wall-clock time as ISO 8601 in UTC, to the microsecond always (so it sorts)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="microseconds")


def _served(databases: Iterable[Database]) -> list[Database]:
    return sorted((db for db in databases if db.mirror_role != "mirror"), key=lambda d: d.name)


async def queue_messages(
    databases: Iterable[Database], queue: str, request: PageRequest
) -> list[dict[str, Any]]:
    """The ``queue_messages`` view: the rows of every queue named ``queue``, with their
    status, conversation, sequence number, type and size, by database, handle and
    sequence number, read from the file a page at a time (``limit + 1`` rows).
    ``quarantined`` tells a message set aside by poison-message handling: SQL Server's
    status stays 1 (ready), but no RECEIVE hands it out until the quarantine is released."""
    served = [db for db in _served(databases) if queue in db.catalog.queues]
    if not served:
        raise InvalidRequest(f"no database has a queue {queue!r}")
    after_db, after_handle, after_seq = "", "", _BEFORE_ANY
    if request.after:
        parts = parse_cursor(request.after, 3)
        after_db, after_handle, after_seq = parts[0], parts[1], int_part(parts[2])
    rows: list[dict[str, Any]] = []
    for db in served:
        if db.name < after_db:
            continue
        handle, seq = (after_handle, after_seq) if db.name == after_db else ("", _BEFORE_ANY)
        wanted = request.limit + 1 - len(rows)
        found = await db.store.query(queries.READ_QUEUE_PAGE, (handle, seq, queue, wanted))
        quarantined = db.poison.quarantined
        rows += (
            {
                "database": db.name,
                "queue": queue,
                "conversation_handle": str(h),
                "conversation_group_id": str(group),
                "message_sequence_number": int(s),
                "status": int(status),
                "status_text": QUEUE_STATUS.get(int(status), "unknown"),
                "service": service,
                "message_type": message_type,
                "size": int(length),
                "enqueued_at": iso_us(float(enqueued_at)),
                "quarantined": bool(quarantined) and uuid.UUID(str(h)) in quarantined,
            }
            for h, s, group, status, service, message_type, length, enqueued_at in found
        )
        if len(rows) > request.limit:
            break
    return rows


async def oldest_waiting(databases: Iterable[Database], now: float) -> list[dict[str, Any]]:
    """The ``oldest_waiting`` view: per conversation, its oldest message waiting (in its
    queue, not yet received; or in the transmission queue, not yet acknowledged), how
    many wait there and for how long, oldest first: a leak shows at the top."""
    rows: list[dict[str, Any]] = []
    for db in _served(databases):
        in_queues = await db.store.query(queries.READ_WAITING_IN_QUEUES)
        to_send = await db.store.query(queries.READ_WAITING_TO_SEND)
        found = [(*row[:4], f"queue {row[4]}") for row in in_queues]
        found += [(*row[:4], "transmission_queue") for row in to_send]
        rows += (
            {
                "database": db.name,
                "conversation_handle": str(handle),
                "waiting_in": where,
                "waiting": int(count),
                "oldest_sequence_number": int(seq),
                "oldest_enqueued_at": iso_us(float(at)),
                "age_seconds": round(max(0.0, now - float(at)), 1),
            }
            for handle, seq, at, count, where in found
        )
    return rows
