"""Poison-message handling (SPEC §6, R-OBJ-3): rollbacks counted per message, and what a
queue's ``poison_message_handling`` does once one message reaches its
``poison_rollbacks``.

* Every message a ROLLBACK puts back (an explicit one, a COMMIT that refused a verb,
  or a client connection lost mid-transaction) counts one rollback, with the reason
  the client gave (the last one is kept). The count is written with the rollback,
  and the ROLLBACK's answer waits for it, so a restart goes on from it. A daemon
  that stops gracefully, or a database whose image was dropped (R-ROUTE-16), puts
  messages back without counting: neither is the message's fault.
* ``quarantine`` (the default): the message's conversation is set aside (its
  messages are kept, in order, and no RECEIVE takes them) while every other
  conversation of the queue flows. It stays so across restarts, until it is
  released (:meth:`PoisonVerbs.release`: receivable again, counts reset) or ended
  with an error (:meth:`PoisonVerbs.end`: END CONVERSATION WITH ERROR, the far side
  gets the Error).
* ``disable``: SQL Server's POISON_MESSAGE_HANDLING (STATUS = ON): the queue is
  turned off (R-DLG-12). ALTER QUEUE ... STATUS = ON (:meth:`PoisonVerbs.alter_queue`)
  makes everything receivable again and resets the counts of its messages.
* ``off``: counted, nothing else.

A commit that removes a message removes its count with it (:meth:`received_work`).

May import: :mod:`brokerd.dialogs.verbs.conversation`, ``brokerd.dialogs.endpoints``
and what they may import.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from brokerd.config import PoisonHandling
from brokerd.dialogs.endpoints.commits import commit, commit_statements
from brokerd.dialogs.endpoints.database import Database, Lease
from brokerd.dialogs.endpoints.directory import Directory
from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.endpoints.events import DialogEvents
from brokerd.dialogs.endpoints.poison import Quarantine, Rollbacks
from brokerd.dialogs.endpoints.ready import Item
from brokerd.dialogs.endpoints.states import DELIVERING
from brokerd.dialogs.endpoints.work import Work
from brokerd.dialogs.verbs import views
from brokerd.dialogs.verbs.conversation import ConversationVerbs
from brokerd.errors import NotQuarantined, StoreError
from brokerd.storage import poison_rows, queries
from brokerd.storage.schema import Statement

log = logging.getLogger("brokerd.dialogs.poison")

SETTLE_WAIT = 5.0
"""Seconds a view waits for rollback counts in flight (a full disk must not hang it)."""

MessageTypes = Mapping[tuple[str, int], str]
"""The message type of each message a transaction received, by (handle text, number)."""


class PoisonVerbs:
    """Rollback counts, and quarantine, release and end of poisoned conversations."""

    def __init__(
        self,
        directory: Directory,
        conversations: ConversationVerbs,
        events: DialogEvents,
        clock: Callable[[], float],
    ) -> None:
        self.directory = directory
        self.conversations = conversations
        self.events = events
        self.clock = clock
        self._writing: set[asyncio.Future[Any]] = set()
        """Writes of counts (and quarantines, and queues disabled) not yet in their file."""

    # -- counting -------------------------------------------------------------------------

    def rolled_back(
        self, leases: Iterable[Lease], reason: str, types: MessageTypes
    ) -> list[asyncio.Future[Any]]:
        """Count one rollback of every message of ``leases`` that is back in its queue (they
        were put back just before, in this turn of the loop) and act on a queue's policy.

        Memory changes at once, so the next rollback of the same message counts from
        this one; the returned futures (one per database written) are done once the
        counts are in the file (a failed write is logged, and fails its future). Their
        trace events (``rolled_back``, ``quarantined``, ``queue_disabled``) are written
        once they are (R-TRACE-1)."""
        statements: dict[Database, list[Statement]] = {}
        traced: dict[Database, list[Callable[[], None]]] = {}
        for lease in leases:
            db = lease.db
            if lease.image != db.image:
                continue  # an image that is gone (R-ROUTE-16): nothing to count against
            if not lease.counted:
                continue  # taken for a client that had stopped waiting: not their fault
            rows = statements.setdefault(db, [])
            events = traced.setdefault(db, [])
            for item in lease.items:
                ep = db.endpoints.get(item[0])
                if ep is None or ep.state not in DELIVERING:
                    continue  # ended meanwhile: the message is gone, not put back
                rows += self._count(db, lease.queue, ep, item, reason, types, events)
        futures = []
        for db, rows in statements.items():
            if not rows:
                continue
            try:
                future = db.store.submit(
                    rows,
                    on_commit=_run_all(traced[db]),
                    on_failure=_log_failure(db),
                    wait=True,
                )
            except StoreError as exc:  # its file is closing: the rollback stands, uncounted
                _log_failure(db)(exc)
                continue
            assert future is not None
            future.add_done_callback(_seen)
            self._writing.add(future)
            future.add_done_callback(self._writing.discard)
            futures.append(future)
        return futures

    async def settled(self) -> None:
        """Wait (at most :data:`SETTLE_WAIT` seconds) for the rollback counts written so far.

        Memory changes at once, so that no RECEIVE takes a message its rollback has just
        quarantined; the views that show poison-message handling (``quarantined``,
        ``queues``) wait for this first and so show what a restart would find. A rollback
        nobody waits for (a client's connection lost mid-transaction) would otherwise show
        a quarantine that a kill -9 a moment later undoes."""
        if self._writing:
            await asyncio.wait(set(self._writing), timeout=SETTLE_WAIT)

    def _count(
        self,
        db: Database,
        queue: str,
        ep: Endpoint,
        item: Item,
        reason: str,
        types: MessageTypes,
        traced: list[Callable[[], None]],
    ) -> list[Statement]:
        """Count a rollback of ``item``; the rows that write it, and what traces it once
        they are written appended to ``traced``."""
        counted = db.poison.counts.get(item)
        if counted is None:
            counted = db.poison.counts[item] = Rollbacks(0, "")
        counted.count += 1
        counted.last_error = reason
        handle, seq = item
        events = self.events
        traced.append(partial(events.rolled_back, ep, queue, seq, counted.count, reason))
        rows = [poison_rows.counted(handle, seq, counted.count, reason)]
        info = db.catalog.queues[queue]
        policy = info.poison
        if counted.count < policy.rollbacks or policy.handling is PoisonHandling.OFF:
            return rows
        if policy.handling is PoisonHandling.DISABLE:
            if info.status:
                info.status = False
                db.ready[queue].changed.set()  # a RECEIVE waiting on it leaves: queue_disabled
                rows.append(queries.set_queue_status(queue, False))
                traced.append(partial(events.queue_disabled, ep, queue, seq, counted.count, reason))
            return rows
        if handle in db.poison.quarantined:
            return rows
        message_type = types.get((str(handle), seq), "")
        quarantine = Quarantine(handle, seq, message_type, counted.count, reason, self.clock())
        db.poison.quarantined[handle] = quarantine
        db.ready[queue].set_aside(handle)
        traced.append(
            partial(events.quarantined, ep, queue, seq, message_type, counted.count, reason)
        )
        rows.append(
            poison_rows.quarantine(
                handle, seq, message_type, counted.count, reason, quarantine.since
            )
        )
        return rows

    def received_work(self, lease: Lease) -> Work:
        """A COMMIT removes the lease's messages: their counts go with them."""
        counts = lease.db.poison.counts
        if not counts:
            return Work()
        counted = [item for item in lease.items if item in counts]
        if not counted:
            return Work()

        def forget() -> None:
            for item in counted:
                counts.pop(item, None)

        return Work().add(poison_rows.forget_counts(counted), on_commit=forget)

    # -- the administrator's verbs ------------------------------------------------------

    def holds(self, handle: uuid.UUID) -> bool:
        """Whether conversation ``handle`` (an endpoint here) is quarantined."""
        db, _ = self.directory.endpoint(handle)
        return handle in db.poison.quarantined

    def _quarantined(self, handle: uuid.UUID) -> tuple[Database, Endpoint, str]:
        db, ep = self.directory.endpoint(handle)
        queue = db.queue_of(ep.service)
        if handle not in db.poison.quarantined or queue not in db.ready:
            raise NotQuarantined(f"conversation {handle} is not quarantined")
        assert queue is not None
        return db, ep, queue

    async def release(self, handle: uuid.UUID) -> int:
        """Release a quarantined conversation: its messages are receivable again, in order,
        and their rollback counts start over. Returns how many messages it releases."""
        db, ep, queue = self._quarantined(handle)
        await commit_statements(db, poison_rows.release(handle))
        if db.poison.quarantined.pop(handle, None) is None:
            return 0  # released by a concurrent request
        db.poison.forget_conversation(handle)
        released = db.ready[queue].release_aside(handle, ep.group_id)
        self.events.quarantine_over(ep, queue, ended=False)
        return released

    async def end(self, handle: uuid.UUID, error_code: int, description: str) -> None:
        """End a quarantined conversation WITH ERROR (SPEC §6): its messages are discarded,
        the far side receives the Error, and the quarantine is over."""
        db, ep, queue = self._quarantined(handle)
        self.conversations.check_end(error_code)
        work = self.conversations.end_conversation_work(db, ep, error_code, description)

        def over() -> None:
            if db.poison.quarantined.pop(handle, None) is not None:
                db.poison.forget_conversation(handle)
                db.ready[queue].aside.pop(handle, None)
                self.events.quarantine_over(ep, queue, ended=True)

        await commit(db, work.add(poison_rows.release(handle), on_commit=over))

    async def alter_queue(self, queue: str, status: bool, database: str | None = None) -> None:
        """ALTER QUEUE ... STATUS (R-DLG-12); turned on, the rollback counts of its messages
        start over (SPEC §6: a queue disabled by poison-message handling loses nothing and
        counts afresh). The counts start over before the queue is on: a transaction
        rolled back as it turns on counts from nothing, never against the counts that
        disabled it."""
        if status:
            await self._forget_counts(queue, database)
        await self.conversations.alter_queue(queue, status, database)

    async def _forget_counts(self, queue: str, database: str | None) -> None:
        """The rollback counts of ``queue``'s messages start over: in memory at once, so
        that a rollback counted while the file forgets them counts from nothing, and its
        count, written after, is what both say; in the file by a function job, which the
        statements of the jobs after it follow even in one group commit (an UPDATE or
        DELETE statement would run after their INSERTs, ``batch_sql``). A write that
        fails gives memory back the counts the file keeps, but where a newer count came."""
        db = self.directory.database_of_queue(queue, database)
        counts = db.poison.counts
        gone = {
            item: counts.pop(item) for item in list(counts) if self._queue_of(db, item[0]) == queue
        }
        sql, params = poison_rows.forget_counts_of_queue(queue)

        def failed(_: BaseException) -> None:
            for item, rollbacks in gone.items():
                counts.setdefault(item, rollbacks)

        try:
            future = db.store.submit(
                (), fn=lambda conn: conn.execute(sql, params), on_failure=failed, wait=True
            )
        except StoreError as exc:  # its file is closing: nothing was forgotten
            failed(exc)
            raise
        assert future is not None
        await future

    @staticmethod
    def _queue_of(db: Database, handle: uuid.UUID) -> str | None:
        ep = db.endpoints.get(handle)
        return db.queue_of(ep.service) if ep is not None else None

    async def view(self) -> list[dict[str, Any]]:
        """The ``quarantined`` view: one row per quarantined conversation, once the counts
        written so far are in their files (:meth:`settled`)."""
        await self.settled()
        return views.quarantined(self.directory.databases.values())


def _seen(future: asyncio.Future[Any]) -> None:
    """A failed write of counts is logged by :func:`_log_failure`; nobody need await it."""
    if not future.cancelled():
        future.exception()


def _run_all(steps: list[Callable[[], None]]) -> Callable[[], None] | None:
    """One commit callback that runs ``steps`` in order (None when there are none)."""
    if not steps:
        return None

    def run() -> None:
        for step in steps:
            step()

    return run


def _log_failure(db: Database) -> Callable[[BaseException], None]:
    def failed(exc: BaseException) -> None:
        log.error("database %s: rollback counts not written: %s", db.name, exc)

    return failed
