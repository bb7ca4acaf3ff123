"""RECEIVE and GET CONVERSATION GROUP (SPEC §6, R-DLG-1, R-DLG-11, R-DLG-12): a
:class:`~brokerd.dialogs.endpoints.database.Lease` on the ready messages of one
conversation group (a RECEIVE of several groups holds one lease per group), their rows
read and removed (or kept, under RETENTION) in one commit, and the leases given back.
GET CONVERSATION GROUP's lease holds the group's lock and no message.

May import: ``brokerd.dialogs.endpoints`` and what it may import.
"""

from __future__ import annotations

import asyncio
import itertools
import operator
import sqlite3
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

from brokerd.dialogs.endpoints.database import Database, Lease
from brokerd.dialogs.endpoints.directory import Directory
from brokerd.dialogs.endpoints.ready import Item, ReadyIndex
from brokerd.dialogs.endpoints.states import DELIVERING
from brokerd.dialogs.endpoints.stats import EngineStats
from brokerd.dialogs.endpoints.work import Work
from brokerd.errors import ConversationQuarantined, InvalidRequest, QueueDisabled
from brokerd.storage import queries, reads
from brokerd.storage.catalog import QueueInfo
from brokerd.traces.writer import TraceWriter

T = TypeVar("T")

MAX_GROUPS = 1024
"""The most conversation groups one RECEIVE may ask for (``groups``, SPEC §6)."""


class Withdrawal:
    """A waiting RECEIVE's (or GET CONVERSATION GROUP's) way back: its client stopped
    waiting for it (the application's call was cancelled) and takes the request back.
    Until the request has taken something, :meth:`withdraw` makes it end now, empty, as
    if its WAITFOR had run out; once it has, the request goes on and its answer carries
    what it took (R-DLG-1: a message is never taken for a caller that is gone)."""

    __slots__ = ("_index", "leases", "taken", "withdrawn")

    def __init__(self) -> None:
        self.withdrawn = False
        self.taken = False
        """The request holds messages or a group now: too late to take it back."""
        self.leases: list[Lease] = []
        """What it took (:attr:`taken`)."""
        self._index: ReadyIndex | None = None
        """The ready index the request waits on, while it waits."""

    def withdraw(self) -> bool:
        """Take the request back; whether it had taken nothing yet (it then ends empty).
        Too late, what it took is marked so that a rollback does not count it against
        the messages (their caller is gone: SPEC §6, poison messages)."""
        if self.taken:
            for lease in self.leases:
                lease.counted = False
            return False
        self.withdrawn = True
        if self._index is not None:
            self._index.changed.set()  # the waiter wakes, sees it withdrawn, ends
        return True


class ReceiveVerbs:
    """RECEIVE and GET CONVERSATION GROUP: leases on ready messages (or on a group alone),
    read and removed in one commit."""

    def __init__(self, directory: Directory, trace: TraceWriter, stats: EngineStats) -> None:
        self.directory = directory
        self.trace = trace
        self.stats = stats
        self.stopping = False
        """The daemon is stopping: a RECEIVE with nothing ready returns at once, empty."""
        self.stop_begun = False
        """A graceful stop has begun (:meth:`begin_stop`): what a transaction puts back
        from now on is not counted against its messages (SPEC §6, poison messages)."""

    def begin_stop(self) -> None:
        """A graceful stop begins: its activated commands are stopped first, while RECEIVEs
        are still served, and a batch one of them holds when it is stopped (or killed after
        its grace) goes back uncounted: not the messages' fault (SPEC §6)."""
        self.stop_begun = True

    def stop_waiting(self) -> None:
        """The daemon is stopping: every RECEIVE waiting for messages returns now with none
        (nothing was taken, so nothing is lost), and later ones do not wait."""
        self.stop_begun = True
        self.stopping = True
        for db in self.directory.databases.values():
            for index in db.ready.values():
                index.changed.set()

    async def take_ready(
        self,
        queue: str,
        database: str | None = None,
        top: int = 1,
        timeout: float = 0.0,
        handle: uuid.UUID | None = None,
        owned: Collection[uuid.UUID] = (),
        group: uuid.UUID | None = None,
        groups: int = 1,
        withdrawal: Withdrawal | None = None,
    ) -> list[Lease]:
        """RECEIVE's choice: up to ``top`` ready messages of one conversation group, or of
        up to ``groups`` groups (oldest first, ``top`` in all), a lease per group holding
        its lock; waits up to ``timeout`` s (negative: forever) for the first.

        ``handle`` limits it to one conversation, ``group`` to one conversation group
        (not both, and neither with ``groups``). ``owned`` are groups the caller's
        transaction already holds: they may be taken from again; a group another
        transaction holds is waited for like an empty queue. Empty when nothing arrived
        in time, or the request was withdrawn first (``withdrawal``).
        """
        db, info, index, group = self._ready_of(queue, database, handle, group, groups)

        def take() -> list[Lease] | None:
            _enabled(db, queue, info)  # turned off while this RECEIVE waited
            if handle is not None:
                _not_quarantined(db, handle)  # quarantined while this RECEIVE waited
            return _leases(db, queue, info, index, top, handle, group, groups, owned) or None

        leases = await self._first(index, timeout, take, withdrawal)
        if leases is None:
            if group is None:
                index.last_empty = asyncio.get_running_loop().time()
            return []
        if withdrawal is not None:
            withdrawal.leases = leases
        return leases

    async def hold_group(
        self,
        queue: str,
        database: str | None = None,
        timeout: float = 0.0,
        owned: Collection[uuid.UUID] = (),
        withdrawal: Withdrawal | None = None,
    ) -> Lease | None:
        """GET CONVERSATION GROUP (SPEC §6): a lease holding no message on the oldest
        conversation group of ``queue`` with messages ready that no other transaction
        holds (``owned``: the caller's own, which it may be given again); waits up to
        ``timeout`` s (negative: forever). The group stays locked until the lease is
        released, as a RECEIVE's. None when no group came in time."""
        db, info, index, _ = self._ready_of(queue, database, None, None)

        def hold() -> Lease | None:
            _enabled(db, queue, info)
            gid = index.next_group(owned)
            if gid is None:
                return None
            locks = gid not in owned
            if locks:
                index.lock(gid)
            return Lease(db, queue, index, gid, [], info.retention, locks, image=db.image)

        lease = await self._first(index, timeout, hold, withdrawal)
        if lease is None:
            index.last_empty = asyncio.get_running_loop().time()
        elif withdrawal is not None:
            withdrawal.leases = [lease]
        return lease

    async def get_conversation_group(
        self,
        queue: str,
        database: str | None = None,
        timeout: float = 0.0,
        withdrawal: Withdrawal | None = None,
    ) -> uuid.UUID | None:
        """GET CONVERSATION GROUP outside a transaction (SQL Server's autocommit): the
        group :meth:`hold_group` would lock, its lock given back at once."""
        lease = await self.hold_group(queue, database, timeout, withdrawal=withdrawal)
        if lease is None:
            return None
        self.release(lease, received=False)
        return lease.group

    async def _first(
        self,
        index: ReadyIndex,
        timeout: float,
        attempt: Callable[[], T | None],
        withdrawal: Withdrawal | None = None,
    ) -> T | None:
        """WAITFOR: ``attempt`` now and each time ``index`` changes, until it gives a lease,
        ``timeout`` s pass (negative: never), the daemon stops (:meth:`stop_waiting`) or
        the request is withdrawn (``withdrawal``)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout < 0 else loop.time() + timeout
        while True:
            if withdrawal is not None and withdrawal.withdrawn:
                return None
            lease = attempt()
            if lease is not None:
                if withdrawal is not None:
                    withdrawal.taken = True
                return lease
            remaining = None if deadline is None else deadline - loop.time()
            if (remaining is not None and remaining <= 0) or self.stopping:
                return None
            index.changed.clear()
            index.waiting += 1
            if withdrawal is not None:
                withdrawal._index = index
            try:
                await asyncio.wait_for(index.changed.wait(), remaining)
            except TimeoutError:
                return None
            finally:
                index.waiting -= 1
                if withdrawal is not None:
                    withdrawal._index = None

    def _ready_of(
        self,
        queue: str,
        database: str | None,
        handle: uuid.UUID | None,
        group: uuid.UUID | None,
        groups: int = 1,
    ) -> tuple[Database, QueueInfo, ReadyIndex, uuid.UUID | None]:
        """RECEIVE's checks: the queue's database, the queue (enabled), its ready index,
        and the group it is limited to: ``group``, or ``handle``'s (one of them, SPEC §6);
        ``groups`` (1 to :data:`MAX_GROUPS`) only for a RECEIVE limited to neither."""
        if handle is not None and group is not None:
            raise InvalidRequest(
                "RECEIVE takes one conversation handle or one conversation group, not both"
            )
        if not 1 <= groups <= MAX_GROUPS:
            raise InvalidRequest(f"groups must be between 1 and {MAX_GROUPS}")
        if groups > 1 and (handle is not None or group is not None):
            raise InvalidRequest(
                "a RECEIVE limited to one conversation or conversation group takes one group"
            )
        db = self.directory.database_of_queue(queue, database)
        info = db.catalog.queues[queue]
        _enabled(db, queue, info)
        if handle is not None:
            group = self.directory.endpoint(handle)[1].group_id
            _not_quarantined(db, handle)
        return db, info, db.ready[queue], group

    async def read_leased(
        self, leases: Sequence[Lease], budget: reads.Budget | None = None
    ) -> list[dict[str, Any]]:
        """The rows of the leases' messages (of one database), read without removing them
        in one call of its store; the messages beyond ``budget`` go back to the queue at
        once (each lease keeps its lock)."""
        items = _items_of(leases)
        store = leases[0].db.store
        try:
            rows, used = await store.run(
                lambda conn: reads.read_received(conn, items, budget, bodies=store.bodies)
            )
        except BaseException:
            self.release_all(leases)
            raise
        self.trim_all(leases, used)
        return rows

    def trim_all(self, leases: Sequence[Lease], used: int) -> None:
        """Keep the first ``used`` messages of the leases' items taken in order (see
        :meth:`trim`): a lease beyond them keeps none, and still holds its lock."""
        for lease in leases:
            mine = min(used, len(lease.items))
            self.trim(lease, mine)
            used -= mine

    def trim(self, lease: Lease, used: int) -> None:
        """Keep the first ``used`` messages of a lease; the others go back in front of
        their group, in order, while the lease still holds the group's lock."""
        rest = lease.items[used:]
        if not rest:
            return
        lease.items = lease.items[:used]
        if lease.image != lease.db.image:
            return  # its image was dropped: the rebuilt index has them from the file
        kept = [item for item in rest if item[0] in lease.db.endpoints]
        if len(kept) < len(rest):
            lease.index.received([item for item in rest if item[0] not in lease.db.endpoints])
        if kept:
            lease.index.put_back(lease.group, kept)

    def receive_work(self, lease: Lease) -> Work:
        """Remove a lease's messages from the queue (or keep them with status 0 under
        RETENTION); once committed the group's lock is released."""
        rows = queries.received(lease.items, lease.retention)
        return Work().add(
            rows,
            on_commit=lambda: self.release(lease, received=True),
            on_failure=lambda _: self.release(lease, received=False),
        )

    def release_all(self, leases: Sequence[Lease]) -> None:
        """Give back the leases of one RECEIVE (or transaction) unreceived, the newest
        first: each group goes back to the front of its queue, so the oldest, given back
        last, is first again, as it was (SPEC §6)."""
        for lease in reversed(leases):
            self.release(lease, received=False)

    def release(self, lease: Lease, received: bool) -> None:
        """Unlock a lease's group; its messages go back in front, in order, unless received."""
        if lease.released:
            return
        lease.released = True
        if lease.image != lease.db.image:
            return  # its image was dropped: the ready index and its locks were rebuilt
        index = lease.index
        if not received:
            # A conversation cleaned up or ended meanwhile has no rows left to give back,
            # or none once its END commits (until then, that END keeps them).
            endpoints = lease.db.endpoints
            kept = [
                item
                for item in lease.items
                if (owner := endpoints.get(item[0])) is not None and owner.state in DELIVERING
            ]
            if kept:
                index.put_back(lease.group, kept)
            if len(kept) < len(lease.items):
                self._give_back_ended(index, lease, [i for i in lease.items if i not in kept])
        else:
            index.received(lease.items)
            counts = lease.db.poison.counts
            if counts:  # gone, their rollback counts too (the file's go at the next start)
                for item in lease.items:
                    counts.pop(item, None)
        if lease.locks:
            index.locked.discard(lease.group)
        if index.count:
            index.changed.set()
        if received:
            self._trace_received(lease)

    @staticmethod
    def _give_back_ended(index: ReadyIndex, lease: Lease, items: list[Item]) -> None:
        """Messages given back of conversations that have ended: each conversation's wait
        for its END's outcome if that is committing, the others are gone."""
        gone: list[Item] = []
        for handle, run in itertools.groupby(items, key=operator.itemgetter(0)):
            mine = list(run)
            if not index.give_back_ending(handle, lease.group, mine):
                gone += mine
        if gone:
            index.received(gone)

    def _trace_received(self, lease: Lease) -> None:
        self.stats.received_by_application += len(lease.items)
        if not self.trace.enabled:
            return
        db = lease.db
        # One buffered entry per run of messages of one conversation (the lines are the same).
        for handle, run in itertools.groupby(lease.items, key=operator.itemgetter(0)):
            owner = db.endpoints.get(handle)
            if owner is not None:
                self.trace.emit_each(
                    "received",
                    owner.conversation_id,
                    "seq",
                    [seq for _, seq in run],
                    database=db.name,
                    initiator=not owner.initiator,
                    queue=lease.queue,
                )

    async def receive(
        self,
        queue: str,
        database: str | None = None,
        top: int = 1,
        timeout: float = 0.0,
        handle: uuid.UUID | None = None,
        budget: reads.Budget | None = None,
        group: uuid.UUID | None = None,
        groups: int = 1,
        withdrawal: Withdrawal | None = None,
    ) -> list[dict[str, Any]]:
        """RECEIVE TOP (top) outside a transaction: the messages leave the queue in the
        same commit that reads them (autocommit; at most once to the application).
        ``handle`` or ``group`` limits it to one conversation or conversation group;
        ``groups`` lets it return the messages of up to that many groups, one after the
        other (SPEC §6).

        ``budget`` cuts the batch to what the caller's reply can carry before anything
        is removed; the messages beyond it stay in the queue, first in their group."""
        leases = await self.take_ready(
            queue, database, top, timeout, handle, group=group, groups=groups, withdrawal=withdrawal
        )
        if not leases:
            return []
        future = self._read_and_remove(leases, budget, None, None)
        assert future is not None
        rows: list[dict[str, Any]] = await future
        return rows

    def receive_now(
        self,
        queue: str,
        database: str | None,
        top: int,
        handle: uuid.UUID | None,
        budget: reads.Budget | None,
        then: Callable[[list[dict[str, Any]]], None],
        failed: Callable[[BaseException], None],
        group: uuid.UUID | None = None,
        groups: int = 1,
    ) -> bool:
        """:meth:`receive` without a task or a future when messages are ready now: the
        rows go to ``then`` from the callback of the commit that removed them, once its
        release gate lets them (its received events on disk, R-TRACE-1), or the error to
        ``failed``. False, with nothing taken, when none are ready: the caller
        waits with :meth:`receive`. The client listener's path for RECEIVE, so that a
        consumer behind a busy event loop waits for its commit, not for further turns
        of the loop."""
        db, info, index, group = self._ready_of(queue, database, handle, group, groups)
        leases = _leases(db, queue, info, index, top, handle, group, groups)
        if not leases:
            return False
        try:
            self._read_and_remove(leases, budget, then, failed)
        except BaseException:
            self.release_all(leases)
            raise
        return True

    def _read_and_remove(
        self,
        leases: Sequence[Lease],
        budget: reads.Budget | None,
        then: Callable[[list[dict[str, Any]]], None] | None,
        failed: Callable[[BaseException], None] | None,
    ) -> asyncio.Future[Any] | None:
        """The autocommit RECEIVE's job: read the leases' rows (of one queue, cut to
        ``budget``) and remove them in one commit; the rows to ``then`` (or the future,
        without it)."""
        items = _items_of(leases)
        retention = leases[0].retention
        store = leases[0].db.store
        used = [len(items)]
        result: list[list[dict[str, Any]]] = [[]]

        def read_and_remove(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows, used[0] = reads.read_received(
                conn, items, budget, True, retention, bodies=store.bodies
            )
            result[0] = rows
            return rows

        def committed() -> None:
            self.trim_all(leases, used[0])
            for lease in leases:
                self.release(lease, received=True)  # emits their received events
            if then is not None:
                rows = result[0]
                # R-TRACE-1: the application learns of the RECEIVE once those are on disk
                leases[0].db.store.after_gate(lambda: then(rows))

        def not_committed(exc: BaseException) -> None:
            self.release_all(leases)
            if failed is not None:
                failed(exc)

        return leases[0].db.store.submit(
            (),
            fn=read_and_remove,
            on_commit=committed,
            on_failure=not_committed,
            wait=then is None,
        )


def _items_of(leases: Sequence[Lease]) -> list[tuple[uuid.UUID, int]]:
    """The leases' messages, group after group, each group's in its order."""
    if len(leases) == 1:
        return leases[0].items
    return [item for lease in leases for item in lease.items]


def _leases(
    db: Database,
    queue: str,
    info: QueueInfo,
    index: ReadyIndex,
    top: int,
    handle: uuid.UUID | None,
    group: uuid.UUID | None,
    groups: int,
    owned: Collection[uuid.UUID] = (),
) -> list[Lease]:
    """What a RECEIVE takes now: a lease on up to ``top`` messages of one group, or one
    lease per group of up to ``groups`` (``top`` in all); none when nothing is ready."""
    if groups == 1:
        one = index.take(max(1, top), handle, group, owned)
        taken = [] if one is None else [one]
    else:
        taken = index.take_groups(max(1, top), groups, owned)
    return [
        Lease(db, queue, index, gid, items, info.retention, gid not in owned, image=db.image)
        for gid, items in taken
    ]


def _not_quarantined(db: Database, handle: uuid.UUID) -> None:
    """SPEC §6: a RECEIVE naming a quarantined conversation fails rather than wait for
    messages that cannot come, when it starts and each time one that waits looks again
    (the rollback that quarantines it puts messages back, which wakes the waiters)."""
    if handle in db.poison.quarantined:
        raise ConversationQuarantined(
            f"conversation {handle} is quarantined: one of its messages was rolled "
            "back too often (SPEC §6); release it or end it with an error"
        )


def _enabled(db: Database, queue: str, info: QueueInfo) -> None:
    """R-DLG-12: RECEIVE and GET CONVERSATION GROUP refuse a queue that is off, when they
    start and each time one that waits looks again (ALTER QUEUE, or poison-message
    handling's ``disable``, wakes the waiters)."""
    if not info.status:
        raise QueueDisabled(f"queue {queue!r} in database {db.name!r} is disabled (status off)")
