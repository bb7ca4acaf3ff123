"""Storage: one SQLite file per database and every SQL statement.

Owns the schema and its numbered migrations, the statements the daemon runs,
the single group-committing writer of each file, the catalog (message
types, contracts, queues, services and routes, SPEC §1) as it is persisted, and the
conversation handles that key the rows, made to sort in the order they were made
(``keys``), and the segment files beside each file that hold large bodies instead of
its rows, collected and compacted (``body_files``).

May import: ``protocol``, ``brokerd.config``, ``brokerd.errors``. Nothing above it
(dialogs, routing, server) and nothing of the SDK.
"""
