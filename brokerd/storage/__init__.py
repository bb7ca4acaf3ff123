"""Storage: one SQLite file per database and every SQL statement.

Owns the schema and its numbered migrations (``schema``), the statements that write
(``queries``, which also re-exports what the dialog engine reads of the others), the
reads that are functions of a connection (``reads``), RECEIVE's statements over runs
of sequence numbers (``sequence_runs``), the connection to each file and its opening
(``connection``), the single group-committing writer of each file, its committer
thread (``committer``) with its commit-latency histogram (``latency``) and the event
loop's side of it (``store``), how a batch
becomes SQL (``batch_sql``), the jobs a failed one takes down with it (``chains``),
what a mirrored database records (``replica``), the catalog (message types,
contracts, queues, services and routes, SPEC §1) as it is persisted (``catalog``),
and the conversation handles that key the rows, made to sort in the order they were
made (``keys``), the segment files beside each file that hold large bodies instead
of its rows, collected and compacted (``body_files``), and the rows of poison-message
handling: rollback counts and quarantined conversations (``poison_rows``, SPEC §6),
and a file read back as a witness for the trace audit (``witness``, R-TRACE-2).

May import: ``protocol``, ``brokerd.config``, ``brokerd.errors``. Nothing above it
(dialogs, routing, server) and nothing of the SDK.
"""
