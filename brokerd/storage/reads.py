"""The reads of a database file: functions of a connection that return rows.

Owns (SPEC R-DLG-1, R-DLG-7, R-DLG-12; docs/design.md "Storage") the reads the store's
committer thread runs as functions of its :class:`sqlite3.Connection` (see
:mod:`brokerd.storage.committer`): a page of a conversation's unacknowledged messages and
their bodies (read back when sent), RECEIVE's rows (and their removal, as RECEIVE
reads them), the ready messages of queues that are off, and the fragments of a message
being reassembled. A body a row says is in a segment file is read from there
(:mod:`brokerd.storage.body_files`), and the body of a message kept in its fragments
(``schema.IN_FRAGMENTS``) is joined from them.

The reads the store runs as they are, at recovery (``READ_ENDPOINTS``, ``READ_HELD``,
...), stay beside the writes of their tables in :mod:`brokerd.storage.queries`.

May import: ``brokerd.storage.schema``, ``brokerd.storage.sequence_runs`` and
``brokerd.storage.body_files``.
"""

from __future__ import annotations

import errno
import sqlite3
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, repeat
from typing import Any

import orjson

from brokerd.storage.body_files import BodyFileError, BodyFiles, read_stored
from brokerd.storage.schema import IN_ELSEWHERE
from brokerd.storage.sequence_runs import (
    REMOVE_FRAGMENTS,
    REMOVE_MANY,
    RETAIN_MANY,
    Span,
    by_conversation_keyed,
    by_sequence_numbers,
    chunks,
    numbered,
    over_spans,
    span_chunks,
    spans_join,
)

Rows = Callable[[str, Sequence[Any]], list[sqlite3.Row]]
"""Runs a read and returns its rows (a connection's ``execute(...).fetchall()``)."""

RowStream = Callable[[str, Sequence[Any]], Iterator[tuple[Any, ...]]]
"""Runs a read and yields its rows as plain tuples, one at a time (a cursor with no row
factory): for reads too large to hold as a list, such as recovery's."""


# -- the transmission queue ---------------------------------------------------------------

_READ_SENT_PAGE = (
    "SELECT message_sequence_number, message_type, flags, "
    "coalesce(stored_length, length(body)), enqueued_at "
    "FROM transmission_queue WHERE conversation_handle = ? AND "
    "message_sequence_number BETWEEN ? AND ? ORDER BY message_sequence_number"
)


SentRow = tuple[int, str, int, int, float]
"""An unacknowledged message as a page of a backlog reads it, without its body: sequence
number, message type, flags, length, enqueue time."""


def read_sent_page(conn: sqlite3.Connection, handle: str, first: int, last: int) -> list[SentRow]:
    """A page of unacknowledged messages of a conversation, without bodies (read back
    when sent): sequence number, message type, flags, length, enqueue time."""
    return [
        (int(seq), str(message_type), int(flags), int(length), float(enqueued_at))
        for seq, message_type, flags, length, enqueued_at in conn.execute(
            _READ_SENT_PAGE, (handle, first, last)
        )
    ]


_READ_SENT_BODIES = (
    "SELECT message_sequence_number, body, stored_at, stored_length FROM transmission_queue "
    "WHERE conversation_handle = ? AND message_sequence_number IN "
)


def read_sent_bodies(
    conn: sqlite3.Connection, wanted: dict[str, list[int]], bodies: BodyFiles | None = None
) -> dict[tuple[str, int], bytes]:
    """Bodies of unacknowledged messages, by (conversation handle, sequence number);
    ``bodies``, the database's segment files (:func:`body_files.read_stored`)."""
    found: dict[tuple[str, int], bytes] = {}
    for handle, seqs in wanted.items():
        for part in chunks(seqs):
            marks = ",".join("?" * len(part))
            rows = conn.execute(f"{_READ_SENT_BODIES}({marks})", [handle, *part])
            for seq, body, stored_at, length in rows:
                found[(handle, int(seq))] = _data(conn, bodies, body, stored_at, length)
    return found


# -- service queues --------------------------------------------------------------------------

QUEUED_STORED_AT = (
    "SELECT stored_at, stored_length FROM queue_messages WHERE conversation_handle = ? "
    "AND message_sequence_number = ?"
)
"""RECEIVE: where a row whose body is :data:`IN_ELSEWHERE` has it stored (NULL: in its
fragments, or nowhere for an empty message)."""
_READ_RECEIVED = (
    "SELECT conversation_handle, message_sequence_number, conversation_group_id, "
    "service_name, contract, message_type, body, enqueued_at, queue_name "
    "FROM queue_messages WHERE conversation_handle = ? AND message_sequence_number "
)


_READ_HELD_FOR = (
    "SELECT conversation_handle, message_sequence_number, service_name, message_type, "
    "message_length, enqueued_at, queue_name FROM queue_messages WHERE status = 1 "
    "AND queue_name IN "
)


def read_held_for(conn: sqlite3.Connection, queues: Sequence[str]) -> list[Any]:
    """Ready messages of ``queues`` (queues that are off, R-DLG-12), oldest first."""
    marks = ",".join("?" * len(queues))
    return conn.execute(f"{_READ_HELD_FOR}({marks}) ORDER BY rowid", list(queues)).fetchall()


def read_held_page(
    conn: sqlite3.Connection, queues: Sequence[str], handle: str, seq: int, limit: int
) -> list[Any]:
    """Up to ``limit`` ready messages of ``queues`` (queues that are off, R-DLG-12) after
    (``handle``, ``seq``), in the primary key's order: a page of them, never all."""
    marks = ",".join("?" * len(queues))
    sql = (
        f"{_READ_HELD_FOR}({marks}) AND (conversation_handle, message_sequence_number) > (?, ?) "
        "ORDER BY conversation_handle, message_sequence_number LIMIT ?"
    )
    return conn.execute(sql, [*queues, handle, seq, limit]).fetchall()


_HELD = "FROM queue_messages WHERE status = 1 AND queue_name IN ({marks})"
_HELD_OLDEST = (
    "SELECT conversation_handle, message_sequence_number, service_name, message_type, "
    "message_length, enqueued_at, queue_name {held} AND enqueued_at <= "
    "(SELECT enqueued_at {held} ORDER BY enqueued_at LIMIT 1 OFFSET ?) + ? ORDER BY rowid"
)
HELD_MARGIN = 2e-6
"""Seconds past the ``n``-th oldest enqueue time that :func:`read_held_summary` still
reads: a view shows enqueue times to the microsecond, so rows that far apart may show the
same time, and the reader orders those by the file's order as :func:`read_held_for` does."""


def read_held_summary(
    conn: sqlite3.Connection, queues: Sequence[str], n: int
) -> tuple[int, list[Any]]:
    """How many ready messages ``queues`` (queues that are off, R-DLG-12) hold, and their
    ``n`` oldest (at least one) with those whose enqueue time is within
    :data:`HELD_MARGIN` of the ``n``-th, in :func:`read_held_for`'s order: aggregates and
    a bounded sort in SQLite, never every message held handed to Python."""
    held = _HELD.format(marks=",".join("?" * len(queues)))
    (count,) = conn.execute(f"SELECT count(*) {held}", list(queues)).fetchone()
    if not count:
        return 0, []
    nth = min(max(n, 1), count) - 1
    sql = _HELD_OLDEST.format(held=held)
    oldest = conn.execute(sql, [*queues, *queues, nth, HELD_MARGIN]).fetchall()
    return int(count), oldest


Budget = Callable[[list[dict[str, Any]]], int]
"""How many leading RECEIVE rows the caller can hand on (at least one of a non-empty list).
A body kept in a segment file or in its fragments is, while the budget looks at it, only
its length (``len`` is all a budget may ask of a row's ``message_body``): it is read once
the rows are cut, so that a RECEIVE reads only the bodies it hands on (a TOP of many
large messages, of which one frame carries a few)."""


class _Unread:
    """A RECEIVE row's body not read yet: kept in a segment file (``at``) or in its
    fragments (``at`` None), and how long it is."""

    __slots__ = ("at", "handle", "length", "seq")

    def __init__(self, handle: str, seq: int, at: int | None, length: int) -> None:
        self.handle, self.seq, self.at, self.length = handle, seq, at, length

    def __len__(self) -> int:
        return self.length

    def read(self, conn: sqlite3.Connection, bodies: BodyFiles | None) -> bytes:
        """The body, exactly as long as the budget was told (or an error)."""
        if self.at is not None:
            return read_stored(conn, bodies, self.at, self.length)
        body = _joined_fragments(conn, bodies, self.handle, self.seq)
        if len(body) != self.length:
            raise BodyFileError(
                errno.EIO,
                f"message {self.seq} of conversation {self.handle}: its fragments hold "
                f"{len(body)} bytes, not the {self.length} they add up to",
            )
        return body


_FRAGMENTS_LENGTH = (
    "SELECT total(coalesce(stored_length, length(data))) FROM message_fragments "
    "WHERE conversation_handle = ? AND message_sequence_number = ?"
)


def read_received(
    conn: sqlite3.Connection,
    items: Sequence[tuple[uuid.UUID, int]],
    budget: Budget | None = None,
    remove: bool = False,
    retention: bool = False,
    *,
    bodies: BodyFiles | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """RECEIVE's result rows for ``items``, in their order, and how many items they use.

    ``budget`` (default: no limit) cuts the rows to the leading ones the caller can
    hand on (R-DLG-1: what RECEIVE removes must reach the application, so the cut is
    made before anything is removed). The count returned covers the items of the rows
    kept, and the items without a row among them (a conversation cleaned up meanwhile);
    with ``remove`` exactly those are removed (or retained, with status 0). Indexed
    queries (the primary key), never a scan of the queue: for one conversation one per
    run of numbers; for several one per
    ``sequence_runs.SPANS_PER_STATEMENT`` runs of them all.
    """
    # Keyed by the handle's integer: a UUID's own hash is a Python call, per row.
    found: dict[tuple[int, int], Any] = {}
    conversations, ints = by_conversation_keyed(items)
    spans: list[list[Span]] | None = None
    if len(conversations) > 1:  # many groups' conversations: a few statements for all
        spans = span_chunks(conversations)
        for chunk in spans:
            for r in _received_spans(conn, chunk):
                found[(ints[r[0]], r[1])] = r
    else:
        for key, seqs in conversations.items():
            handle_int = ints[key]
            for sql, params in numbered("", key, seqs):
                for r in _received_rows(conn, sql, params):
                    found[(handle_int, r[1])] = r
    out: list[dict[str, Any]] = []
    positions = []
    in_fragments: set[tuple[uuid.UUID, int]] = set()
    unread = False
    for position, item in enumerate(items):
        row = found.get((item[0].int, item[1]))
        if row is None:
            continue
        positions.append(position)
        body = row[6]
        if body == IN_ELSEWHERE:
            at, length = conn.execute(QUEUED_STORED_AT, (row[0], row[1])).fetchone()
            if at is None:
                in_fragments.add(item)
                (length,) = conn.execute(_FRAGMENTS_LENGTH, (row[0], row[1])).fetchone()
            body = _Unread(row[0], int(row[1]), at, int(length))
            unread = True
        elif type(body) is not bytes:
            body = bytes(body or b"")
        out.append(
            {
                "conversation_handle": row[0],
                "message_sequence_number": int(row[1]),
                "conversation_group_id": row[2],
                "service_name": row[3],
                "service_contract_name": row[4],
                "message_type_name": row[5],
                "message_body": body,
                "message_enqueue_time": float(row[7]),
                "queue": row[8],
            }
        )
    used = len(items)
    if budget is not None and out:
        keep = max(1, min(len(out), budget(out)))
        if keep < len(out):
            out = out[:keep]
            used = positions[keep]
    if unread:  # only the bodies of the rows kept are read (:data:`Budget`)
        for kept in out:
            waiting = kept["message_body"]
            if type(waiting) is _Unread:
                kept["message_body"] = waiting.read(conn, bodies)
    if remove:
        taken = items[:used]
        verb = RETAIN_MANY if retention else REMOVE_MANY
        # Every item taken (no budget cut): the spans just read are the ones removed.
        removal = (
            over_spans(verb, spans)
            if spans is not None and used == len(items)
            else by_sequence_numbers(verb, taken)
        )
        for sql, params in removal:
            conn.execute(sql, params)
        if in_fragments and not retention:
            joined_bodies = [item for item in taken if item in in_fragments]
            for sql, params in by_sequence_numbers(REMOVE_FRAGMENTS, joined_bodies):
                conn.execute(sql, params)
    return out, used


_RECEIVED_BYTES = (
    "SELECT sum(length(body)), count(*) - count(body) FROM queue_messages "
    "WHERE conversation_handle = ? AND message_sequence_number "
)
_RECEIVED_AT_ONCE = (
    "SELECT group_concat(message_sequence_number), group_concat(length(body)), "
    "json_group_array(message_type), json_group_array(printf('%!.17g', enqueued_at)), "
    "CAST(group_concat(body, '') AS BLOB), "
    "min(conversation_group_id), max(conversation_group_id), min(service_name), "
    "max(service_name), min(contract), max(contract), min(queue_name), max(queue_name) "
    "FROM queue_messages WHERE conversation_handle = ? AND message_sequence_number "
)
AT_ONCE_BYTES = 8 * 1024 * 1024
"""RECEIVE reads the rows of one conversation's run in one step while their bodies total
at most this much (:func:`_received_rows`)."""


def _received_rows(
    conn: sqlite3.Connection, where: str, params: Sequence[Any]
) -> list[tuple[Any, ...]]:
    """The rows of :data:`_READ_RECEIVED` for one conversation's numbers (``where``, the
    condition on the sequence number), as plain tuples.

    Stepping a query row by row releases and retakes the GIL at every row (the sqlite3
    module), and beside a busy event loop each retake can wait out the interpreter's
    switch interval: a RECEIVE of 1,000 rows took 1.9 ms alone and over a second beside
    a thread that never waits. One aggregate row carries them all instead: the numbers,
    the body lengths and the bodies joined, the types and enqueue times as JSON (times
    with 17 significant digits: the same double back for any clock's time; SQLite 3.40's
    printf rounds some doubles beyond 1e240 differently), while the bodies total at most
    :data:`AT_ONCE_BYTES`. The columns every row of a conversation shares are checked
    to be shared; if one is not, a body is NULL, or the bodies are larger, the rows are
    stepped."""
    total, without_body = conn.execute(_RECEIVED_BYTES + where, params).fetchone()
    if total is not None and total <= AT_ONCE_BYTES and not without_body:
        cursor = conn.execute(_RECEIVED_AT_ONCE + where, params)
        cursor.row_factory = None
        numbers, lengths, types, times, joined, *shared = cursor.fetchone()
        if numbers is None:
            return []
        group, service, contract, queue = shared[0], shared[2], shared[4], shared[6]
        if shared[1:8:2] == [group, service, contract, queue]:
            return _cut_rows(
                repeat(params[0]),
                repeat(group),
                repeat(service),
                repeat(contract),
                repeat(queue),
                numbers,
                lengths,
                types,
                times,
                joined,
            )
    cursor = conn.execute(_READ_RECEIVED + where, params)
    cursor.row_factory = None  # plain tuples: cheaper than sqlite3.Row
    return cursor.fetchall()


_SPANS_AT_ONCE = (
    "SELECT json_group_array(r.conversation_handle), group_concat(r.message_sequence_number), "
    "group_concat(length(r.body)), json_group_array(r.message_type), "
    "json_group_array(printf('%!.17g', r.enqueued_at)), CAST(group_concat(r.body, '') AS BLOB), "
    "json_group_array(r.conversation_group_id), json_group_array(r.service_name), "
    "json_group_array(r.contract), json_group_array(r.queue_name) FROM "
)
_SPANS_BYTES = "SELECT sum(length(r.body)), count(*) - count(r.body) FROM "
_SPANS_STEPPED = (
    "SELECT r.conversation_handle, r.message_sequence_number, r.conversation_group_id, "
    "r.service_name, r.contract, r.message_type, r.body, r.enqueued_at, r.queue_name FROM "
)


def _received_spans(conn: sqlite3.Connection, spans: list[Span]) -> list[tuple[Any, ...]]:
    """The rows of :data:`_READ_RECEIVED` in ``spans`` of many conversations (a RECEIVE
    of many conversation groups), as plain tuples: one aggregate row for them all, as
    :func:`_received_rows` reads one conversation's run (its columns as JSON arrays
    where text could hold a comma), or stepped when a body is NULL or the bodies total
    more than :data:`AT_ONCE_BYTES`."""
    join = spans_join("queue_messages", len(spans))
    params = list(chain.from_iterable(spans))
    total, without_body = conn.execute(_SPANS_BYTES + join, params).fetchone()
    if total is None or total > AT_ONCE_BYTES or without_body:
        cursor = conn.execute(_SPANS_STEPPED + join, params)
        cursor.row_factory = None
        return cursor.fetchall()
    cursor = conn.execute(_SPANS_AT_ONCE + join, params)
    cursor.row_factory = None
    handles, numbers, lengths, types, times, joined, groups, services, contracts, queues = (
        cursor.fetchone()
    )
    columns = [orjson.loads(c) for c in (handles, groups, services, contracts, queues)]
    rows = _cut_rows(
        columns[0],
        columns[1],
        columns[2],
        columns[3],
        columns[4],
        numbers,
        lengths,
        types,
        times,
        joined,
    )
    if any(len(column) != len(rows) for column in columns):
        raise ValueError("the aggregate row's columns differ in length")
    return rows


def _cut_rows(
    handles: Iterable[Any],
    groups: Iterable[Any],
    services: Iterable[Any],
    contracts: Iterable[Any],
    queues: Iterable[Any],
    numbers: str,
    lengths: str,
    types: str,
    times: str,
    joined: bytes,
) -> list[tuple[Any, ...]]:
    """The rows of :data:`_READ_RECEIVED` from an aggregate row: the sequence numbers
    and body lengths comma-joined, the types and times as JSON arrays, the bodies
    joined into one blob, cut here by their lengths. The first five columns are the
    per-row values (``itertools.repeat`` of one conversation's)."""
    rows = []
    at = 0
    cut = zip(
        numbers.split(","),
        lengths.split(","),
        orjson.loads(types),
        orjson.loads(times),
        strict=True,
    )
    for handle, group, service, contract, queue, (seq, length, message_type, enqueued_at) in zip(
        handles,
        groups,
        services,
        contracts,
        queues,
        cut,
        strict=False,  # repeat() is endless
    ):
        end = at + int(length)
        rows.append(
            (
                handle,
                int(seq),
                group,
                service,
                contract,
                message_type,
                joined[at:end],
                float(enqueued_at),
                queue,
            )
        )
        at = end
    return rows


_READ_FRAGMENT_DATA = (
    "SELECT data, stored_at, stored_length FROM message_fragments WHERE conversation_handle = ? "
    "AND message_sequence_number = ? ORDER BY fragment_index"
)


def _joined_fragments(
    conn: sqlite3.Connection, bodies: BodyFiles | None, handle: str, seq: int
) -> bytes:
    """The body of a message kept ``schema.IN_FRAGMENTS`` (empty for an empty message).
    Fragments stored one after the other in a segment file (as one commit, or a run of
    them, appends them) are read back in one piece."""
    cursor = conn.execute(_READ_FRAGMENT_DATA, (handle, seq))
    cursor.row_factory = None
    pieces: list[bytes] = []
    start = end = -1
    for data, stored_at, length in cursor:
        if stored_at is not None and (type(length) is not int or length < 0):
            # a damaged row: refused with its segment's name (never joined into a run,
            # where it would shorten the run and hand on other bytes than were stored)
            read_stored(conn, bodies, stored_at, -1)
        if stored_at is not None and stored_at == end:
            end += length  # continues the run of stored bytes being gathered
            continue
        if start >= 0:
            pieces.append(read_stored(conn, bodies, start, end - start))
            start = end = -1
        if stored_at is None:
            pieces.append(bytes(data))
        else:
            start, end = stored_at, stored_at + length
    if start >= 0:
        pieces.append(read_stored(conn, bodies, start, end - start))
    return b"".join(pieces)


# -- fragments being reassembled ----------------------------------------------------------------


def read_fragments(
    conn: sqlite3.Connection, handle: str, seq: int, bodies: BodyFiles | None = None
) -> dict[int, bytes]:
    """The stored fragments of a message being reassembled, by fragment index."""
    rows = conn.execute(
        "SELECT fragment_index, data, stored_at, stored_length FROM message_fragments "
        "WHERE conversation_handle = ? AND message_sequence_number = ?",
        (handle, seq),
    )
    return {int(index): _data(conn, bodies, data, at, length) for index, data, at, length in rows}


def _data(
    conn: sqlite3.Connection,
    bodies: BodyFiles | None,
    data: bytes,
    stored_at: int | None,
    length: int,
) -> bytes:
    """A row's body: its own, or the one it says is stored in a segment file."""
    if stored_at is None:
        return bytes(data)
    return read_stored(conn, bodies, stored_at, length)
