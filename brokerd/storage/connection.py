"""The committer's connection to a database file, and opening the file.

Owns (SPEC R-OBJ-6, R-DLG-13; docs/design.md "Storage"):

* the connection's settings (:func:`connect`): page size, WAL journal,
  ``synchronous=FULL`` (a committed job survives ``kill -9`` and power loss) and the
  page cache, and the WAL checkpointed every :data:`CHECKPOINT_PAGES` and cut back to
  that length after a longer transaction (:func:`wal_size_limit`);
* opening the file (:func:`open_file`): the numbered migrations of
  :mod:`brokerd.storage.schema`, the persisted broker instance identifier and the
  ``AutoCreatedLocal`` route; then its segment files of large bodies
  (:func:`open_bodies`);
* copying another file's image over it, whatever its page size (:func:`backup`: a
  mirror installing the principal's copy), and rolling back what failed
  (:func:`rollback`).

Everything here runs in the store's committer thread (:mod:`brokerd.storage.committer`).

May import: ``brokerd.errors``, ``brokerd.storage.schema``, ``brokerd.storage.queries``
and ``brokerd.storage.body_files``.
"""

from __future__ import annotations

import logging
import sqlite3
import uuid
from pathlib import Path

from brokerd.errors import StoreError
from brokerd.storage import body_files, queries, schema
from brokerd.storage.body_files import TABLES, BodyFiles
from brokerd.storage.schema import AUTO_CREATED_LOCAL, SCHEMA_VERSION

log = logging.getLogger("brokerd.storage.store")
"""The store's log (its modules share it)."""

PAGE_SIZE = 4 * 1024
"""Page size of a database file brokerd creates (an existing file keeps its own):
SQLite's default. Every page a commit changes is a WAL frame, written again by the
checkpoint, so the page is the unit of what a commit writes: a commit that changes
a few rows each of many conversations (many dialogs at once, W4) writes a whole page
for each place it touches, and 4 KiB pages wrote a quarter less per message than
16 KiB ones there at the same CPU (docs/performance.md, "Smaller pages (W4)"). Large
bodies are not in pages (:data:`~brokerd.storage.body_files.STORED_FROM` and up go
to segment files); a body below that may still spill into a chain of overflow pages,
each a WAL frame, as many bytes as it has."""


PAGE_CACHE_MB = 2
"""The page cache of a database's connection by default (``limits.page_cache_mb``):
SQLite's own default. docs/performance.md measures 64 MB ("The floor under W3, and the
page cache"): large messages gain a little, a large backlog's RSS grows by the cache."""


CHECKPOINT_PAGES = 8000
"""WAL pages (32 MiB at :data:`PAGE_SIZE`) after which a COMMIT copies them into the
database file (``PRAGMA wal_autocheckpoint``; SQLite's default is 1,000). A checkpoint
writes each page the WAL holds once, however many commits changed it: the rows of a
busy database (the transmission queue, the endpoint rows) are changed again and again,
so a longer WAL copies the same pages fewer times. In W4 each daemon wrote 2.8 kB a
message at 4,000 pages instead of 3.0-3.1 at 1,000 (a Zen 4 day), and 2.84-2.96 at 8,000
instead of 2.99-3.05 at 4,000 on a slower CPU, whose commits hold fewer messages; the
rate stayed within its noise, and W4 ran no faster with no checkpoint at all, so the
longer copy inside one COMMIT is not what bounds it (docs/performance.md, "A longer WAL
between checkpoints"). A crash loses nothing either way: the WAL is durable at each COMMIT."""

WAL_HEADER = 32
WAL_FRAME_HEADER = 24
"""A WAL file is a header and then one frame a page: the page behind a header of its own."""


def wal_size_limit(page_size: int) -> int:
    """The WAL's length in bytes between two checkpoints, :data:`CHECKPOINT_PAGES` frames
    of ``page_size``: what the WAL is cut back to when it is written again from its start
    (``PRAGMA journal_size_limit``). One COMMIT of more pages grows the WAL past it, since
    the COMMIT is durable in the WAL before it is copied into the file; without a limit
    SQLite keeps the file that long for ever, writing it again from its start. The cut
    costs no COMMIT anything: SQLite makes it once a WAL, at the first COMMIT after the
    checkpoint, and a WAL of a busy database's usual length loses only the frames its last
    COMMIT wrote past the checkpoint's length (the commits after it write over the same
    bytes, whose blocks the file keeps)."""
    return WAL_HEADER + CHECKPOINT_PAGES * (WAL_FRAME_HEADER + page_size)


def limit_wal(conn: sqlite3.Connection) -> None:
    """Cut the WAL of ``conn``'s file back to :func:`wal_size_limit` of the file's own page
    size (an existing file keeps the one it was created with) once it is checkpointed."""
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    conn.execute(f"PRAGMA journal_size_limit={wal_size_limit(int(page_size))}")


def connect(path: Path, page_cache_mb: int = PAGE_CACHE_MB) -> sqlite3.Connection:
    """A connection to ``path`` with the store's settings: page size, WAL checkpointed
    every :data:`CHECKPOINT_PAGES` and cut back to that length (:func:`wal_size_limit`),
    ``synchronous=FULL``, and a page cache of ``page_cache_mb``."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    # Only takes effect while the file is still empty (before its first table).
    conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=OFF")
    conn.execute(f"PRAGMA cache_size=-{page_cache_mb * 1024}")  # negative: in KiB
    conn.execute(f"PRAGMA wal_autocheckpoint={CHECKPOINT_PAGES}")
    limit_wal(conn)
    return conn


def open_file(
    conn: sqlite3.Connection, path: Path, database: str, broker_instance: uuid.UUID | None
) -> uuid.UUID:
    """Bring the file up to date, each later step of :data:`schema.MIGRATIONS` in a
    transaction of its own (a file newer than this code is refused), and return its
    broker instance identifier: the one it holds or, for a new file, ``broker_instance``
    (or a new one), stored with the database's name and the ``AutoCreatedLocal`` route."""
    conn.execute(schema.CREATE_META)
    meta = {str(k): str(v) for k, v in conn.execute(schema.READ_META).fetchall()}
    try:
        version = int(meta.get("schema_version", "0"))
        stored = meta.get("broker_instance")
        held = None if stored is None else uuid.UUID(stored)
    except ValueError as exc:
        raise StoreError(f"{path}: a damaged meta table ({exc}); restore the file") from exc
    if version > SCHEMA_VERSION:
        raise StoreError(f"{path}: schema version {version}, this brokerd reads {SCHEMA_VERSION}")
    for step in schema.MIGRATIONS:
        if step.version > version:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for sql in step.script.split(";"):
                    if sql.strip():
                        conn.execute(sql)
                conn.execute(schema.WRITE_META, ("schema_version", str(step.version)))
                conn.execute("COMMIT")
            except BaseException:
                rollback(conn)
                raise
            log.info("%s: schema step %d applied (%s)", path, step.version, step.what)
    if held is not None:
        instance = held
        if broker_instance is not None and broker_instance != instance:
            raise StoreError(
                f"{path}: holds broker instance {instance}, but the configuration "
                f"says {broker_instance}"
            )
        return instance
    instance = broker_instance or uuid.uuid4()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        schema.WRITE_META, [("broker_instance", str(instance)), ("database", database)]
    )
    conn.execute(schema.ADD_AUTO_CREATED_LOCAL, (AUTO_CREATED_LOCAL,))
    conn.execute("COMMIT")
    return instance


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back the transaction in progress, if any (a failed rollback is logged)."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            log.exception("store: rollback failed")


def open_bodies(
    conn: sqlite3.Connection,
    path: Path,
    mirrored: bool,
    segment_bytes: int | None = None,
    compact_after: float | None = None,
) -> BodyFiles | None:
    """Open the database's segment files of large bodies (the committer's, handed to the
    jobs that read them), deleting the segments no row refers to; a mirrored database
    (R-ROUTE-16) has none, and takes back into its rows the bodies it stored before it
    was mirrored."""
    directory = body_files.directory_of(path)
    if not mirrored:
        bodies = BodyFiles(directory, segment_bytes, compact_after)
        bodies.open(conn)
        return bodies
    rows = {table: conn.execute(queries.stored_rows(table)).fetchall() for table in TABLES}
    if not any(rows.values()):
        return None
    files = BodyFiles(directory)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for table, stored in rows.items():
                for rowid, stored_at, length in stored:
                    body = files.read(stored_at, length)
                    conn.execute(queries.inline_row(table), (body, rowid))
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise
        files.open(conn)  # every segment is now unreferenced
    finally:
        files.close()
    return None


def backup(source: sqlite3.Connection, conn: sqlite3.Connection) -> None:
    """Copy ``source`` over ``conn``'s file. A file in WAL mode refuses a copy of another
    page size (partners whose files were created by versions with different page
    sizes, :data:`PAGE_SIZE`; SQLite reports it as a write to a read-only database,
    and ``PRAGMA page_size`` does not tell, since :func:`connect` asked for ours):
    the copy then goes in rollback-journal mode, which takes the source's page size,
    and the file returns to WAL, its length limited for the page size it took."""
    try:
        source.backup(conn)
        return
    except sqlite3.OperationalError:
        conn.execute("PRAGMA journal_mode=DELETE")
    try:
        source.backup(conn)
    finally:
        conn.execute("PRAGMA journal_mode=WAL")
        limit_wal(conn)
