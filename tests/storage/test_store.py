"""The store: numbered migrations, the committer thread's group commit and its failures.

Real SQLite files in a temporary directory (R-DLG-13: nothing committed is lost).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
import uuid
from pathlib import Path

import pytest

from brokerd.errors import StoreError
from brokerd.storage import queries, schema
from brokerd.storage.connection import CHECKPOINT_PAGES, PAGE_CACHE_MB, PAGE_SIZE, connect
from brokerd.storage.store import Store


def _meta(path: Path) -> dict[str, str]:
    with sqlite3.connect(path) as conn:
        return {str(k): str(v) for k, v in conn.execute(schema.READ_META)}


async def test_a_new_file_gets_every_step_and_keeps_its_instance(tmp_path: Path) -> None:
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    instance = await store.open()
    await store.close()
    meta = _meta(path)
    assert meta["schema_version"] == str(schema.SCHEMA_VERSION)
    assert meta["broker_instance"] == str(instance)
    again = Store(path, "shop")
    assert await again.open() == instance
    await again.close()


async def test_a_file_newer_than_the_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    await store.close()
    with sqlite3.connect(path) as conn:
        conn.execute(schema.WRITE_META, ("schema_version", str(schema.SCHEMA_VERSION + 1)))
    with pytest.raises(StoreError, match="schema version"):
        await Store(path, "shop").open()


async def test_a_file_of_the_first_step_is_brought_up_to_date(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later step runs once, in order, on a file that has only the earlier ones."""
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    await store.close()
    step = schema.Migration(
        schema.SCHEMA_VERSION + 1,
        "a test table",
        "CREATE TABLE later_step (x INTEGER); INSERT INTO later_step VALUES (7)",
    )
    monkeypatch.setattr(schema, "MIGRATIONS", (*schema.MIGRATIONS, step))
    monkeypatch.setattr("brokerd.storage.connection.SCHEMA_VERSION", step.version)
    for _ in range(2):  # the second open applies nothing
        store = Store(path, "shop")
        await store.open()
        await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT x FROM later_step").fetchall() == [(7,)]
    assert _meta(path)["schema_version"] == str(step.version)


async def test_a_configured_instance_that_differs_from_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    await store.close()
    with pytest.raises(StoreError, match="holds broker instance"):
        await Store(path, "shop").open(uuid.uuid4())


async def test_jobs_submitted_together_commit_together_and_callbacks_run_in_order(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "shop.sqlite", "shop")
    await store.open()
    order: list[int] = []
    futures = [
        store.submit(
            [queries.meta(f"k{i}", str(i))],
            on_commit=lambda i=i: order.append(i),
            wait=True,
        )
        for i in range(200)
    ]
    await asyncio.gather(*[f for f in futures if f is not None])
    assert order == list(range(200))
    assert store.jobs_committed == 200
    assert store.commits < 200  # grouped
    rows = await store.query("SELECT COUNT(*) FROM meta WHERE key LIKE 'k%'")
    assert rows[0][0] == 200
    await store.close()


async def test_a_failing_job_fails_alone(tmp_path: Path) -> None:
    store = Store(tmp_path / "shop.sqlite", "shop")
    await store.open()
    good = store.submit([queries.meta("good", "1")], wait=True)
    bad = store.submit([("INSERT INTO no_such_table VALUES (1)", ())], wait=True)
    also_good = store.submit([queries.meta("also", "2")], wait=True)
    assert good is not None and bad is not None and also_good is not None
    await good
    await also_good
    with pytest.raises(StoreError, match="no such table"):
        await bad
    rows = await store.query("SELECT key FROM meta WHERE key IN ('good', 'also') ORDER BY key")
    assert [r[0] for r in rows] == ["also", "good"]
    await store.close()


async def test_a_job_after_a_failed_one_of_its_chain_is_refused_untried(tmp_path: Path) -> None:
    """A job extends a chain (a dialog's numbering, R-DLG-1): once one of its jobs failed,
    the later ones of that generation are refused without being tried, with a clear
    error; a job of the chain's next generation, or of another chain, commits; and the
    chain is forgotten once its next generation has committed."""
    store = Store(tmp_path / "shop.sqlite", "shop")
    await store.open()
    gate = await _busy(store)  # everything below is tried in one batch, then one by one
    bad = store.submit([("INSERT INTO no_such_table VALUES (1)", ())], wait=True, chains=[("d", 0)])
    after = store.submit([queries.meta("after", "1")], wait=True, chains=[("d", 0)])
    other = store.submit([queries.meta("other", "1")], wait=True, chains=[("e", 0)])
    both = store.submit([queries.meta("both", "1")], wait=True, chains=[("e", 0), ("d", 0)])
    other_after = store.submit([queries.meta("other2", "1")], wait=True, chains=[("e", 0)])
    renumbered = store.submit([queries.meta("renumbered", "1")], wait=True, chains=[("d", 1)])
    gate.set()
    outcomes = await asyncio.gather(
        *(f for f in (bad, after, other, both, other_after, renumbered) if f is not None),
        return_exceptions=True,
    )
    assert "no such table" in str(outcomes[0])
    assert isinstance(outcomes[1], StoreError)
    assert "an earlier write it follows failed" in str(outcomes[1])
    assert "no such table" in str(outcomes[1])
    assert outcomes[2] is None
    assert isinstance(outcomes[3], StoreError)  # d broke, and so e breaks with it
    assert isinstance(outcomes[4], StoreError)
    assert outcomes[5] is None
    rows = await store.query(
        "SELECT key FROM meta WHERE key IN ('after', 'other', 'both', 'other2', 'renumbered')"
    )
    assert sorted(r[0] for r in rows) == ["other", "renumbered"]
    assert store._running().chains.refusal([("d", 1)]) is None
    assert len(store._running().chains) == 1  # e is still broken in generation 0
    await store.close()


async def test_acknowledgements_of_many_conversations_remove_exactly_their_rows(
    tmp_path: Path,
) -> None:
    """Deletes of many conversations in one commit run as one statement per chunk of rows
    (``queries.MANY_ROWS``): each removes its conversation's range and nothing else."""
    store = Store(tmp_path / "shop.sqlite", "shop")
    await store.open()
    handles = [str(uuid.uuid4()) for _ in range(300)]  # more than one chunk of rows
    await store.execute_now(
        queries.sent_message(h, seq, "//t", 0, b"x", 1.0) for h in handles for seq in range(1, 8)
    )
    gate = await _busy(store)
    futures = [
        store.submit(queries.unqueue_sent(h, [5], through=i % 3, runs=[(7, 7)]), wait=True)
        for i, h in enumerate(handles)
    ]
    gate.set()
    await asyncio.gather(*(f for f in futures if f is not None))
    rows = await store.query(
        "SELECT conversation_handle, message_sequence_number FROM transmission_queue"
    )
    left: dict[str, list[int]] = {}
    for handle, seq in rows:
        left.setdefault(handle, []).append(seq)
    for i, h in enumerate(handles):
        assert sorted(left[h]) == [n for n in range(1, 8) if n > i % 3 and n not in (5, 7)]
    await store.close()


def _endpoint_row(handle: str, send_sequence: int, receive_sequence: int) -> schema.Statement:
    fixed = (handle, handle, 1, "g", "//s", "//f", None, "//c", "CO", 0, 1.0)
    return (queries.ENDPOINT_SNAPSHOT, (*fixed, send_sequence, receive_sequence, 0, 0, None, None))


async def test_an_endpoint_rows_send_sequence_never_goes_back(tmp_path: Path) -> None:
    """R-DLG-1: a snapshot taken while SENDs were committing counts only the committed
    ones, so it may be lower than the file's; the file keeps the higher number, within a
    batch and across batches, while the other columns take the latest snapshot."""
    store = Store(tmp_path / "shop.sqlite", "shop")
    await store.open()
    handle = str(uuid.uuid4())
    await store.execute_now([_endpoint_row(handle, 0, 0)])
    gate = await _busy(store)  # one batch: the SEND's own snapshot, then an older count
    store.submit([_endpoint_row(handle, 5, 1)])
    last = store.submit([_endpoint_row(handle, 3, 2)], wait=True)
    gate.set()
    assert last is not None
    await last
    later = store.submit([_endpoint_row(handle, 2, 4)], wait=True)
    assert later is not None
    await later
    rows = await store.query(
        "SELECT send_sequence, receive_sequence FROM conversation_endpoints "
        "WHERE conversation_handle = ?",
        (handle,),
    )
    assert tuple(rows[0]) == (5, 4)
    await store.close()


async def _busy(store: Store) -> threading.Event:
    """Keep the committer busy (inside a job) until the returned event is set: what is
    submitted meanwhile waits for the next commit, as under load."""
    gate = threading.Event()
    store.submit((), fn=lambda conn: gate.wait(10))
    await asyncio.sleep(0.2)  # the turn ends: the job is handed over and running
    return gate


async def test_parts_submitted_joined_in_one_turn_are_one_job_in_order(tmp_path: Path) -> None:
    """``submit_joined``: consecutive parts with one key are one job (one commit, the
    callbacks in order); a job of another kind between them starts a new one, so the
    order of submission is the order of the statements."""
    store = Store(tmp_path / "shop.sqlite", "shop")
    await store.open()
    gate = await _busy(store)
    order: list[str] = []
    failed: list[BaseException] = []
    for i in range(3):
        store.submit_joined(
            "k",
            [queries.meta(f"a{i}", str(i))],
            lambda i=i: order.append(f"a{i}"),
            failed.append,
            weight=10,
        )
    assert store.pending_weight == 30
    store.submit([queries.meta("a0", "overwritten")], on_commit=lambda: order.append("plain"))
    store.submit_joined("k", [queries.meta("b", "1")], lambda: order.append("b"), failed.append)
    gate.set()
    await store.wait_idle()
    assert order == ["a0", "a1", "a2", "plain", "b"]
    assert store.jobs_committed == 4  # the busy job, the a parts as one, the plain job, b
    assert store.pending_weight == 0
    assert not failed
    assert _meta(store.path)["a0"] == "overwritten"  # the plain job ran after the a parts
    await store.close()


async def test_a_part_grows_only_while_it_is_the_last_one_of_the_turn(tmp_path: Path) -> None:
    """``join_last``: statements join the part whose callback is still the last of the
    turn's last joined job (replacing its last statement when asked), and nothing else:
    not another callback's part, not once another part or job came after it, not once
    the committer has taken the turn."""
    store = Store(tmp_path / "shop.sqlite", "shop")
    await store.open()
    gate = await _busy(store)
    order: list[str] = []

    def run() -> None:
        order.append("run")

    def other() -> None:
        order.append("other")

    store.submit_joined("k", [queries.meta("row", "1"), queries.meta("snap", "1")], run, print)
    assert store.join_last(
        "k", run, [queries.meta("row2", "2"), queries.meta("snap", "2")], 5, True
    )
    assert store.pending_weight == 5
    assert not store.join_last("k", other, [queries.meta("no", "1")])  # not its callback
    assert not store.join_last("j", run, [queries.meta("no", "1")])  # not its key
    store.submit_joined("k", [queries.meta("o", "1")], other, print)
    assert not store.join_last("k", run, [queries.meta("no", "1")])  # another part came after
    store.submit([queries.meta("plain", "1")])
    assert not store.join_last("k", other, [queries.meta("no", "1")])  # a job came after
    gate.set()
    await store.wait_idle()
    assert not store.join_last("k", other, [queries.meta("no", "1")])  # taken and committed
    meta = _meta(store.path)
    assert (meta["row"], meta["row2"], meta["snap"], meta["o"]) == ("1", "2", "2", "1")
    assert "no" not in meta
    assert order == ["run", "other"]  # one callback for the grown part
    await store.close()


async def test_a_joined_job_fails_as_a_whole_and_alone(tmp_path: Path) -> None:
    """A failing part fails its joined job once (the first part's ``on_failure``), and
    no part's ``on_commit`` runs; a job of its own in the same commit still commits."""
    store = Store(tmp_path / "shop.sqlite", "shop")
    await store.open()
    gate = await _busy(store)
    committed: list[str] = []
    failures: list[str] = []
    good = store.submit([queries.meta("good", "1")], wait=True)
    store.submit_joined(
        "k",
        [queries.meta("p1", "1")],
        lambda: committed.append("p1"),
        lambda e: failures.append("1"),
    )
    store.submit_joined(
        "k",
        [("INSERT INTO no_such_table VALUES (1)", ())],
        lambda: committed.append("p2"),
        lambda e: failures.append("2"),
    )
    assert good is not None
    gate.set()
    await good
    await store.wait_idle()
    assert committed == [] and failures == ["1"]
    assert "p1" not in _meta(store.path) and _meta(store.path)["good"] == "1"
    await store.close()


async def test_close_commits_what_is_pending_and_refuses_more(tmp_path: Path) -> None:
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    store.submit([queries.meta("last", "1")])
    await store.close()
    assert _meta(path)["last"] == "1"
    with pytest.raises(StoreError):
        store.submit([queries.meta("later", "1")])


async def test_a_file_written_by_the_first_schema_is_brought_up_to_date(tmp_path: Path) -> None:
    """A database file of an earlier brokerd (schema step 1) opens and is migrated."""
    path = tmp_path / "shop.sqlite"
    instance = uuid.uuid4()
    with sqlite3.connect(path) as conn:
        conn.executescript(schema.MIGRATIONS[0].script)
        conn.executemany(
            schema.WRITE_META,
            [("schema_version", "1"), ("broker_instance", str(instance)), ("database", "shop")],
        )
    store = Store(path, "shop")
    assert await store.open() == instance
    await store.close()
    with sqlite3.connect(path) as conn:
        indexes = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")]
        columns = [r[1] for r in conn.execute("PRAGMA table_info(queues)")]
        endpoint_columns = [r[1] for r in conn.execute("PRAGMA table_info(conversation_endpoints)")]
        sent_columns = [r[1] for r in conn.execute("PRAGMA table_info(transmission_queue)")]
        key_columns = [r[1] for r in conn.execute("PRAGMA table_info(send_keys)")]
        begin_key_columns = [r[1] for r in conn.execute("PRAGMA table_info(begin_dialog_keys)")]
        rollback_columns = [r[1] for r in conn.execute("PRAGMA table_info(message_rollbacks)")]
        quarantine_columns = [
            r[1] for r in conn.execute("PRAGMA table_info(quarantined_conversations)")
        ]
    assert "queue_messages_ready" not in indexes
    assert "transmission_queue_stored" in indexes
    assert "configured_status" in columns
    assert {"far_peer", "dialog_key"} <= set(endpoint_columns)
    assert {"stored_at", "stored_length"} <= set(sent_columns)
    assert key_columns == ["conversation_handle", "key", "sequence_number", "created_at"]
    assert "send_keys_created" in indexes
    assert begin_key_columns == [
        "service_name",
        "key",
        "conversation_handle",
        "arguments",
        "created_at",
    ]
    assert {"begin_dialog_keys_handle", "begin_dialog_keys_created"} <= set(indexes)
    assert {"rollbacks", "last_error"} <= set(rollback_columns)
    assert {"message_type", "rollbacks", "last_error"} <= set(quarantine_columns)
    assert _meta(path)["schema_version"] == str(schema.SCHEMA_VERSION) == "10"


async def test_start_up_statements_run_in_their_order(tmp_path: Path) -> None:
    """The catalog is rewritten as deletes, then inserts: none may be regrouped."""
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    for _ in range(2):
        await store.execute_now(
            [*queries.CLEAR_CATALOG, queries.queue("OrderQueue", False, False, True)]
        )
    rows = await store.fetchall(queries.READ_QUEUE_STATES)
    assert [tuple(r) for r in rows] == [("OrderQueue", 0, 1)]
    await store.close()


async def test_a_mirror_installs_a_copy_of_another_page_size(tmp_path: Path) -> None:
    """A principal's file created with 4 KiB pages is installed over a mirror's file of
    16 KiB pages (created by a version that made files with them): a file in WAL mode
    refuses such a backup, so it goes in rollback-journal mode and the file returns to
    WAL, with the principal's page size."""
    from brokerd.storage.replica import Replica

    principal = Store(tmp_path / "principal.sqlite", "shop")
    principal.replica = Replica(role=lambda: "principal", epoch=lambda: 1)
    await principal.open()
    await principal.execute_now([queries.sent_message(str(uuid.uuid4()), 1, "//t", 0, b"x", 1.0)])
    data = tmp_path / "copy"
    await principal.snapshot_to(data)
    await principal.close()

    old = tmp_path / "mirror.sqlite"
    conn = sqlite3.connect(old)
    conn.execute("PRAGMA page_size=16384")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(schema.CREATE_META)
    conn.close()  # the mirror's store is then the file's only connection
    mirror = Store(old, "shop")
    mirror.replica = Replica(role=lambda: "mirror", epoch=lambda: 1)
    await mirror.open()
    await mirror.install_snapshot(data, [])
    assert [tuple(r) for r in await mirror.query("SELECT count(*) FROM transmission_queue")] == [
        (1,)
    ]
    await mirror.close()
    conn = sqlite3.connect(old)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert conn.execute("PRAGMA page_size").fetchone() == (PAGE_SIZE,) == (4096,)
    conn.close()


async def test_a_held_message_completed_and_released_in_one_commit_is_ready(
    tmp_path: Path,
) -> None:
    """R-DLG-1, R-DLG-13: the store runs each kind of UPDATE as one group, in order of
    first appearance. A message of several fragments whose last fragment arrives out of
    order, and the message that releases it, in one commit behind another
    conversation's promotion: its row ends ready, so recovery never takes it for held
    (a held row at or below the receive sequence made every acknowledgement of its
    dialog invalid, and the message was never delivered)."""
    store = Store(tmp_path / "warehouse.sqlite", "warehouse")
    await store.open()
    h, other, group = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())

    def row(handle: str, seq: int, status: int, body: bytes | None) -> schema.Statement:
        return queries.queued_message(
            "q", group, handle, seq, status, "//s", "//c", "//t", 2, body, 1.0
        )

    # Earlier commits: the first fragment of h's message 2, and other's message 5, held.
    for statements in (
        [row(h, 2, 2, None), queries.fragment(h, 2, 0, 0, b"a")],
        [row(other, 5, 2, b"x")],
    ):
        earlier = store.submit(statements, wait=True)
        assert earlier is not None
        await earlier
    # The committer is held by a job of its own while the three below queue up, so
    # they commit together, in this order.
    busy = asyncio.ensure_future(store.run(lambda conn: time.sleep(0.3)))
    await asyncio.sleep(0.05)
    futures = [
        store.submit(queries.promote(other, [5]), wait=True),  # first UPDATE of its kind
        store.submit(  # h's message 2 completes, still held behind message 1
            [queries.fragment(h, 2, 1, 1, b"b"), queries.complete_in_fragments(h, 2)],
            wait=True,
        ),
        store.submit([row(h, 1, 1, b"1"), *queries.promote(h, [2])], wait=True),
    ]
    await asyncio.gather(busy, *[f for f in futures if f is not None])
    statuses = await store.query(
        "SELECT message_sequence_number, status FROM queue_messages "
        "WHERE conversation_handle = ? ORDER BY message_sequence_number",
        (h,),
    )
    assert [tuple(r) for r in statuses] == [(1, 1), (2, 1)]
    assert await store.query(queries.READ_HELD) == []
    await store.close()


async def test_the_connection_keeps_the_page_cache_it_was_given(tmp_path: Path) -> None:
    """``limits.page_cache_mb``: by default SQLite's own 2 MB, which one commit of a few
    1 MiB messages outgrows; a larger one is asked of SQLite as given."""
    store = Store(tmp_path / "shop.sqlite", "shop", page_cache_mb=64)
    await store.open()
    assert (await store.query("PRAGMA cache_size"))[0][0] == -64 * 1024
    await store.close()
    default = Store(tmp_path / "warehouse.sqlite", "warehouse")
    await default.open()
    assert (await default.query("PRAGMA cache_size"))[0][0] == -PAGE_CACHE_MB * 1024
    await default.close()


async def test_the_wal_is_checkpointed_after_its_own_length_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """The WAL is copied into the file every :data:`CHECKPOINT_PAGES` pages (R-DLG-5:
    every COMMIT is durable in the WAL before it returns): rows committed past a
    checkpoint, with the WAL left as it was (no clean close), are all there when the
    file is opened again."""
    path = tmp_path / "shop.sqlite"
    store = Store(path, "shop")
    await store.open()
    assert (await store.query("PRAGMA wal_autocheckpoint"))[0][0] == CHECKPOINT_PAGES
    assert (await store.query("PRAGMA journal_mode"))[0][0] == "wal"
    await store.close()
    # more pages than one WAL's length, in commits of their own: at least one checkpoint
    conn = connect(path)
    conn.execute("CREATE TABLE filler (k INTEGER PRIMARY KEY, body BLOB)")
    rows = CHECKPOINT_PAGES + 500
    for k in range(0, rows, 50):
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO filler VALUES (?, ?)", [(i, bytes(PAGE_SIZE)) for i in range(k, k + 50)]
        )
        conn.execute("COMMIT")
    # the WAL file grew to one length and was then written again from its start
    frames = Path(f"{path}-wal").stat().st_size // (PAGE_SIZE + 24)
    assert CHECKPOINT_PAGES <= frames < CHECKPOINT_PAGES + 200 < 2 * rows
    copy = tmp_path / "copy"
    copy.mkdir()
    for suffix in ("", "-wal"):  # the files as a kill -9 leaves them
        (copy / f"shop.sqlite{suffix}").write_bytes(Path(f"{path}{suffix}").read_bytes())
    conn.close()
    again = connect(copy / "shop.sqlite")
    assert tuple(again.execute("SELECT count(*), max(k) FROM filler").fetchone()) == (
        rows,
        rows - 1,
    )
    again.close()
