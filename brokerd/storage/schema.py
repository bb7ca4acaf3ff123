"""The schema of a database file: its tables as numbered migrations, and its ``meta`` table.

Owns (SPEC R-OBJ-3..6, R-DLG-13; docs/design.md "Storage"):

* :data:`MIGRATIONS`, the schema as numbered steps. A file records the last
  step applied (``meta.schema_version``); opening it applies the later ones in
  order, each in its own transaction, and refuses a file newer than this code
  (:func:`brokerd.storage.connection.open_file`);
* the statements of the ``meta`` table, and the ``AutoCreatedLocal`` route every new
  file is given;
* what the empty body of a ``queue_messages`` row means (:data:`IN_ELSEWHERE`,
  :data:`IN_FRAGMENTS`);
* :data:`Statement`, the form every write to these tables takes.

Tables: the catalog (``message_types``, ``contract_messages``, ``queues``,
``services``, ``service_contracts``, ``routes``), ``conversation_endpoints``,
``transmission_queue``, ``queue_messages`` (status 0-3 as in R-OBJ-3),
``message_fragments`` (fragments of messages being reassembled, and the body of a
message of several fragments once complete, see :data:`IN_FRAGMENTS`),
``conversation_timers``, ``send_keys``, ``begin_dialog_keys``, and poison-message
handling's ``message_rollbacks`` and ``quarantined_conversations``.

May import: nothing of brokerd (the standard library only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Statement = tuple[str, Sequence[Any]]
"""One write: SQL text and its parameters."""


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
    Migration(
        8,
        "a SEND's idempotency key is kept with its sequence number, so that a SEND "
        "retried after an unknown outcome is committed once (limits.send_key_window)",
        "CREATE TABLE IF NOT EXISTS send_keys (conversation_handle TEXT NOT NULL, "
        "key TEXT NOT NULL, sequence_number INTEGER NOT NULL, created_at REAL NOT NULL, "
        "PRIMARY KEY (conversation_handle, key)) WITHOUT ROWID;"
        "CREATE INDEX IF NOT EXISTS send_keys_created ON send_keys (created_at)",
    ),
    Migration(
        9,
        "poison-message handling: how many times each received message was rolled back "
        "(and the last reason given), and the conversations quarantined for a message "
        "rolled back too often, so that neither is reset by a restart (SPEC §6)",
        "CREATE TABLE IF NOT EXISTS message_rollbacks (conversation_handle TEXT NOT NULL, "
        "message_sequence_number INTEGER NOT NULL, rollbacks INTEGER NOT NULL, "
        "last_error TEXT NOT NULL, "
        "PRIMARY KEY (conversation_handle, message_sequence_number)) WITHOUT ROWID;"
        "CREATE TABLE IF NOT EXISTS quarantined_conversations ("
        "conversation_handle TEXT PRIMARY KEY, message_sequence_number INTEGER NOT NULL, "
        "message_type TEXT NOT NULL, rollbacks INTEGER NOT NULL, last_error TEXT NOT NULL, "
        "quarantined_at REAL NOT NULL)",
    ),
    Migration(
        10,
        "a BEGIN DIALOG's idempotency key is kept with the handle of the dialog it began "
        "(and the arguments it was begun with), unique per initiating service, so that a "
        "BEGIN DIALOG retried after an unknown outcome begins one dialog "
        "(limits.send_key_window)",
        "CREATE TABLE IF NOT EXISTS begin_dialog_keys (service_name TEXT NOT NULL, "
        "key TEXT NOT NULL, conversation_handle TEXT NOT NULL, arguments TEXT NOT NULL, "
        "created_at REAL NOT NULL, PRIMARY KEY (service_name, key)) WITHOUT ROWID;"
        "CREATE INDEX IF NOT EXISTS begin_dialog_keys_handle ON begin_dialog_keys "
        "(conversation_handle);"
        "CREATE INDEX IF NOT EXISTS begin_dialog_keys_created ON begin_dialog_keys (created_at)",
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


# -- the body of a queue row whose bytes are elsewhere ------------------------------------

IN_ELSEWHERE = b""
"""The body column of a complete message whose bytes are not in its row: in its
fragments (:data:`IN_FRAGMENTS`), or in a segment file (the row's ``stored_at`` says
where: ``queries.QUEUED_STORED``). An empty message's row has it too, with neither:
RECEIVE looks at ``stored_at`` first, then at the fragments, and finds nothing."""

IN_FRAGMENTS = IN_ELSEWHERE
"""The body column of a complete message of several fragments (R-DLG-7): its bytes stay
in ``message_fragments``, where they were stored as they arrived, and RECEIVE joins
them (``reads.read_received``). Joining them into the queue row when the last fragment
arrived read the whole body back, wrote it a second time and deleted the fragments: for
a 1 MiB body, a third of the receiving broker's work. A message of several fragments is
never empty (its length is at least its fragment count), and a partial one has no body
(NULL), so an empty body with fragments stored can only mean this. The fragments leave
with the row: every statement of :mod:`brokerd.storage.queries` that removes complete
rows removes their fragments too."""
