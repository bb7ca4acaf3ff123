"""One database of an instance: its store, catalog, endpoints and ready-message index.

Owns the in-memory image of a database (R-DLG-13): the conversation endpoints
keyed by handle and by (conversation id, role), the index of messages ready to
RECEIVE per queue and conversation group (status 1, R-OBJ-3), and the recovery
that rebuilds all of it from the SQLite file after a restart or ``kill -9`` (and
repairs a message left held below its endpoint's receive sequence, ``_repair_held``).
"""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from brokerd.config import DatabaseConfig, LimitsConfig
from brokerd.dialogs.endpoints.begin_keys import BeginKey, BeginKeys, arguments_of
from brokerd.dialogs.endpoints.endpoint import Endpoint, endpoint_from_row
from brokerd.dialogs.endpoints.poison import PoisonLedger, Quarantine, Rollbacks
from brokerd.dialogs.endpoints.ready import Item, Rank, ReadyIndex, rank_of
from brokerd.dialogs.endpoints.service_keys import ServiceKeys
from brokerd.dialogs.endpoints.states import DELIVERING
from brokerd.storage import poison_rows, queries, reads, schema
from brokerd.storage.catalog import Catalog, Route, route_from_row
from brokerd.storage.reads import Rows, RowStream
from brokerd.storage.schema import Statement
from brokerd.storage.store import Store
from protocol.acks import UNKNOWN_COUNT, AckState, PartialCount
from protocol.dialog import (
    END_DIALOG,
    ERROR,
    FLAG_END_DIALOG,
    FLAG_ERROR,
    FLAG_SEQUENCED,
)
from protocol.fragments import cut_size


@dataclass(eq=False)
class Lease:
    """Messages taken by a RECEIVE, with their group's lock, until commit or rollback."""

    db: Database
    queue: str
    index: ReadyIndex
    group: uuid.UUID
    items: list[Item]
    retention: bool
    locks: bool = True
    """False when the caller's transaction already held the group (it unlocks it once)."""
    released: bool = False
    image: int = 0
    """The database's :attr:`Database.image` when the messages were taken."""
    counted: bool = True
    """False once its RECEIVE's client withdrew it too late (it had taken these): a
    rollback then puts them back without counting it (no caller saw them, SPEC §6)."""


def _rows(conn: sqlite3.Connection) -> Rows:
    return lambda sql, params: conn.execute(sql, params).fetchall()


def _cursor(conn: sqlite3.Connection) -> RowStream:
    """Rows as plain tuples, one at a time (no list of them all, no ``sqlite3.Row``)."""

    def rows(sql: str, params: Sequence[Any]) -> Iterator[tuple[Any, ...]]:
        cursor = conn.execute(sql, params)
        cursor.row_factory = None
        return cursor

    return rows


log = logging.getLogger("brokerd.dialogs.database")

_END_FLAGS = {
    END_DIALOG: FLAG_END_DIALOG | FLAG_SEQUENCED,
    ERROR: FLAG_ERROR | FLAG_SEQUENCED,
}


class Database:
    def __init__(
        self,
        config: DatabaseConfig,
        data_dir: Path,
        limits: LimitsConfig | None = None,
        cas: Sequence[x509.Certificate] = (),
    ) -> None:
        """``limits``: the daemon's (``[limits]``: the page cache and the segment files
        of large bodies of the database's store); the defaults without. ``cas``: the
        deployment CA's certificates, which must have issued its services' certificates
        and bindings (R-DLG-14; not checked without)."""
        self.config = config
        self.cas = tuple(cas)
        self.name = config.name
        limits = limits or LimitsConfig()
        self.store = Store(
            data_dir / f"{config.name}.sqlite",
            config.name,
            limits.page_cache_mb,
            limits.body_segment_mb * 1024 * 1024,
            limits.body_compact_after,
        )
        self.catalog = Catalog.from_config(config)
        self.service_keys = ServiceKeys()
        """Key pairs and remote service bindings (R-DLG-14), read by :meth:`open`."""
        self.broker_instance = uuid.UUID(int=0)
        self.endpoints: dict[uuid.UUID, Endpoint] = {}
        self.by_key: dict[tuple[uuid.UUID, bool], Endpoint] = {}
        self.ready: dict[str, ReadyIndex] = {name: ReadyIndex() for name in self.catalog.queues}
        self.partials = PartialCount()
        """The partial messages (some fragments held, not all) the endpoints hold, all
        together: at most ``limits.partial_messages`` (:attr:`partial_limit`)."""
        self.partial_limit = limits.partial_messages
        self.poison = PoisonLedger()
        """Rollback counts and quarantined conversations (SPEC §6), loaded by recovery."""
        self.begin_keys = BeginKeys()
        """The idempotency keys of its BEGIN DIALOGs (SPEC §6), loaded by recovery."""
        self.next_local_seq = -1
        """Sequence number of the next message this broker queues itself (a broker error,
        a DialogTimer): -1, -2, ... so it never meets a dialog's own numbers."""
        self.rx_suspended = False
        self.image = 0
        """How many times this partner's in-memory image of the database was dropped
        (``DatabaseImages.forget``, R-ROUTE-16). A lease or a transaction begun under
        another count refers to endpoints and ready messages of an image that is gone:
        it may neither give messages back to the new one nor commit into it."""
        self.mirror_role: str | None = config.mirror_role
        """``principal``, ``mirror`` or None (not mirrored), R-ROUTE-10; swapped by failover."""
        self.mirror_epoch = 0
        """The mirroring epoch of the last role change this partner knows of (R-ROUTE-15)."""
        self.mirror_in_doubt = False
        """R-ROUTE-16: a principal restarted with units its mirror may never have confirmed
        (the file's tail). Until its partner has confirmed them, or told it that it was
        superseded, it sends nothing and accepts nothing from other brokers for the
        database, and releases no commit (the mirroring service clears it)."""

    async def open(self) -> None:
        self.service_keys = ServiceKeys.load(self.config, self.cas)
        self.broker_instance = await self.store.open(self.config.broker_instance)
        if self.config.mirror_role is not None:
            rows = await self.store.fetchall(schema.READ_META)
            stored = {str(k): str(v) for k, v in rows}
            self.mirror_role = stored.get("mirror_role", self.config.mirror_role)
            self.mirror_epoch = int(stored.get("mirror_epoch", "0"))
        for name, status, configured in await self.store.fetchall(queries.READ_QUEUE_STATES):
            info = self.catalog.queues.get(str(name))
            if info is not None:
                info.keep_altered(bool(status), None if configured is None else bool(configured))
        writes = self.catalog.persist()
        for row in await self.store.fetchall(queries.READ_KEPT_ROUTES):
            writes += self.keep_route(route_from_row(row))
        if self.store.replica is not None and self.mirror_role == "mirror":
            # R-ROUTE-16: a mirror's file changes only by what its principal ships; its
            # configuration's catalog is written when it is promoted (``DatabaseImages.
            # rebuild``), as a unit of the new principal's
            return
        # a mirrored principal's are a unit its mirror gets (``Store.execute_now``)
        await self.store.execute_now(writes)

    def keep_route(self, route: Route) -> list[Statement]:
        """A route created at run time, read back: kept, unless the configuration now names
        a route so (in another case), which replaces it; returns what removes it from the
        file then."""
        replaced_by = self.catalog.add_kept_route(route)
        if replaced_by is None:
            return []
        log.warning(
            "database %s: route %r created at run time is replaced by the configuration's "
            "route %r (route names are compared without regard to case)",
            self.name,
            route.name,
            replaced_by.name,
        )
        return [queries.drop_route(route.name)]

    def fenced_reason(self) -> str:
        """Why a partner that is not principal refuses work for this database (R-ROUTE-15)."""
        return (
            f"database {self.name!r} is the mirror partner at epoch {self.mirror_epoch}: it "
            "neither sends nor accepts messages for the mirrored database (fenced, R-ROUTE-15)"
        )

    def in_doubt_reason(self) -> str:
        """Why a restarted principal holds its traffic (R-ROUTE-16)."""
        return (
            f"database {self.name!r} restarted as principal at epoch {self.mirror_epoch}: "
            "it sends and accepts nothing until its mirror partner has confirmed what its "
            "file holds, or has shown it was superseded (R-ROUTE-16)"
        )

    @property
    def sends_nothing(self) -> bool:
        """A mirror (fenced, R-ROUTE-15) or a principal in doubt (R-ROUTE-16)."""
        return self.mirror_role == "mirror" or self.mirror_in_doubt

    def add_endpoint(self, ep: Endpoint) -> None:
        self.endpoints[ep.handle] = ep
        self.by_key[ep.key] = ep
        self.partials.add(ep.accepted)

    def remove_endpoint(self, ep: Endpoint) -> None:
        """``ep`` is gone (removed once closed, ended WITH CLEANUP, a mirror image dropped,
        its BEGIN DIALOG failed): so are its rollback counts, its quarantine (SPEC §6; the
        ``queues`` view counts quarantined conversations by the messages set aside) and
        the idempotency key of its BEGIN DIALOG."""
        self.endpoints.pop(ep.handle, None)
        if self.by_key.get(ep.key) is ep:
            del self.by_key[ep.key]
        self.partials.remove(ep.accepted)
        self.poison.forget_conversation(ep.handle)
        self.begin_keys.forget_conversation(ep.handle)
        if self.poison.quarantined.pop(ep.handle, None) is not None:
            queue = self.queue_of(ep.service)
            if queue in self.ready:
                self.ready[queue].aside.pop(ep.handle, None)

    def queue_of(self, service: str) -> str | None:
        info = self.catalog.services.get(service)
        return info.queue if info else None

    async def recover(self) -> list[Endpoint]:
        """Rebuild endpoints, the numbers of unacknowledged messages (their backlogs) and
        the ready index from the file, and submit the writes that bring the file in line
        with what was loaded (:meth:`read_image`).

        Returns the endpoints that have messages waiting to be transmitted.
        """
        waiting, repairs = await self.read_image()
        if repairs:
            self.store.submit(repairs)
        return waiting

    async def read_image(self) -> tuple[list[Endpoint], list[Statement]]:
        """:meth:`recover`'s reading: the endpoints with messages waiting to be transmitted,
        and the writes that bring the file in line with what was loaded, left to the caller
        (a promoted mirror writes them once it is the principal: before, its file takes
        only what its principal ships, R-ROUTE-16)."""
        result: tuple[list[Endpoint], list[Statement]] = await self.store.read(
            lambda conn: self._recover(_rows(conn), _cursor(conn))
        )
        return result

    def _recover(self, fetch: Rows, stream: RowStream) -> tuple[list[Endpoint], list[Statement]]:
        for row in fetch(queries.READ_ENDPOINTS, ()):
            self.add_endpoint(endpoint_from_row(row, self.name))
        waiting: list[Endpoint] = []
        # The transmission queue can hold millions of rows: recovery makes no object per
        # message. It reads, from the primary key's index alone, each conversation's
        # lowest and highest number and their count; the messages are paged in from the
        # file, in order, as the link has room (brokerd.dialogs.endpoints.backlog). Only a
        # conversation with gaps (messages acknowledged out of order) has its numbers read.
        for handle, first, last, count in fetch(queries.READ_TRANSMISSION_RUNS, ()):
            ep = self.endpoints.get(uuid.UUID(handle))
            if ep is None:
                continue
            if int(count) == int(last) - int(first) + 1:
                ep.backlog.add(int(first), int(last))
            else:
                for (seq,) in stream(queries.READ_SENT_NUMBERS, (handle,)):
                    ep.backlog.add(int(seq))
            ep.waiting_status = "waiting to be sent (recovered after a restart)"
            waiting.append(ep)
        self._load_poison(fetch)
        repairs = self.load_received(fetch)
        if any(fetch(poison_rows.ANY_ROWS, ())[0]):
            # only then: a load that writes nothing leaves a mirrored file's log as it
            # was (R-ROUTE-16), which a sweep of empty tables would not
            repairs += poison_rows.SWEEP
        for row in fetch(queries.READ_TIMERS, ()):
            timed = self.endpoints.get(uuid.UUID(row["conversation_handle"]))
            if timed is not None:
                timed.timer_due = float(row["due"])
        for handle, key, seq, created in stream(queries.READ_SEND_KEYS, ()):
            keyed = self.endpoints.get(uuid.UUID(handle))
            if keyed is not None:
                keyed.sent_keys[str(key)] = (int(seq), float(created))
        for service, key, handle, arguments, created in stream(queries.READ_BEGIN_KEYS, ()):
            begun = uuid.UUID(handle)
            if begun in self.endpoints:
                entry = BeginKey(begun, arguments_of(str(arguments)), float(created))
                self.begin_keys.add(str(service), str(key), entry)
        for ep in self.endpoints.values():
            if ep.accepted.through or ep.accepted.beyond or ep.accepted.fragments:
                ep.mark_ack_needed()
            if ep.keys is not None and ep.initiator:
                # R-DLG-14: the target has answered under the dialog key if it sent a
                # message, or if an (authenticated) acknowledgement removed the first one.
                # Bound to the broker that answered (``far_peer``) only once its answer
                # passed the check; the first message gone from the queue says nothing
                # (END CONVERSATION WITH ERROR drops it unanswered).
                ep.key_confirmed = ep.accepted.through > 0 or bool(ep.far_peer)
        return waiting, repairs

    def _load_poison(self, fetch: Rows) -> None:
        """The quarantined conversations (their ready indexes set their messages aside as
        they are loaded) and the rollback counts of the messages still queued (SPEC §6)."""
        for handle_text, seq, message_type, rollbacks, last_error, since in fetch(
            poison_rows.READ_QUARANTINED, ()
        ):
            handle = uuid.UUID(handle_text)
            ep = self.endpoints.get(handle)
            queue = self.queue_of(ep.service) if ep is not None else None
            if ep is None or queue not in self.ready:
                continue
            self.poison.quarantined[handle] = Quarantine(
                handle, int(seq), str(message_type), int(rollbacks), str(last_error), float(since)
            )
            self.ready[queue].set_aside(handle)
        for handle_text, seq, rollbacks, last_error in fetch(poison_rows.READ_COUNTS, ()):
            self.poison.counts[(uuid.UUID(handle_text), int(seq))] = Rollbacks(
                int(rollbacks), str(last_error)
            )

    async def read_sent_bodies(self, wanted: dict[str, list[int]]) -> dict[tuple[str, int], bytes]:
        """Bodies of unacknowledged messages (by handle, the sequence numbers wanted), read
        back in a job of the committer (ordered after every write already submitted)."""
        return await self.store.run(
            lambda conn: reads.read_sent_bodies(conn, wanted, self.store.bodies)
        )

    async def read_sent_page(
        self, handle: str, first: int, last: int, body_room: int
    ) -> tuple[list[reads.SentRow], dict[int, bytes]]:
        """A page of an endpoint's backlog, read in a job of the committer, and its bodies
        by sequence number if they take no more than ``body_room`` bytes: read ahead, a
        window's refill then waits for no read (else none; each is read back when it is
        sent)."""

        def read(conn: sqlite3.Connection) -> tuple[list[reads.SentRow], dict[int, bytes]]:
            rows = reads.read_sent_page(conn, handle, first, last)
            if not rows or sum(row[3] for row in rows) > body_room:
                return rows, {}
            found = reads.read_sent_bodies(
                conn, {handle: [row[0] for row in rows]}, self.store.bodies
            )
            return rows, {seq: body for (_, seq), body in found.items()}

        return await self.store.run(read)

    async def reload_received(self) -> None:
        """:meth:`load_received` after every write already queued: its rows read by a job of
        its own, and applied on the event loop once that job's commit is done, in order
        with the commit callbacks of the jobs around it (a RECEIVE that removes messages,
        an arrival that makes one ready), never beside a RECEIVE that takes or gives back
        ready messages. The messages a lease holds stay out of the reloaded index."""
        read: dict[str, list[sqlite3.Row]] = {}
        repairs: list[Statement] = []
        failures: list[Exception] = []

        def fetch(conn: sqlite3.Connection) -> None:
            for sql in _RELOADED:
                read[sql] = conn.execute(sql, ()).fetchall()

        def apply() -> None:
            try:
                repairs.extend(self.load_received(lambda sql, _: read[sql]))
            except Exception as exc:  # raised to the caller, not lost in a callback
                failures.append(exc)

        future = self.store.submit((), fn=fetch, on_commit=apply, wait=True)
        assert future is not None
        await future
        if failures:
            raise failures[0]
        if repairs:
            self.store.submit(repairs)

    def load_received(self, fetch: Rows) -> list[Statement]:
        """Set what every endpoint has received, and the ready index, from the file.

        Used by recovery and after a failed receive-side write, when memory may
        claim messages that never committed. Endpoints started by a peer whose
        first message never committed are forgotten (the peer retransmits).
        Returns the statements that bring the file in line with what was loaded
        (:meth:`_repair_held`), for the caller to submit.
        """
        stored = {
            uuid.UUID(row[0]): int(row[1]) for row in fetch(queries.READ_RECEIVE_SEQUENCES, ())
        }
        received: dict[uuid.UUID, AckState] = {}
        for ep in list(self.endpoints.values()):
            through = stored.get(ep.handle)
            if through is None:
                if not ep.initiator:
                    self.remove_endpoint(ep)
                continue
            received[ep.handle] = AckState(through)
            ep.held_end_flags.clear()
            ep.receive_generation = time.monotonic_ns()  # what the store refused is past
        repairs: list[Statement] = []
        released: list[Any] = []
        for row in fetch(queries.READ_HELD, ()):
            handle, seq = uuid.UUID(row[0]), int(row[1])
            if handle not in received:
                continue
            through = received[handle].through
            if seq <= through:
                repairs += self._repair_held(self.endpoints[handle], row, through, released)
                continue
            received[handle].beyond.add(seq)
            flags = _END_FLAGS.get(row[2], 0)
            if flags:
                self.endpoints[handle].held_end_flags[seq] = flags
        partial: set[tuple[uuid.UUID, int]] = set()
        for row in fetch(queries.READ_FRAGMENT_POSITIONS, ()):
            handle, seq = uuid.UUID(row[0]), int(row[1])
            if handle not in received:
                continue
            if seq <= received[handle].through:
                partial.add((handle, seq))
                continue
            at = int(row[2])
            length = -1 if row[5] is None else int(row[5])
            received[handle].add_fragment(
                seq, at, UNKNOWN_COUNT, cut_size(at, row[3], row[4]), length
            )
        for handle, seq in sorted(partial):
            log.error(
                "database %s: conversation %s holds fragments of message %d, a partial "
                "message at or below its receive sequence %d; left held, never delivered "
                "(its missing fragments will not come again)",
                self.name,
                self.endpoints[handle].conversation_id,
                seq,
                received[handle].through,
            )
        for handle, state in received.items():
            ep = self.endpoints[handle]
            self.partials.remove(ep.accepted)
            ep.accepted, ep.durable = state, state.copy()
            self.partials.add(state)
        for index in self.ready.values():
            index.clear()
        rows = fetch(queries.READ_READY, ())
        if released:
            rows = sorted([*rows, *released], key=lambda r: int(r[5]))
        for queue, group_text, handle_text, seq, rank in _in_sequence_order(rows):
            ready = self.ready.get(queue)
            handle = uuid.UUID(handle_text)
            if ready is not None and (handle, seq) not in ready.leased:
                # a message a lease holds is that lease's: its commit removes it, its
                # rollback puts it back (R-DLG-1)
                ready.add(uuid.UUID(group_text), handle, seq, rank)
        # Never raised again: a reload's read of the file does not see a message this
        # broker queued itself after the read was submitted, and its number must not be
        # given a second time (the second row would be ignored, R-DLG-11).
        low = fetch(queries.READ_LOWEST_SEQUENCE, ())
        if low and low[0][0] is not None and int(low[0][0]) < 0:
            self.next_local_seq = min(self.next_local_seq, int(low[0][0]) - 1)
        return repairs

    def _repair_held(
        self, ep: Endpoint, row: Any, through: int, released: list[Any]
    ) -> list[Statement]:
        """A complete message (``row`` of :data:`queries.READ_HELD`) held (status 2) at or
        below its endpoint's receive sequence ``through``: the endpoint counts it received, so its
        release committed, but the row was left held. A tree before the fix of
        ``queries.complete_in_fragments`` wrote such rows (the completing UPDATE of a
        message's last fragment could land after the promotion of the same commit).
        Loaded as held, it sat among the messages received beyond the gap: every
        acknowledgement of the dialog carried a range at or below ``through``, which the
        sender refuses, and the message was never delivered.

        It becomes what its release made it, in the file and in memory: ready, in its
        conversation's sequence order among the ready rows (``released``, in
        :data:`queries.READ_READY`'s shape, placed as :func:`_in_sequence_order` places
        every ready row), so it is received exactly once and in order (R-DLG-1, R-DLG-7);
        it is not counted beyond ``through`` again, so acknowledgements stay valid
        (R-DLG-4, R-DLG-5). If this side has ended the conversation, it is removed as
        what arrives after an END is (R-DLG-10). The statements are left to the caller
        to submit; recovery never waits for them.

        A *partial* message (no body, fragments missing) at or below the receive
        sequence is not repaired (``load_received`` logs an error and leaves its row and
        fragments in the file, out of the acknowledgement state): the endpoint counted it
        received, so its sender may have had it acknowledged and dropped it, and its
        missing fragments will never come. Delivering it would hand out a body that is
        not the one sent, and counting its fragments again would make every
        acknowledgement invalid (a fragment acknowledgement at or below ``through``); it
        stays visible in the queue (status 2) for the administrator, never delivered
        twice, and goes with its conversation. No tree is known to have written one.
        """
        handle, seq = str(row[0]), int(row[1])
        if ep.state not in DELIVERING:
            log.warning(
                "database %s: conversation %s: message %d, held below the receive sequence, "
                "removed (this side has ended the conversation)",
                self.name,
                ep.conversation_id,
                seq,
            )
            return queries.received([(ep.handle, seq)], False)
        log.warning(
            "database %s: conversation %s: message %d was held at or below the receive "
            "sequence %d; repaired: now ready to receive, in sequence order",
            self.name,
            ep.conversation_id,
            seq,
            through,
        )
        released.append((row[3], row[4], handle, seq, row[2], row[5]))
        return [queries.repair_held(handle, seq)]


_RELOADED = (
    queries.READ_RECEIVE_SEQUENCES,
    queries.READ_HELD,
    queries.READ_FRAGMENT_POSITIONS,
    queries.READ_READY,
    queries.READ_LOWEST_SEQUENCE,
)
"""What :meth:`Database.load_received` reads (each without parameters)."""


def _in_sequence_order(rows: list[Any]) -> list[tuple[str, str, str, int, Rank]]:
    """Ready rows, oldest row first, with each conversation's messages in sequence order,
    each with its rank (``ReadyIndex.add`` puts a DialogTimer, then an Error, ahead again,
    R-DLG-10).

    Row order is the order messages were *stored*, not the order they became ready:
    a message that overtook a larger one (its fragments go out behind small messages,
    R-DLG-7), or one held while an earlier one was lost, is stored first. Each
    conversation keeps the places its rows hold among the others, and its sequenced
    messages fill them in sequence order (R-DLG-1). The broker's own messages (negative
    numbers: broker errors, DialogTimer) keep their places.
    """
    out = [(str(r[0]), str(r[1]), str(r[2]), int(r[3]), rank_of(str(r[4]))) for r in rows]
    ranks = {(handle, seq): rank for _, _, handle, seq, rank in out}
    places: dict[str, list[int]] = {}
    for i, (_, _, handle, seq, _) in enumerate(out):
        if seq > 0:
            places.setdefault(handle, []).append(i)
    for indexes in places.values():
        ordered = sorted(out[i][3] for i in indexes)
        for i, seq in zip(indexes, ordered, strict=True):
            queue, group, handle, _, _ = out[i]
            out[i] = (queue, group, handle, seq, ranks[handle, seq])
    return out
