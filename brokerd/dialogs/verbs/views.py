"""The daemon's views of its dialogs (``sys.conversation_endpoints``, ``sys.transmission_queue``
and the rest, SPEC R-DLG-12): rows computed from the in-memory image, without I/O. The
endpoints view is paged from the image (R-PROTO-4, Decision; ``verbs.paging``), and the
``endpoint_ages`` view counts endpoints by state and age, so that a leak shows.

May import: ``brokerd.dialogs`` models, ``brokerd.dialogs.verbs.paging``,
``brokerd.storage``, ``protocol``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage
from brokerd.dialogs.verbs.paging import PageRequest, smallest_after
from brokerd.storage.reads import SentRow
from protocol.dialog import END_DIALOG, ERROR, FLAG_END_DIALOG, FLAG_ERROR


def _iso(t: float) -> str:
    """A wall-clock time as ISO 8601 in UTC; empty for 0 (none)."""
    return datetime.fromtimestamp(t, UTC).isoformat() if t else ""


def _sent_status(msg: OutMessage) -> str:
    if msg.due == math.inf:
        return (
            f"handed to {msg.sent_via} (attempt {msg.attempts}); waiting to be written: the "
            "connection is busy with the messages before it"
        )
    return (
        f"sent to {msg.sent_via} (attempt {msg.attempts}); waiting for acknowledgement, "
        f"resent in {msg.retry_wait:g} s if none"
    )


AGE_BUCKETS: tuple[tuple[float, str], ...] = (
    (60.0, "under 1 min"),
    (600.0, "1-10 min"),
    (3600.0, "10-60 min"),
    (86400.0, "1-24 h"),
    (math.inf, "over 24 h"),
)
"""An endpoint's age (since it was created) by bucket: up to the bound, its label."""
ENDPOINTS_VIEW_KEY = ("conversation_handle",)
AGES_VIEW_KEY = ("database", "state", "age_rank")


def conversation_endpoints(
    databases: Iterable[Database], request: PageRequest | None = None
) -> list[dict[str, Any]]:
    """One row per endpoint; ``lifetime`` and ``dialog_timer`` are when the dialog's
    lifetime passes (R-DLG-9) and when its timer fires (R-DLG-11), empty if none. With
    ``request``, only the ``limit + 1`` endpoints after its cursor, by handle."""
    pairs: Iterable[tuple[Database, Endpoint]] = (
        (db, ep) for db in databases for ep in db.endpoints.values()
    )
    if request is not None:
        pairs = smallest_after(pairs, lambda pair: pair[1].handle_text, request)
    return [_endpoint_row(db, ep) for db, ep in pairs]


def endpoint_ages(databases: Iterable[Database], now: float) -> list[dict[str, Any]]:
    """The ``endpoint_ages`` view: per database, state and age bucket (:data:`AGE_BUCKETS`),
    how many endpoints and when the oldest of them was created."""
    counts: dict[tuple[str, str, int], list[float]] = {}
    for db in databases:
        for ep in db.endpoints.values():
            age = now - ep.created_at
            rank = next(i for i, (bound, _) in enumerate(AGE_BUCKETS) if age < bound)
            entry = counts.setdefault((db.name, ep.state.value, rank), [0, ep.created_at])
            entry[0] += 1
            entry[1] = min(entry[1], ep.created_at)
    return [
        {
            "database": database,
            "state": state,
            "age_rank": rank,
            "age": AGE_BUCKETS[rank][1],
            "endpoints": int(count),
            "oldest_created_at": _iso(oldest),
        }
        for (database, state, rank), (count, oldest) in sorted(counts.items())
    ]


def _endpoint_row(db: Database, ep: Endpoint) -> dict[str, Any]:
    return {
        "database": db.name,
        "conversation_handle": str(ep.handle),
        "conversation_id": str(ep.conversation_id),
        "conversation_group_id": str(ep.group_id),
        "is_initiator": ep.initiator,
        "service": ep.service,
        "far_service": ep.far_service,
        "far_broker_instance": str(ep.far_broker_instance or ""),
        "bound_to": ep.far_peer,
        "secured": ep.keys is not None,
        "contract": ep.contract,
        "state": ep.state.value,
        "lifetime": _iso(ep.lifetime_ends),
        "dialog_timer": _iso(ep.timer_due),
        "route": ep.route.route or "" if ep.route else "",
        "send_sequence": ep.send_sequence,
        "receive_sequence": ep.accepted.through,
        "unacknowledged": ep.unacknowledged,
    }


@dataclass(frozen=True)
class PeerBacklog:
    """The transmission queue's messages for one far broker instance (or far service,
    before a broker answered): how many, and when the oldest was enqueued, with its
    status text."""

    peer: str
    messages: int
    oldest_enqueued_at: float
    status: str


@dataclass(frozen=True)
class TransmissionBacklog:
    """What the admin port shows of the transmission queue without listing it whole (a
    backlog of a million rows is read from the file by the full view): the total, each
    far peer's count and oldest message, and the oldest rows with the view's columns."""

    total: int
    peers: list[PeerBacklog]
    """Oldest first."""
    oldest: list[dict[str, Any]]
    """The ``transmission_queue`` view's rows of the oldest messages, oldest first."""


@dataclass
class Head:
    """An endpoint's share of the transmission queue: its message count, and its oldest
    message's enqueue time and status."""

    db: Database
    ep: Endpoint
    messages: int
    enqueued_at: float
    status: str


def peer_of(ep: Endpoint) -> str:
    """The far broker instance, or the far service while none has answered."""
    return str(ep.far_broker_instance or "") or f"service {ep.far_service}"


def head_of(db: Database, ep: Endpoint) -> Head | None:
    """``ep``'s share from memory; None when its oldest message is only in the file (its
    backlog alone: :func:`backlog_head`) or it has none."""
    if not ep.outbox:
        return None
    oldest = min(ep.outbox.values(), key=lambda m: m.enqueued_at)
    status = _sent_status(oldest) if oldest.sent_via else ep.waiting_status
    return Head(db, ep, len(ep.outbox) + len(ep.backlog), oldest.enqueued_at, status)


def backlog_head(db: Database, ep: Endpoint, first: SentRow) -> Head:
    """``ep``'s share when its messages are all in the file; ``first``, the row of its
    lowest sequence number."""
    return Head(db, ep, len(ep.backlog), first[4], ep.waiting_status)


def by_peer(
    heads: Iterable[Head], held: Iterable[tuple[int, list[dict[str, Any]]]]
) -> list[PeerBacklog]:
    """The heads (and the messages ``held`` for queues that are off: per database, how
    many, and rows of them that include its oldest) by far peer, oldest first."""
    out: dict[str, tuple[int, float, str]] = {}
    for h in heads:
        key = peer_of(h.ep)
        n, t, status = out.get(key, (0, math.inf, ""))
        out[key] = (n + h.messages, *min((t, status), (h.enqueued_at, h.status)))
    for count, rows in held:
        for row in rows:
            key = str(row["to_broker_instance"])
            n, t, status = out.get(key, (0, math.inf, ""))
            at = datetime.fromisoformat(row["enqueued_at"]).timestamp() if row["enqueued_at"] else 0
            out[key] = (n, *min((t, status), (at, str(row["transmission_status"]))))
        if rows:
            key = str(rows[0]["to_broker_instance"])
            n, t, status = out[key]
            out[key] = (n + count, t, status)
    peers = [PeerBacklog(k, n, t, status) for k, (n, t, status) in out.items()]
    return sorted(peers, key=lambda p: p.oldest_enqueued_at)


def oldest_heads(heads: Iterable[Head], n: int) -> list[Head]:
    """The ``n`` endpoints whose oldest messages are the oldest: the only ones whose
    messages can be among the ``n`` oldest."""
    return heapq.nsmallest(n, heads, key=lambda h: h.enqueued_at)


def oldest_rows(head: Head, n: int, backlog: list[SentRow]) -> list[dict[str, Any]]:
    """Up to ``n`` view rows of ``head``'s endpoint, oldest first: its messages in memory,
    then ``backlog`` (rows read from the file)."""
    ep = head.ep
    sent = heapq.nsmallest(n, ep.outbox.values(), key=lambda m: m.enqueued_at)
    paged = [row for row in backlog if row[0] in ep.backlog]
    rows = sent_rows(head.db, ep, sent) + backlog_rows(head.db, ep, paged)
    return rows[:n]


def backlog_rows(db: Database, ep: Endpoint, rows: list[SentRow]) -> list[dict[str, Any]]:
    """``transmission_queue`` rows of messages of ``ep``'s backlog (only in the file):
    ``rows``, as ``reads.read_sent_page`` read them."""
    return [
        {
            "database": db.name,
            "conversation_handle": str(ep.handle),
            "to_service": ep.far_service,
            "to_broker_instance": str(ep.far_broker_instance or ""),
            "message_sequence_number": seq,
            "message_type": message_type,
            "is_conversation_error": bool(flags & FLAG_ERROR),
            "is_end_of_dialog": bool(flags & FLAG_END_DIALOG),
            "size": length,
            "enqueued_at": _iso(enqueued_at),
            "attempts": 0,
            "transmission_status": ep.waiting_status,
        }
        for seq, message_type, flags, length, enqueued_at in rows
    ]


def sent_rows(
    db: Database, ep: Endpoint, messages: Iterable[OutMessage] | None = None
) -> list[dict[str, Any]]:
    """``transmission_queue`` rows of ``ep``'s messages in memory (``messages``, or all of
    them); ``is_conversation_error`` and ``is_end_of_dialog`` mark the Error and EndDialog
    that END CONVERSATION sent."""
    return [
        {
            "database": db.name,
            "conversation_handle": str(ep.handle),
            "to_service": ep.far_service,
            "to_broker_instance": str(ep.far_broker_instance or ""),
            "message_sequence_number": msg.seq,
            "message_type": msg.message_type,
            "is_conversation_error": bool(msg.flags & FLAG_ERROR),
            "is_end_of_dialog": bool(msg.flags & FLAG_END_DIALOG),
            "size": msg.length,
            "enqueued_at": _iso(msg.enqueued_at),
            "attempts": msg.attempts,
            "transmission_status": _sent_status(msg) if msg.sent_via else ep.waiting_status,
        }
        for msg in (ep.outbox.values() if messages is None else messages)
    ]


def held_for_disabled_queues(db: Database, rows: Iterable[Any]) -> list[dict[str, Any]]:
    """``transmission_queue`` rows for messages this database received for a queue that is
    off (R-DLG-12): stored and acknowledged, held until the queue is turned on. ``rows``
    are ``reads.read_held_for``'s."""
    return [
        {
            "database": db.name,
            "conversation_handle": str(handle),
            "to_service": service,
            "to_broker_instance": str(db.broker_instance),
            "message_sequence_number": int(seq),
            "message_type": message_type,
            "is_conversation_error": message_type == ERROR,
            "is_end_of_dialog": message_type == END_DIALOG,
            "size": int(length),
            "enqueued_at": _iso(float(enqueued_at)),
            "attempts": 0,
            "transmission_status": (
                f"received; held until queue {queue!r} is turned on (status off, R-DLG-12)"
            ),
        }
        for handle, seq, service, message_type, length, enqueued_at, queue in rows
    ]


def queues(databases: Iterable[Database]) -> list[dict[str, Any]]:
    return [
        {
            "database": db.name,
            "queue": q.name,
            "status": "on" if q.status else "off",
            "retention": q.retention,
            "ready_messages": db.ready[q.name].count,
            "readers": db.ready[q.name].readers,
            "poison_message_handling": q.poison.handling.value,
            "poison_rollbacks": q.poison.rollbacks,
            "quarantined_conversations": len(db.ready[q.name].aside),
        }
        for db in databases
        for q in db.catalog.queues.values()
        if not q.system
    ]


def quarantined(databases: Iterable[Database]) -> list[dict[str, Any]]:
    """One row per conversation quarantined by poison-message handling (SPEC §6): the
    failing message (sequence number, type), its rollbacks and the last reason given,
    and how many of the conversation's messages are set aside."""
    rows = []
    for db in databases:
        for handle, q in db.poison.quarantined.items():
            ep = db.endpoints.get(handle)
            if ep is None:
                continue  # cleaned up: its row goes at the next start
            queue = db.queue_of(ep.service) or ""
            index = db.ready.get(queue)
            rows.append(
                {
                    "database": db.name,
                    "queue": queue,
                    "conversation_handle": str(handle),
                    "conversation_id": str(ep.conversation_id),
                    "conversation_group_id": str(ep.group_id),
                    "service": ep.service,
                    "far_service": ep.far_service,
                    "state": ep.state.value,
                    "message_sequence_number": q.seq,
                    "message_type": q.message_type,
                    "rollbacks": q.rollbacks,
                    "last_error": q.last_error,
                    "quarantined_at": _iso(q.since),
                    "messages_set_aside": len(index.aside.get(handle, ())) if index else 0,
                }
            )
    return rows


def routes(databases: Iterable[Database]) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    return [
        {
            "database": db.name,
            "name": r.name,
            "remote_service_name": r.remote_service_name or "",
            "broker_instance": str(r.broker_instance or ""),
            "address": r.address,
            "mirror_address": r.mirror_address or "",
            "lifetime": r.lifetime.isoformat() if r.lifetime else "",
            "expired": r.expired(now),
            "source": r.source,
        }
        for db in databases
        for r in db.catalog.routes.values()
    ]


def databases(databases: Iterable[Database]) -> list[dict[str, Any]]:
    return [
        {
            "database": db.name,
            "broker_instance": str(db.broker_instance),
            "file": str(db.store.path),
            "commits": db.store.commits,
            "jobs_committed": db.store.jobs_committed,
            "endpoints": len(db.endpoints),
            **(db.store.bodies.view() if db.store.bodies is not None else {}),
        }
        for db in databases
    ]
