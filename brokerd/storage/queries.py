"""Every statement that writes to a database file, and the reads the store runs as they are.

Owns (SPEC R-OBJ-3..6, R-DLG-5, R-DLG-7, R-DLG-11, R-DLG-13; docs/design.md "Storage"):

* the write statements, as :data:`Statement` pairs built by small functions
  named after what they do (the dialog engine and the router never spell SQL), table
  by table: endpoints, the transmission queue, service queues, fragments being
  reassembled, conversation timers and the catalog;
* the reads of recovery and administration that the store runs as they are
  (``READ_ENDPOINTS``, ``READ_HELD``, ...), beside the writes of their tables.

The schema and its numbered migrations are :mod:`brokerd.storage.schema`'s; the reads
that are functions of a connection, :mod:`brokerd.storage.reads`'; RECEIVE's
statements over many sequence numbers, :mod:`brokerd.storage.sequence_runs`'. The
names of the first two that the dialog engine uses are re-exported here, so that
``queries.X`` stays its one way to reach storage's SQL.

May import: ``brokerd.storage.schema``, ``brokerd.storage.sequence_runs`` and
``brokerd.storage.reads``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from operator import itemgetter
from typing import Any

from brokerd.storage.schema import IN_FRAGMENTS, WRITE_META, Statement
from brokerd.storage.sequence_runs import (
    REMOVE_FRAGMENTS,
    REMOVE_MANY,
    RETAIN_MANY,
    by_sequence_numbers,
)

# -- meta -----------------------------------------------------------------------------------


def meta(key: str, value: str) -> Statement:
    return (WRITE_META, (key, value))


# -- endpoints --------------------------------------------------------------------------

ENDPOINT_SNAPSHOT = (
    "INSERT OR REPLACE INTO conversation_endpoints VALUES (" + ", ".join("?" * 17) + ")"
)
"""A whole endpoint row. The committer writes only the last snapshot of each endpoint
in a batch, as an update of the columns that change (:func:`endpoint_updates`) or,
for a new endpoint, an insert (:data:`ENDPOINT_ADD`).

Its ``send_sequence`` and ``receive_sequence`` only ever grow in the file: a batch keeps
the highest of its snapshots' (:func:`merge_snapshots`) and the update the higher of the
file's and the batch's. A snapshot counts only what was already committed and, in the
job of a SEND or of a message received, that message's number; so the file never holds
a number whose message was not stored (R-DLG-1: one that failed to commit, given back
by the sender or received again from it)."""
_ENDPOINT_COLUMNS = (
    "conversation_handle",
    "conversation_id",
    "is_initiator",
    "conversation_group_id",
    "service_name",
    "far_service",
    "far_broker_instance",
    "contract",
    "state",
    "lifetime",
    "created_at",
    "send_sequence",
    "receive_sequence",
    "ended_local",
    "ended_remote",
    "far_peer",
    "dialog_key",
)
_ENDPOINT_CHANGING = (
    "conversation_group_id",
    "far_broker_instance",
    "state",
    "send_sequence",
    "receive_sequence",
    "ended_local",
    "ended_remote",
    "far_peer",
)
"""The columns a snapshot can change; none is indexed, so an update touches no index."""
_SEND_SEQUENCE = _ENDPOINT_COLUMNS.index("send_sequence")
_RECEIVE_SEQUENCE = _ENDPOINT_COLUMNS.index("receive_sequence")
_GROWING = ("send_sequence", "receive_sequence")
"""The columns a snapshot never lowers (:data:`ENDPOINT_SNAPSHOT`)."""


def merge_snapshots(earlier: Sequence[Any], later: Sequence[Any]) -> Sequence[Any]:
    """The snapshot a batch writes for an endpoint it holds two snapshots of: the later
    one, with the higher send and receive sequences of the two (see
    :data:`ENDPOINT_SNAPSHOT`)."""
    sent, received = earlier[_SEND_SEQUENCE], earlier[_RECEIVE_SEQUENCE]
    if sent <= later[_SEND_SEQUENCE] and received <= later[_RECEIVE_SEQUENCE]:
        return later
    merged = list(later)
    merged[_SEND_SEQUENCE] = max(sent, later[_SEND_SEQUENCE])
    merged[_RECEIVE_SEQUENCE] = max(received, later[_RECEIVE_SEQUENCE])
    return tuple(merged)


ENDPOINT_ADD = "INSERT OR IGNORE INTO conversation_endpoints VALUES (" + ", ".join("?" * 17) + ")"


_UPDATED = (0, *(_ENDPOINT_COLUMNS.index(column) for column in _ENDPOINT_CHANGING))
endpoint_update_values = itemgetter(*_UPDATED)
"""The values of a snapshot that :func:`endpoint_updates` binds: the handle, then the
columns that can change (binding the other nine of each row cost a quarter of the
update's time: docs/performance.md, "Endpoint rows updated with what changes")."""


def endpoint_updates(count: int) -> str:
    """One statement that writes ``count`` snapshots of existing endpoints (UPDATE FROM),
    each given as :data:`endpoint_update_values` of it."""
    row = "(" + ", ".join("?" * len(_UPDATED)) + ")"
    values = ", ".join([row] * count)
    assignments = ", ".join(
        f"{column} = max({column}, v.column{n})"
        if column in _GROWING
        else f"{column} = v.column{n}"
        for n, column in enumerate(_ENDPOINT_CHANGING, 2)
    )
    return (
        f"UPDATE conversation_endpoints SET {assignments} FROM (VALUES {values}) AS v "
        "WHERE conversation_endpoints.conversation_handle = v.column1"
    )


ENDPOINT_DELETE = "DELETE FROM conversation_endpoints WHERE conversation_handle = ?"
"""Removes an endpoint row; deduplicated together with the snapshots."""
READ_ENDPOINTS = "SELECT * FROM conversation_endpoints"
READ_RECEIVE_SEQUENCES = "SELECT conversation_handle, receive_sequence FROM conversation_endpoints"


_CONVERSATION_TABLES = (
    "transmission_queue",
    "conversation_timers",
    "queue_messages",
    "message_fragments",
    "send_keys",
    "begin_dialog_keys",
    "message_rollbacks",
    "quarantined_conversations",
)
"""The tables that hold a conversation's rows besides its endpoint row: its messages
sent, its timer, its queue rows (retained ones too, R-OBJ-3), its fragments, its SENDs'
idempotency keys, the idempotency key of the BEGIN DIALOG that began it, and what
poison-message handling counted or set aside of it."""
HANDLES_PER_STATEMENT = 500
"""Conversation handles of one ``IN`` list (far below SQLite's 32,766 variables)."""


def forget_conversation(handle: str) -> list[Statement]:
    """Everything of a closed conversation except its endpoint row."""
    return forget_conversations([handle])


def forget_conversations(handles: Sequence[str]) -> list[Statement]:
    """Everything of closed conversations except their endpoint rows: one statement per
    table and :data:`HANDLES_PER_STATEMENT` handles (SPEC §5, the clean-up of closed
    endpoints)."""
    out: list[Statement] = []
    for start in range(0, len(handles), HANDLES_PER_STATEMENT):
        chunk = tuple(handles[start : start + HANDLES_PER_STATEMENT])
        marks = ", ".join("?" * len(chunk))
        out += [
            (f"DELETE FROM {table} WHERE conversation_handle IN ({marks})", chunk)
            for table in _CONVERSATION_TABLES
        ]
    return out


# -- views read from the file (SPEC R-OBJ-3, R-PROTO-4) ----------------------------------

READ_QUEUE_PAGE = (
    "SELECT conversation_handle, message_sequence_number, conversation_group_id, status, "
    "service_name, message_type, message_length, enqueued_at FROM queue_messages "
    "WHERE (conversation_handle, message_sequence_number) > (?, ?) AND queue_name = ? "
    "ORDER BY conversation_handle, message_sequence_number LIMIT ?"
)
"""A page of a queue's rows after (handle, sequence number), in the primary key's order."""
READ_WAITING_IN_QUEUES = (
    "SELECT conversation_handle, message_sequence_number, MIN(enqueued_at), COUNT(*), "
    "queue_name FROM queue_messages WHERE status IN (1, 2) GROUP BY conversation_handle"
)
"""Per conversation, its oldest message not yet received (ready, or not yet complete) and
how many wait (SQLite takes the other columns from the row of the minimum)."""
READ_WAITING_TO_SEND = (
    "SELECT conversation_handle, message_sequence_number, MIN(enqueued_at), COUNT(*) "
    "FROM transmission_queue GROUP BY conversation_handle"
)
"""Per conversation, its oldest message sent and not acknowledged, and how many."""


# -- idempotency keys of SENDs --------------------------------------------------------------

_SEND_KEY = "INSERT OR REPLACE INTO send_keys VALUES (?, ?, ?, ?)"
READ_SEND_KEYS = "SELECT conversation_handle, key, sequence_number, created_at FROM send_keys"


def send_key(handle: str, key: str, seq: int, now: float) -> Statement:
    """A SEND's idempotency key and the number it was given, in the SEND's own job."""
    return (_SEND_KEY, (handle, key, seq, now))


def forget_send_keys(before: float) -> Statement:
    """The keys kept longer than the window (``limits.send_key_window``)."""
    return ("DELETE FROM send_keys WHERE created_at < ?", (before,))


# -- the transmission queue ---------------------------------------------------------------

SENT = "INSERT INTO transmission_queue VALUES (?, ?, ?, ?, ?, ?, NULL, NULL)"
"""A message sent, its body in the row (:func:`sent_message`)."""
SENT_STORED = "INSERT INTO transmission_queue VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
"""The same row with an empty body and where the body is stored, with its length: what
the committer makes of :data:`SENT` for a large body (:func:`stored`)."""
SENT_BODY = 4
"""The body's place among :data:`SENT`'s parameters."""
_UNQUEUE = (
    "DELETE FROM transmission_queue WHERE conversation_handle = ? AND "
    "message_sequence_number BETWEEN ? AND ?"
)


@lru_cache(maxsize=128)
def unqueue_many(count: int) -> str:
    """``count`` rows of the acknowledgement delete (handle, first, last) in one statement:
    the store's form for many conversations acknowledged in one commit, stepped once
    rather than once per conversation (each step hands the GIL over twice)."""
    values = ", ".join(["(?, ?, ?)"] * count)
    return (
        "DELETE FROM transmission_queue WHERE rowid IN (SELECT t.rowid FROM "
        f"(VALUES {values}) AS v JOIN transmission_queue AS t "
        "ON t.conversation_handle = v.column1 "
        "AND t.message_sequence_number BETWEEN v.column2 AND v.column3)"
    )


MANY_ROWS: dict[str, Callable[[int], str]] = {_UNQUEUE: unqueue_many}
"""Statements the store runs for many rows at once, in chunks, with the statement the
function makes for a chunk of that many rows (each row's parameters in order)."""
READ_TRANSMISSION_RUNS = (
    "SELECT conversation_handle, min(message_sequence_number), "
    "max(message_sequence_number), count(*) FROM transmission_queue "
    "GROUP BY conversation_handle"
)
"""Recovery: per conversation, the lowest and highest unacknowledged sequence number and
how many there are (the primary key's index alone, no row and no body is read)."""
READ_SENT_NUMBERS = (
    "SELECT message_sequence_number FROM transmission_queue "
    "WHERE conversation_handle = ? ORDER BY message_sequence_number"
)
"""Recovery: the numbers of a conversation whose queue has gaps (acknowledged out of order)."""


def sent_message(
    handle: str,
    seq: int,
    message_type: str,
    flags: int,
    body: bytes | bytearray,
    enqueued_at: float,
) -> Statement:
    """A message SENT and not yet acknowledged."""
    return (SENT, (handle, seq, message_type, flags, body, enqueued_at))


def stored(sql: str, params: Sequence[Any], stored_at: int) -> Statement:
    """A row of :data:`STORABLE` with its body (of :func:`sent_message`, or the data of
    :func:`fragment`) stored at ``stored_at`` in a segment file, an empty one in the row."""
    stored_sql, at = STORABLE[sql]
    body = params[at]
    return (stored_sql, (*params[:at], b"", *params[at + 1 :], stored_at, len(body)))


def stored_rows(table: str) -> str:
    """Rows of ``table`` whose body is in a segment file: rowid, where, how long (a
    database that becomes mirrored takes them back with :func:`inline_row`)."""
    return f"SELECT rowid, stored_at, stored_length FROM {table} WHERE stored_at IS NOT NULL"


def inline_row(table: str) -> str:
    column = "data" if table == "message_fragments" else "body"
    return (
        f"UPDATE {table} SET {column} = ?, stored_at = NULL, stored_length = NULL WHERE rowid = ?"
    )


def unqueue_sent(
    handle: str,
    seqs: Iterable[int],
    through: int = 0,
    runs: Iterable[tuple[int, int]] = (),
) -> list[Statement]:
    """Delete sent messages: every one up to ``through`` in one statement, then ``seqs``,
    then the runs ``first..last`` above ``through`` (one statement each)."""
    out: list[Statement] = [(_UNQUEUE, (handle, 1, through))] if through > 0 else []
    out += [(_UNQUEUE, (handle, seq, seq)) for seq in seqs if seq > through]
    out += [
        (_UNQUEUE, (handle, max(first, through + 1), last))
        for first, last in runs
        if last > through
    ]
    return out


# -- service queues --------------------------------------------------------------------------

QUEUED = "INSERT OR IGNORE INTO queue_messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)"
"""A message's row in its service queue, its body (if any yet) in the row."""
QUEUED_STORED = (
    "INSERT OR IGNORE INTO queue_messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
"""The same row with the body ``schema.IN_ELSEWHERE`` and where the body is stored."""
QUEUED_BODY = 9
"""The body's place among :data:`QUEUED`'s parameters."""
_PROMOTE = (
    "UPDATE queue_messages SET status = 1 WHERE conversation_handle = ? AND "
    "message_sequence_number = ?"
)
_DISCARD_RECEIVED = "DELETE FROM queue_messages WHERE conversation_handle = ?"
_DISCARD_QUEUED = "DELETE FROM queue_messages WHERE conversation_handle = ? AND status <> 2"
_ABANDON_PARTIAL = (
    "DELETE FROM queue_messages WHERE conversation_handle = ? AND message_sequence_number < ? "
    "AND status = 2 AND body IS NULL"
)
_ABANDON_FRAGMENTS = (
    "DELETE FROM message_fragments WHERE conversation_handle = ?1 "
    "AND message_sequence_number < ?2 AND message_sequence_number NOT IN ("
    "SELECT message_sequence_number FROM queue_messages WHERE conversation_handle = ?1 "
    "AND message_sequence_number < ?2 AND body IS NOT NULL)"
)
"""The fragments of the partial messages before a sequence number (whether or not their
rows are already gone); complete messages keep theirs (:data:`IN_FRAGMENTS`)."""
_SWEEP_FRAGMENTS = (
    "DELETE FROM message_fragments WHERE conversation_handle = ?1 "
    "AND message_sequence_number NOT IN ("
    "SELECT message_sequence_number FROM queue_messages WHERE conversation_handle = ?1 "
    "AND status = 2)"
)
"""The fragments of a conversation except those of its rows with status 2 (partial or
held out of order): written with :data:`_DISCARD_QUEUED`, before or after it."""
_DISCARD_FRAGMENTS = "DELETE FROM message_fragments WHERE conversation_handle = ?"
_DROP_FRAGMENTS = (
    "DELETE FROM message_fragments WHERE conversation_handle = ? AND message_sequence_number = ?"
)
KEEPING_HELD = frozenset({_DISCARD_QUEUED, _SWEEP_FRAGMENTS, _ABANDON_PARTIAL, _ABANDON_FRAGMENTS})
"""Deletes that keep the rows held (status 2), or partial (no body), and their fragments:
the store runs them after every other UPDATE and DELETE of a batch
(``batch_sql.apply_batch``). Run as the group of their kind's first appearance, they
could come before the release (:func:`promote`) or the completion
(:func:`complete_in_fragments`) of a row by an earlier job of the batch, and keep a
message its conversation's END took (ready, in the file alone), or delete one that was
complete. Never before a later job's release either: a conversation this side ended,
or whose other side's Error abandoned what was partial, releases nothing more."""
_REGROUP = "UPDATE queue_messages SET conversation_group_id = ? WHERE conversation_handle = ?"
READ_HELD = (
    "SELECT conversation_handle, message_sequence_number, message_type, queue_name, "
    "conversation_group_id, rowid FROM queue_messages WHERE status = 2 AND body IS NOT NULL"
)
"""Recovery: the complete messages held (status 2); the last three columns are those of
:data:`READ_READY` for one that recovery finds already released (``repair_held``)."""
READ_READY = (
    "SELECT queue_name, conversation_group_id, conversation_handle, "
    "message_sequence_number, message_type, rowid FROM queue_messages WHERE status = 1 "
    "ORDER BY rowid"
)
_REPAIR_HELD = (
    "UPDATE queue_messages SET status = 1 WHERE conversation_handle = ? AND "
    "message_sequence_number = ? AND status = 2"
)
READ_LOWEST_SEQUENCE = "SELECT MIN(message_sequence_number) FROM queue_messages"


def queued_message(
    queue: str,
    group: str,
    handle: str,
    seq: int,
    status: int,
    service: str,
    contract: str,
    message_type: str,
    length: int,
    body: bytes | bytearray | None,
    now: float,
) -> Statement:
    """A received message's row in its service queue (``body`` None while fragments arrive)."""
    return (
        QUEUED,
        (queue, group, handle, seq, status, service, contract, message_type, length, body, now),
    )


def promote(handle: str, seqs: Iterable[int]) -> list[Statement]:
    """Messages held out of order (status 2) become ready (status 1)."""
    return [(_PROMOTE, (handle, seq)) for seq in seqs]


def repair_held(handle: str, seq: int) -> Statement:
    """A complete message recovery found held (status 2) at or below its endpoint's receive
    sequence becomes ready, as its release would have made it. Only a row still held is
    touched, so the statement commutes with a RECEIVE (removal, or status 0 under
    RETENTION) in the same commit."""
    return (_REPAIR_HELD, (handle, seq))


def received(items: Sequence[tuple[uuid.UUID, int]], retention: bool) -> list[Statement]:
    """RECEIVE removes its messages (with their fragments, :data:`IN_FRAGMENTS`), or keeps
    them with status 0 under RETENTION: one statement per conversation (and per
    thousand messages), and one for the fragments unless retained."""
    if retention:
        return by_sequence_numbers(RETAIN_MANY, items)
    return [
        *by_sequence_numbers(REMOVE_MANY, items),
        *by_sequence_numbers(REMOVE_FRAGMENTS, items),
    ]


def discard_received(handle: str) -> list[Statement]:
    """Every message of a conversation leaves its queue, with its fragments."""
    return [(_DISCARD_RECEIVED, (handle,)), (_DISCARD_FRAGMENTS, (handle,))]


def discard_queued(handle: str) -> list[Statement]:
    """A local END removes the conversation's messages from its queue (SPEC §6), with
    their fragments; those held out of order (status 2) stay, so recovery still knows
    what arrived."""
    return [(_DISCARD_QUEUED, (handle,)), (_SWEEP_FRAGMENTS, (handle,))]


def abandon_before(handle: str, seq: int) -> list[Statement]:
    """Messages before ``seq`` still being reassembled will never complete (the other
    side ended with an error and dropped them, R-DLG-10): their rows and fragments go."""
    return [
        (_ABANDON_PARTIAL, (handle, seq)),
        (_ABANDON_FRAGMENTS, (handle, seq)),
    ]


def complete_in_fragments(handle: str, seq: int) -> Statement:
    """The last fragment of a message arrived: its row gets the body :data:`IN_FRAGMENTS`
    (its fragments stay where they are). Its status is not touched: the row was written
    held (status 2) with its first fragment, and :func:`promote` makes it ready. The
    store runs each kind of UPDATE as one group, so a status written here could land
    after the promotion of a later job of the same commit and hold the message again."""
    return (_COMPLETE_IN_FRAGMENTS, (IN_FRAGMENTS, handle, seq))


_COMPLETE_IN_FRAGMENTS = (
    "UPDATE queue_messages SET body = ? WHERE conversation_handle = ? "
    "AND message_sequence_number = ?"
)


def drop_fragments(handle: str, seq: int) -> Statement:
    """A reassembled message's fragments, when the message is not kept."""
    return (_DROP_FRAGMENTS, (handle, seq))


def regroup(handle: str, group: str) -> Statement:
    """MOVE CONVERSATION: the conversation's queued messages change group."""
    return (_REGROUP, (group, handle))


def set_queue_status(queue: str, status: bool) -> Statement:
    """ALTER QUEUE ... STATUS: kept across restarts unless the configuration changes it."""
    return ("UPDATE queues SET status = ? WHERE name = ?", (int(status), queue))


# -- fragments being reassembled ----------------------------------------------------------------

READ_FRAGMENT_POSITIONS = (
    "SELECT f.conversation_handle, f.message_sequence_number, f.fragment_index, "
    "f.fragment_offset, coalesce(f.stored_length, length(f.data)), q.message_length "
    "FROM message_fragments AS f LEFT JOIN queue_messages AS q "
    "ON q.conversation_handle = f.conversation_handle "
    "AND q.message_sequence_number = f.message_sequence_number WHERE q.body IS NULL"
)
"""Recovery: the fragments of partial messages (a complete message's are its body), with
what tells the size they were cut at (``protocol.fragments.cut_size``) and the length
their message's held row names (NULL without a row)."""


FRAGMENT = "INSERT OR IGNORE INTO message_fragments VALUES (?, ?, ?, ?, ?, NULL, NULL)"
"""A fragment received, its data in the row (:func:`fragment`)."""
FRAGMENT_STORED = "INSERT OR IGNORE INTO message_fragments VALUES (?, ?, ?, ?, ?, ?, ?)"
"""A fragment whose data is in a segment file (:func:`stored`)."""
FRAGMENT_DATA = 4
"""The data's place among :data:`FRAGMENT`'s parameters."""

STORABLE: dict[str, tuple[str, int]] = {
    SENT: (SENT_STORED, SENT_BODY),
    FRAGMENT: (FRAGMENT_STORED, FRAGMENT_DATA),
    QUEUED: (QUEUED_STORED, QUEUED_BODY),
}
"""The inserts whose body the committer may store in a segment file: the statement
that then says where, and the body's place among the parameters."""


def fragment(handle: str, seq: int, index: int, offset: int, data: bytes) -> Statement:
    return (FRAGMENT, (handle, seq, index, offset, data))


def joined(fragments: dict[int, bytes]) -> bytes:
    """A message's body from its fragments by index."""
    return b"".join(fragments[index] for index in sorted(fragments))


# -- conversation timers -------------------------------------------------------------------------

READ_TIMERS = "SELECT conversation_handle, due FROM conversation_timers"


def set_timer(handle: str, due: float) -> Statement:
    return ("INSERT OR REPLACE INTO conversation_timers VALUES (?, ?)", (handle, due))


def forget_timer(handle: str, due: float) -> Statement:
    """The row of the timer that fired at ``due``, and only it: a timer set again before
    this commit, in the same group commit (whose inserts may run before its deletes), is a
    row of another due and stays (R-DLG-11)."""
    return (
        "DELETE FROM conversation_timers WHERE conversation_handle = ? AND due = ?",
        (handle, due),
    )


# -- the catalog ----------------------------------------------------------------------------------

CLEAR_CATALOG: tuple[Statement, ...] = (
    ("DELETE FROM message_types", ()),
    ("DELETE FROM contract_messages", ()),
    ("DELETE FROM queues", ()),
    ("DELETE FROM services", ()),
    ("DELETE FROM service_contracts", ()),
    ("DELETE FROM routes WHERE source = 'config'", ()),
)
"""Before the configuration's catalog is written again (the routes that live in the file
stay: AutoCreatedLocal, unless it was dropped, and routes created at run time)."""
READ_KEPT_ROUTES = "SELECT * FROM routes WHERE source != 'config'"
"""The routes that live in the file, not in the configuration (R-OBJ-6, R-ROUTE-13)."""


def message_type(name: str, validation: str) -> Statement:
    return ("INSERT INTO message_types VALUES (?, ?)", (name, validation))


def contract_message(contract: str, message_type: str, sent_by: str) -> Statement:
    return ("INSERT INTO contract_messages VALUES (?, ?, ?)", (contract, message_type, sent_by))


def queue(name: str, status: bool, retention: bool, configured_status: bool) -> Statement:
    return (
        "INSERT INTO queues (name, status, retention, configured_status) VALUES (?, ?, ?, ?)",
        (name, int(status), int(retention), int(configured_status)),
    )


READ_QUEUE_STATES = "SELECT name, status, configured_status FROM queues"


def service(name: str, queue: str) -> Statement:
    return ("INSERT INTO services VALUES (?, ?)", (name, queue))


def service_contract(service: str, contract: str) -> Statement:
    return ("INSERT INTO service_contracts VALUES (?, ?)", (service, contract))


def route(
    name: str,
    remote_service_name: str | None,
    broker_instance: str | None,
    address: str,
    mirror_address: str | None,
    lifetime: str | None,
    source: str,
) -> Statement:
    """A ``routes`` row, inserted or replaced."""
    return (
        "INSERT OR REPLACE INTO routes VALUES (?, ?, ?, ?, ?, ?, ?)",
        (name, remote_service_name, broker_instance, address, mirror_address, lifetime, source),
    )


def drop_route(name: str) -> Statement:
    return ("DELETE FROM routes WHERE name = ?", (name,))


# -- idempotency keys of BEGIN DIALOGs -------------------------------------------------------

_BEGIN_KEY = "INSERT OR REPLACE INTO begin_dialog_keys VALUES (?, ?, ?, ?, ?)"
READ_BEGIN_KEYS = (
    "SELECT service_name, key, conversation_handle, arguments, created_at FROM begin_dialog_keys"
)


def begin_key(service: str, key: str, handle: str, arguments: str, now: float) -> Statement:
    """A BEGIN DIALOG's idempotency key, the dialog it began and the arguments it was
    begun with (JSON), in the BEGIN DIALOG's own job."""
    return (_BEGIN_KEY, (service, key, handle, arguments, now))


def forget_begin_keys(before: float) -> Statement:
    """The BEGIN DIALOG keys kept longer than the window (``limits.send_key_window``)."""
    return ("DELETE FROM begin_dialog_keys WHERE created_at < ?", (before,))
