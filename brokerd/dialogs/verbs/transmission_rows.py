"""The transmission queue as the views show it (R-DLG-12, R-PROTO-4, R-OPS-1): the
``transmission_queue`` view a page at a time, and the admin port's summary of it.

What each database sent and has not had acknowledged is in memory (an endpoint's
``outbox``) or only in its file (its ``backlog``, recovered as numbers, or paged out);
what it received for a queue that is off is in the file. A backlog may hold a million
rows: a page of the view reads the rows of the endpoints it lists and no others, and
the summary reads one row of an endpoint whose messages are all in the file, and of the
messages held for queues that are off their count and the rows it lists.

May import: ``brokerd.dialogs.endpoints``, ``brokerd.dialogs.verbs.views`` and
``brokerd.dialogs.verbs.paging``, ``brokerd.storage``.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from typing import Any

from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.verbs import views
from brokerd.dialogs.verbs.paging import PageRequest, int_part, parse_cursor
from brokerd.storage import reads

Rows = list[dict[str, Any]]
_BEFORE_ANY = -(1 << 63)


async def transmission_queue(
    databases: Sequence[Database], request: PageRequest | None = None
) -> Rows:
    """The ``transmission_queue`` view: what each database sent and has not had
    acknowledged, then what it received for a queue that is off and holds until the
    queue is turned on. With ``request``, a superset of its page: the rows after its
    cursor of the endpoints in key order (database, handle) until more than a page is
    gathered, and as many held rows after it; without, every row."""
    if request is None:
        rows: Rows = []
        for db in databases:
            for ep in list(db.endpoints.values()):
                rows += await _rows_of(db, ep, 0, None)
        return rows + await _held(databases)
    after_db, after_handle, after_seq = "", "", 0
    if request.after:
        after_db, after_handle, seq_text = parse_cursor(request.after, 3)
        after_seq = int_part(seq_text)
    wanted = request.limit + 1
    listed = sorted(
        (
            (db.name, ep.handle_text, db, ep)
            for db in databases
            for ep in list(db.endpoints.values())
            if (ep.outbox or ep.backlog) and (db.name, ep.handle_text) >= (after_db, after_handle)
        ),
        key=lambda entry: (entry[0], entry[1]),
    )
    rows = []
    for name, handle, db, ep in listed:
        beyond = after_seq if (name, handle) == (after_db, after_handle) else 0
        rows += await _rows_of(db, ep, beyond, wanted - len(rows))
        if len(rows) >= wanted:
            break
    return rows + await _held_page(databases, after_db, after_handle, after_seq, wanted)


async def _rows_of(db: Database, ep: Endpoint, beyond: int, most: int | None) -> Rows:
    """``ep``'s rows above sequence number ``beyond``: those in memory, then those of its
    backlog read from the file, ``most`` of them at most (None: all)."""
    sent = [msg for msg in ep.outbox.values() if msg.seq > beyond]
    sent.sort(key=lambda msg: msg.seq)
    if most is not None:
        sent = sent[:most]
    rows = views.sent_rows(db, ep, sent)
    left = None if most is None else most - len(rows)
    if not ep.backlog or left == 0:
        return rows
    spans = [(max(lo, beyond + 1), hi) for lo, hi in ep.backlog.spans() if hi > beyond]
    if left is not None:
        spans = _first_numbers(spans, left)
    for first, last in spans:
        page = await db.store.run(
            functools.partial(reads.read_sent_page, handle=ep.handle_text, first=first, last=last)
        )
        rows += views.backlog_rows(db, ep, [row for row in page if row[0] in ep.backlog])
    return rows


def _first_numbers(spans: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """The runs cut to their first ``n`` numbers."""
    out = []
    for first, last in spans:
        if n <= 0:
            break
        last = min(last, first + n - 1)
        out.append((first, last))
        n -= last - first + 1
    return out


async def _held(databases: Sequence[Database]) -> Rows:
    """The rows of the messages received for queues that are off (R-DLG-12)."""
    rows: Rows = []
    for db in databases:
        off = [q.name for q in db.catalog.queues.values() if not q.status and not q.system]
        if off:
            held = await db.store.run(functools.partial(reads.read_held_for, queues=off))
            rows += views.held_for_disabled_queues(db, held)
    return rows


async def _held_summary(databases: Sequence[Database], listed: int) -> list[tuple[int, Rows]]:
    """Per database with a queue that is off and messages held for it (R-DLG-12): how
    many it holds, and the rows of its ``listed`` oldest (and of those that may show the
    same enqueue time), in the full view's order: what the summary shows of them, read
    with aggregates in SQLite, whatever is held (a queue off may hold a million)."""
    out: list[tuple[int, Rows]] = []
    for db in databases:
        off = [q.name for q in db.catalog.queues.values() if not q.status and not q.system]
        if not off:
            continue
        count, oldest = await db.store.run(
            functools.partial(reads.read_held_summary, queues=off, n=listed)
        )
        if count:
            out.append((count, views.held_for_disabled_queues(db, oldest)))
    return out


async def _held_page(
    databases: Sequence[Database], after_db: str, after_handle: str, after_seq: int, wanted: int
) -> Rows:
    """The first ``wanted`` rows, in key order (database, handle, sequence number), of the
    messages held for queues that are off after the cursor (``after_db``, ...): a page
    reads what it may show, not every message held (a queue off may hold a million)."""
    rows: Rows = []
    for db in sorted(databases, key=lambda d: d.name):
        if db.name < after_db or len(rows) >= wanted:
            continue
        off = [q.name for q in db.catalog.queues.values() if not q.status and not q.system]
        if not off:
            continue
        handle, seq = (after_handle, after_seq) if db.name == after_db else ("", _BEFORE_ANY)
        held = await db.store.run(
            functools.partial(
                reads.read_held_page, queues=off, handle=handle, seq=seq, limit=wanted - len(rows)
            )
        )
        rows += views.held_for_disabled_queues(db, held)
    return rows


async def transmission_backlog(
    databases: Sequence[Database], listed: int
) -> views.TransmissionBacklog:
    """The transmission queue as the admin port shows it (R-OPS-1): counts from memory,
    and from the file only the first row of each endpoint whose messages are all there
    and the ``listed`` oldest rows, and of the messages held for queues that are off a
    count and the ``listed`` oldest (:func:`_held_summary`), where the full view reads
    every row of every backlog and every message held."""
    heads: list[views.Head] = []
    for db in databases:
        in_file: list[Endpoint] = []
        for ep in list(db.endpoints.values()):
            head = views.head_of(db, ep)
            if head is not None:
                heads.append(head)
            elif ep.backlog:
                in_file.append(ep)
        if in_file:
            firsts = await db.store.run(
                functools.partial(
                    _first_pages, wanted=[(ep.handle_text, ep.backlog.first, 1) for ep in in_file]
                )
            )
            heads += [
                views.backlog_head(db, ep, page[0])
                for ep, page in zip(in_file, firsts, strict=True)
                if page and ep.backlog
            ]
    held = await _held_summary(databases, listed)
    oldest: Rows = []
    for head in views.oldest_heads(heads, listed):
        ep = head.ep
        wanted = listed - len(ep.outbox)
        page: list[reads.SentRow] = []
        if wanted > 0 and ep.backlog:
            (page,) = await head.db.store.run(
                functools.partial(_first_pages, wanted=[(ep.handle_text, ep.backlog.first, wanted)])
            )
        oldest += views.oldest_rows(head, listed, page)
    candidates = [row for _, rows in held for row in rows]
    oldest = sorted(oldest + candidates, key=lambda r: str(r["enqueued_at"]))[:listed]
    return views.TransmissionBacklog(
        total=sum(h.messages for h in heads) + sum(count for count, _ in held),
        peers=views.by_peer(heads, held),
        oldest=oldest,
    )


def _first_pages(
    conn: sqlite3.Connection, wanted: list[tuple[str, int, int]]
) -> list[list[reads.SentRow]]:
    """For each (handle, first, n): the unacknowledged rows of the conversation from
    sequence number ``first`` on, ``n`` at most (in the committer's thread, one call)."""
    return [reads.read_sent_page(conn, h, first, first + n - 1) for h, first, n in wanted]
