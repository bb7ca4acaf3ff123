"""Every SQL statement of a database file, and its numbered schema migrations.

Owns (SPEC R-OBJ-3..6, R-DLG-5, R-DLG-7, R-DLG-11, R-DLG-13; docs/design.md "Storage"):

* :data:`MIGRATIONS`, the schema as numbered steps. A file records the last
  step applied (``meta.schema_version``); opening it applies the later ones in
  order, each in its own transaction, and refuses a file newer than this code;
* the write statements, as :data:`Statement` pairs built by small functions
  named after what they do (the dialog engine and the router never spell SQL);
* the reads, as plain functions of a :class:`sqlite3.Connection`, run by the
  store's committer thread (see :mod:`brokerd.storage.store`).

Tables: the catalog (``message_types``, ``contract_messages``, ``queues``,
``services``, ``service_contracts``, ``routes``), ``conversation_endpoints``,
``transmission_queue``, ``queue_messages`` (status 0-3 as in R-OBJ-3),
``message_fragments`` (fragments of messages being reassembled, and the body of a
message of several fragments once complete, see :data:`IN_FRAGMENTS`) and
``conversation_timers``.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from brokerd.storage.body_files import read_stored

Statement = tuple[str, Sequence[Any]]
"""One write: SQL text and its parameters."""

Rows = Callable[[str, Sequence[Any]], list[sqlite3.Row]]
"""Runs a read and returns its rows (a connection's ``execute(...).fetchall()``)."""


# -- schema ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Migration:
    version: int
    what: str
    script: str


_SCHEMA_1 = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS message_types (name TEXT PRIMARY KEY, validation TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS contract_messages (
    contract TEXT NOT NULL, message_type TEXT NOT NULL, sent_by TEXT NOT NULL,
    PRIMARY KEY (contract, message_type));
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY, status INTEGER NOT NULL, retention INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS services (name TEXT PRIMARY KEY, queue TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS service_contracts (
    service TEXT NOT NULL, contract TEXT NOT NULL, PRIMARY KEY (service, contract));
CREATE TABLE IF NOT EXISTS routes (
    name TEXT PRIMARY KEY, remote_service_name TEXT, broker_instance TEXT,
    address TEXT NOT NULL, mirror_address TEXT, lifetime TEXT, source TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS conversation_endpoints (
    conversation_handle TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    is_initiator INTEGER NOT NULL,
    conversation_group_id TEXT NOT NULL,
    service_name TEXT NOT NULL,
    far_service TEXT NOT NULL,
    far_broker_instance TEXT,
    contract TEXT NOT NULL,
    state TEXT NOT NULL,
    lifetime INTEGER NOT NULL,
    created_at REAL NOT NULL,
    send_sequence INTEGER NOT NULL,
    receive_sequence INTEGER NOT NULL,
    ended_local INTEGER NOT NULL,
    ended_remote INTEGER NOT NULL,
    UNIQUE (conversation_id, is_initiator));
CREATE TABLE IF NOT EXISTS transmission_queue (
    conversation_handle TEXT NOT NULL,
    message_sequence_number INTEGER NOT NULL,
    message_type TEXT NOT NULL,
    flags INTEGER NOT NULL,
    body BLOB NOT NULL,
    enqueued_at REAL NOT NULL,
    PRIMARY KEY (conversation_handle, message_sequence_number));
CREATE TABLE IF NOT EXISTS queue_messages (
    queue_name TEXT NOT NULL,
    conversation_group_id TEXT NOT NULL,
    conversation_handle TEXT NOT NULL,
    message_sequence_number INTEGER NOT NULL,
    status INTEGER NOT NULL,
    service_name TEXT NOT NULL,
    contract TEXT NOT NULL,
    message_type TEXT NOT NULL,
    message_length INTEGER NOT NULL,
    body BLOB,
    enqueued_at REAL NOT NULL,
    PRIMARY KEY (conversation_handle, message_sequence_number));
CREATE INDEX IF NOT EXISTS queue_messages_ready ON queue_messages (queue_name, status);
CREATE TABLE IF NOT EXISTS conversation_timers (
    conversation_handle TEXT PRIMARY KEY,
    due REAL NOT NULL);
CREATE TABLE IF NOT EXISTS message_fragments (
    conversation_handle TEXT NOT NULL,
    message_sequence_number INTEGER NOT NULL,
    fragment_index INTEGER NOT NULL,
    fragment_offset INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (conversation_handle, message_sequence_number, fragment_index));
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1, "catalog, endpoints, transmission and service queues, fragments, timers", _SCHEMA_1
    ),
    Migration(
        2,
        "no (queue_name, status) index on queue_messages: only recovery, which reads the "
        "whole table, filtered on it, while every received message paid for it",
        "DROP INDEX IF EXISTS queue_messages_ready",
    ),
    Migration(
        3,
        "queues remember the status the configuration gave them, so that a status set "
        "with ALTER QUEUE survives a restart unless the configuration changes it",
        "ALTER TABLE queues ADD COLUMN configured_status INTEGER",
    ),
    Migration(
        4,
        "endpoints remember who may speak for the far side of their conversation: the "
        "authenticated adjacent broker, 'forwarded' or 'local' (R-DLG-14)",
        "ALTER TABLE conversation_endpoints ADD COLUMN far_peer TEXT",
    ),
    Migration(
        5,
        "secured dialogs keep their dialog key with the endpoint, so dialog security "
        "survives a restart (R-DLG-14)",
        "ALTER TABLE conversation_endpoints ADD COLUMN dialog_key BLOB",
    ),
    Migration(
        6,
        "a large body of the transmission queue, or a large fragment received, may live "
        "in a segment file beside the database (storage.body_files): the row says where "
        "and how long",
        "ALTER TABLE transmission_queue ADD COLUMN stored_at INTEGER;"
        "ALTER TABLE transmission_queue ADD COLUMN stored_length INTEGER;"
        "CREATE INDEX IF NOT EXISTS transmission_queue_stored ON transmission_queue "
        "(stored_at) WHERE stored_at IS NOT NULL;"
        "ALTER TABLE message_fragments ADD COLUMN stored_at INTEGER;"
        "ALTER TABLE message_fragments ADD COLUMN stored_length INTEGER;"
        "CREATE INDEX IF NOT EXISTS message_fragments_stored ON message_fragments "
        "(stored_at) WHERE stored_at IS NOT NULL",
    ),
    Migration(
        7,
        "a large body of a service queue's row (a message delivered whole: inside one "
        "database, over the local link, or of one fragment) may live in a segment file "
        "too",
        "ALTER TABLE queue_messages ADD COLUMN stored_at INTEGER;"
        "ALTER TABLE queue_messages ADD COLUMN stored_length INTEGER;"
        "CREATE INDEX IF NOT EXISTS queue_messages_stored ON queue_messages "
        "(stored_at) WHERE stored_at IS NOT NULL",
    ),
)
"""The schema, step by step; a step is never edited once released, only followed by another."""
SCHEMA_VERSION = MIGRATIONS[-1].version

CREATE_META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
"""Made before any step, so the file's step can be read."""
READ_META = "SELECT key, value FROM meta"
WRITE_META = "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)"
AUTO_CREATED_LOCAL = "AutoCreatedLocal"
ADD_AUTO_CREATED_LOCAL = (
    "INSERT OR IGNORE INTO routes VALUES (?, NULL, NULL, 'LOCAL', NULL, NULL, 'system')"
)


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


def endpoint_updates(count: int) -> str:
    """One statement that writes ``count`` snapshots of existing endpoints (UPDATE FROM)."""
    row = "(" + ", ".join("?" * len(_ENDPOINT_COLUMNS)) + ")"
    values = ", ".join([row] * count)
    assignments = ", ".join(
        f"{column} = max({column}, v.column{_ENDPOINT_COLUMNS.index(column) + 1})"
        if column in _GROWING
        else f"{column} = v.column{_ENDPOINT_COLUMNS.index(column) + 1}"
        for column in _ENDPOINT_CHANGING
    )
    return (
        f"UPDATE conversation_endpoints SET {assignments} FROM (VALUES {values}) AS v "
        "WHERE conversation_endpoints.conversation_handle = v.column1"
    )


ENDPOINT_DELETE = "DELETE FROM conversation_endpoints WHERE conversation_handle = ?"
"""Removes an endpoint row; deduplicated together with the snapshots."""
READ_ENDPOINTS = "SELECT * FROM conversation_endpoints"
READ_RECEIVE_SEQUENCES = "SELECT conversation_handle, receive_sequence FROM conversation_endpoints"


def forget_conversation(handle: str) -> list[Statement]:
    """Everything of a closed conversation except its endpoint row."""
    return [
        ("DELETE FROM transmission_queue WHERE conversation_handle = ?", (handle,)),
        ("DELETE FROM conversation_timers WHERE conversation_handle = ?", (handle,)),
        ("DELETE FROM queue_messages WHERE conversation_handle = ?", (handle,)),
        ("DELETE FROM message_fragments WHERE conversation_handle = ?", (handle,)),
    ]


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
    conn: sqlite3.Connection, wanted: dict[str, list[int]]
) -> dict[tuple[str, int], bytes]:
    """Bodies of unacknowledged messages, by (conversation handle, sequence number)."""
    found: dict[tuple[str, int], bytes] = {}
    for handle, seqs in wanted.items():
        for part in _chunks(seqs):
            marks = ",".join("?" * len(part))
            rows = conn.execute(f"{_READ_SENT_BODIES}({marks})", [handle, *part])
            for seq, body, stored_at, length in rows:
                found[(handle, int(seq))] = _data(conn, body, stored_at, length)
    return found


def sent_message(
    handle: str, seq: int, message_type: str, flags: int, body: bytes, enqueued_at: float
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
"""The same row with the body :data:`IN_ELSEWHERE` and where the body is stored."""
QUEUED_BODY = 9
"""The body's place among :data:`QUEUED`'s parameters."""
QUEUED_STORED_AT = (
    "SELECT stored_at, stored_length FROM queue_messages WHERE conversation_handle = ? "
    "AND message_sequence_number = ?"
)
"""RECEIVE: where a row whose body is :data:`IN_ELSEWHERE` has it stored (NULL: in its
fragments, or nowhere for an empty message)."""
_PROMOTE = (
    "UPDATE queue_messages SET status = 1 WHERE conversation_handle = ? AND "
    "message_sequence_number = ?"
)
_REMOVE_MANY = (
    "DELETE FROM queue_messages WHERE conversation_handle = ? AND message_sequence_number "
)
_RETAIN_MANY = (
    "UPDATE queue_messages SET status = 0 WHERE conversation_handle = ? "
    "AND message_sequence_number "
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
_READ_RECEIVED = (
    "SELECT conversation_handle, message_sequence_number, conversation_group_id, "
    "service_name, contract, message_type, body, enqueued_at, queue_name "
    "FROM queue_messages WHERE conversation_handle = ? AND message_sequence_number "
)
_REMOVE_FRAGMENTS = (
    "DELETE FROM message_fragments WHERE conversation_handle = ? AND message_sequence_number "
)

IN_ELSEWHERE = b""
"""The body column of a complete message whose bytes are not in its row: in its
fragments (:data:`IN_FRAGMENTS`), or in a segment file (the row's ``stored_at`` says
where: :data:`QUEUED_STORED`). An empty message's row has it too, with neither: RECEIVE
looks at ``stored_at`` first, then at the fragments, and finds nothing."""

IN_FRAGMENTS = IN_ELSEWHERE
"""The body column of a complete message of several fragments (R-DLG-7): its bytes stay
in ``message_fragments``, where they were stored as they arrived, and RECEIVE joins
them (:func:`read_received`). Joining them into the queue row when the last fragment
arrived read the whole body back, wrote it a second time and deleted the fragments: for
a 1 MiB body, a third of the receiving broker's work. A message of several fragments is
never empty (its length is at least its fragment count), and a partial one has no body
(NULL), so an empty body with fragments stored can only mean this. The fragments leave
with the row: every statement below that removes complete rows removes their fragments
too."""


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
    body: bytes | None,
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
        return _by_sequence_numbers(_RETAIN_MANY, items)
    return [
        *_by_sequence_numbers(_REMOVE_MANY, items),
        *_by_sequence_numbers(_REMOVE_FRAGMENTS, items),
    ]


def _by_sequence_numbers(verb: str, items: Sequence[tuple[uuid.UUID, int]]) -> list[Statement]:
    """``verb`` (a statement ending in ``... AND message_sequence_number ``) for ``items``:
    per conversation, one ``BETWEEN`` per run of consecutive numbers and one ``IN`` per
    thousand numbers alone. A run's range holds exactly its numbers, and SQLite walks
    it in the primary key's index without a parameter per number (a RECEIVE of 700
    messages read and removed in 3.2 µs a row, against 5.3 with ``IN`` lists)."""
    statements: list[Statement] = []
    for key, seqs in _by_conversation(items).items():
        statements += _numbered(verb, key, seqs)
    return statements


def _numbered(verb: str, key: str, seqs: list[int]) -> list[Statement]:
    runs, alone = _runs(seqs)
    statements: list[Statement] = [
        (f"{verb}BETWEEN ? AND ?", [key, first, last]) for first, last in runs
    ]
    statements += [
        (f"{verb}IN ({','.join('?' * len(part))})", [key, *part]) for part in _chunks(alone)
    ]
    return statements


def _runs(seqs: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """The runs (first, last) of two or more consecutive numbers in ``seqs``, and the
    numbers in no run (duplicates count once)."""
    runs: list[tuple[int, int]] = []
    alone: list[int] = []
    ordered = sorted(set(seqs))
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            if i - start > 1:
                runs.append((ordered[start], ordered[i - 1]))
            else:
                alone.append(ordered[start])
            start = i
    return runs, alone


def _by_conversation(items: Sequence[tuple[uuid.UUID, int]]) -> dict[str, list[int]]:
    """The numbers of ``items`` per conversation handle's text, in their order."""
    by_int: dict[int, tuple[uuid.UUID, list[int]]] = {}
    for handle, seq in items:
        entry = by_int.get(handle.int)
        if entry is None:
            entry = by_int[handle.int] = (handle, [])
        entry[1].append(seq)
    return {str(handle): seqs for handle, seqs in by_int.values()}


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


def _chunks(seqs: list[int], size: int = 1000) -> list[list[int]]:
    """At most ``size`` sequence numbers per statement (SQLite allows 32,766 variables)."""
    return [seqs[i : i + size] for i in range(0, len(seqs), size)]


_READ_HELD_FOR = (
    "SELECT conversation_handle, message_sequence_number, service_name, message_type, "
    "message_length, enqueued_at, queue_name FROM queue_messages WHERE status = 1 "
    "AND queue_name IN "
)


def read_held_for(conn: sqlite3.Connection, queues: Sequence[str]) -> list[Any]:
    """Ready messages of ``queues`` (queues that are off, R-DLG-12), oldest first."""
    marks = ",".join("?" * len(queues))
    return conn.execute(f"{_READ_HELD_FOR}({marks}) ORDER BY rowid", list(queues)).fetchall()


Budget = Callable[[list[dict[str, Any]]], int]
"""How many leading RECEIVE rows the caller can hand on (at least one of a non-empty list)."""


def read_received(
    conn: sqlite3.Connection,
    items: Sequence[tuple[uuid.UUID, int]],
    budget: Budget | None = None,
    remove: bool = False,
    retention: bool = False,
) -> tuple[list[dict[str, Any]], int]:
    """RECEIVE's result rows for ``items``, in their order, and how many items they use.

    ``budget`` (default: no limit) cuts the rows to the leading ones the caller can
    hand on (R-DLG-1: what RECEIVE removes must reach the application, so the cut is
    made before anything is removed). The count returned covers the items of the rows
    kept, and the items without a row among them (a conversation cleaned up meanwhile);
    with ``remove`` exactly those are removed (or retained, with status 0). One indexed
    query per conversation (the primary key), never a scan of the queue.
    """
    # Keyed by the handle's integer: a UUID's own hash is a Python call, per row.
    found: dict[tuple[int, int], Any] = {}
    for key, seqs in _by_conversation(items).items():
        handle_int = uuid.UUID(key).int
        for sql, params in _numbered("", key, seqs):
            for r in _received_rows(conn, sql, params):
                found[(handle_int, r[1])] = r
    out = []
    positions = []
    in_fragments: set[tuple[uuid.UUID, int]] = set()
    for position, item in enumerate(items):
        row = found.get((item[0].int, item[1]))
        if row is None:
            continue
        positions.append(position)
        body = row[6]
        if body == IN_ELSEWHERE:
            at, length = conn.execute(QUEUED_STORED_AT, (row[0], row[1])).fetchone()
            if at is not None:
                body = read_stored(conn, at, length)
            else:
                body = _joined_fragments(conn, row[0], int(row[1]))
                in_fragments.add(item)
        out.append(
            {
                "conversation_handle": row[0],
                "message_sequence_number": int(row[1]),
                "conversation_group_id": row[2],
                "service_name": row[3],
                "service_contract_name": row[4],
                "message_type_name": row[5],
                "message_body": body if type(body) is bytes else bytes(body or b""),
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
    if remove:
        taken = items[:used]
        for sql, params in _by_sequence_numbers(_RETAIN_MANY if retention else _REMOVE_MANY, taken):
            conn.execute(sql, params)
        if in_fragments and not retention:
            joined_bodies = [item for item in taken if item in in_fragments]
            for sql, params in _by_sequence_numbers(_REMOVE_FRAGMENTS, joined_bodies):
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
            handle = params[0]
            rows = []
            at = 0
            for seq, length, message_type, enqueued_at in zip(
                numbers.split(","),
                lengths.split(","),
                orjson.loads(types),
                orjson.loads(times),
                strict=True,
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
    cursor = conn.execute(_READ_RECEIVED + where, params)
    cursor.row_factory = None  # plain tuples: cheaper than sqlite3.Row
    return cursor.fetchall()


_READ_FRAGMENT_DATA = (
    "SELECT data, stored_at, stored_length FROM message_fragments WHERE conversation_handle = ? "
    "AND message_sequence_number = ? ORDER BY fragment_index"
)


def _joined_fragments(conn: sqlite3.Connection, handle: str, seq: int) -> bytes:
    """The body of a message kept :data:`IN_FRAGMENTS` (empty for an empty message).
    Fragments stored one after the other in a segment file (as one commit, or a run of
    them, appends them) are read back in one piece."""
    cursor = conn.execute(_READ_FRAGMENT_DATA, (handle, seq))
    cursor.row_factory = None
    pieces: list[bytes] = []
    start = end = -1
    for data, stored_at, length in cursor:
        if stored_at is not None and stored_at == end:
            end += length  # continues the run of stored bytes being gathered
            continue
        if start >= 0:
            pieces.append(read_stored(conn, start, end - start))
            start = end = -1
        if stored_at is None:
            pieces.append(bytes(data))
        else:
            start, end = stored_at, stored_at + length
    if start >= 0:
        pieces.append(read_stored(conn, start, end - start))
    return b"".join(pieces)


# -- fragments being reassembled ----------------------------------------------------------------

READ_FRAGMENT_POSITIONS = (
    "SELECT conversation_handle, message_sequence_number, fragment_index, fragment_offset, "
    "coalesce(stored_length, length(data)) FROM message_fragments AS f "
    "WHERE NOT EXISTS (SELECT 1 FROM queue_messages AS q "
    "WHERE q.conversation_handle = f.conversation_handle "
    "AND q.message_sequence_number = f.message_sequence_number AND q.body IS NOT NULL)"
)
"""Recovery: the fragments of partial messages (a complete message's are its body), with
what tells the size they were cut at (``protocol.fragments.cut_size``)."""


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


def read_fragments(conn: sqlite3.Connection, handle: str, seq: int) -> dict[int, bytes]:
    """The stored fragments of a message being reassembled, by fragment index."""
    rows = conn.execute(
        "SELECT fragment_index, data, stored_at, stored_length FROM message_fragments "
        "WHERE conversation_handle = ? AND message_sequence_number = ?",
        (handle, seq),
    )
    return {int(index): _data(conn, data, at, length) for index, data, at, length in rows}


def _data(conn: sqlite3.Connection, data: bytes, stored_at: int | None, length: int) -> bytes:
    """A row's body: its own, or the one it says is stored in a segment file."""
    if stored_at is None:
        return bytes(data)
    return read_stored(conn, stored_at, length)


def joined(fragments: dict[int, bytes]) -> bytes:
    """A message's body from its fragments by index."""
    return b"".join(fragments[index] for index in sorted(fragments))


# -- conversation timers -------------------------------------------------------------------------

READ_TIMERS = "SELECT conversation_handle, due FROM conversation_timers"


def set_timer(handle: str, due: float) -> Statement:
    return ("INSERT OR REPLACE INTO conversation_timers VALUES (?, ?)", (handle, due))


def forget_timer(handle: str) -> Statement:
    return ("DELETE FROM conversation_timers WHERE conversation_handle = ?", (handle,))


# -- the catalog ----------------------------------------------------------------------------------

CLEAR_CATALOG: tuple[Statement, ...] = (
    ("DELETE FROM message_types", ()),
    ("DELETE FROM contract_messages", ()),
    ("DELETE FROM queues", ()),
    ("DELETE FROM services", ()),
    ("DELETE FROM service_contracts", ()),
    ("DELETE FROM routes WHERE source != 'admin'", ()),
)
"""Before the configuration's catalog is written again (admin routes stay)."""
READ_ADMIN_ROUTES = "SELECT * FROM routes WHERE source = 'admin'"


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
