"""The application's verbs (SPEC §6, R-DLG-3, R-DLG-11, R-DLG-12).

BEGIN DIALOG, SEND (checked against the contract and the message type's
validation), END CONVERSATION (all forms), MOVE CONVERSATION, RECEIVE (a
:class:`~brokerd.dialogs.database.Lease` on one conversation group), BEGIN
CONVERSATION TIMER and ALTER QUEUE. Each verb has a ``*_work`` form that checks,
changes memory and returns a :class:`~brokerd.dialogs.work.Work`, and an
awaitable form that commits it alone; a client transaction commits several.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import operator
import sqlite3
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from brokerd.dialogs import views
from brokerd.dialogs.core import (
    EngineCore,
    _queue_row,
    _unqueue_sent,
    error_body,
)
from brokerd.dialogs.database import Database, Lease
from brokerd.dialogs.direct import direct_target
from brokerd.dialogs.endpoint import Endpoint, OutMessage, endpoint_deletion, endpoint_snapshot
from brokerd.dialogs.ready import ReadyIndex
from brokerd.dialogs.service_keys import new_dialog_key
from brokerd.dialogs.states import DELIVERING, State
from brokerd.dialogs.work import Work
from brokerd.errors import (
    BrokerError,
    ContractViolation,
    ConversationEnded,
    DialogSecurityUnavailable,
    InvalidErrorCode,
    InvalidRequest,
    LockConflict,
    MessageTooLarge,
    NotPrincipal,
    QueueDisabled,
    ServiceNotFound,
    StoreError,
    SystemMessageType,
    ValidationFailed,
)
from brokerd.storage import queries
from brokerd.storage.catalog import SYSTEM_MESSAGE_TYPES, QueueInfo
from brokerd.storage.chains import Token
from brokerd.storage.queries import Statement
from protocol.dialog import (
    END_DIALOG,
    ERROR,
    FLAG_END_DIALOG,
    FLAG_ERROR,
    FLAG_INITIATOR,
    FLAG_SEQUENCED,
)
from protocol.dialog_security import DialogKeys
from protocol.fragments import fragment_count

log = logging.getLogger("brokerd.dialogs.verbs")


class ApplicationVerbs(EngineCore):
    def new_dialog(
        self,
        from_service: str,
        to_service: str,
        contract: str,
        database: str | None = None,
        to_broker_instance: uuid.UUID | None = None,
        lifetime: int = 0,
        related_conversation: uuid.UUID | None = None,
    ) -> tuple[Database, Endpoint]:
        """BEGIN DIALOG's checks and the new initiator endpoint, not registered yet."""
        db = self.database(database) if database else self.database_of_service(from_service)
        if db.mirror_role == "mirror":
            raise NotPrincipal(
                f"database {db.name!r} is the mirror partner; begin dialogs on the principal "
                "(R-ROUTE-10)"
            )
        if from_service not in db.catalog.services:
            raise ServiceNotFound(
                f"service {from_service!r} does not exist in database {db.name!r}"
            )
        if contract not in db.catalog.contracts:
            raise ContractViolation(f"contract {contract!r} does not exist in database {db.name!r}")
        if not to_service:
            raise InvalidRequest("the target service name must not be empty")
        keys = None
        service_keys = db.service_keys
        if service_keys.secured(from_service, to_service):
            problem = service_keys.plan(from_service, to_service)
            if problem is not None:
                raise DialogSecurityUnavailable(
                    f"a dialog from {from_service!r} to {to_service!r} must be secured "
                    f"(R-DLG-14), but {problem}"
                )
            keys = DialogKeys(new_dialog_key())
        group = uuid.uuid4()
        if related_conversation is not None:
            group = self.endpoint(related_conversation)[1].group_id
        ep = Endpoint(
            handle=uuid.uuid4(),
            conversation_id=uuid.uuid4(),
            initiator=True,
            group_id=group,
            database=db.name,
            service=from_service,
            far_service=to_service,
            far_broker_instance=to_broker_instance,
            contract=contract,
            state=State.STARTED_OUTBOUND,
            lifetime=max(0, int(lifetime)),
            created_at=self.clock(),
            keys=keys,
        )
        return db, ep

    def begin_dialog_work(self, db: Database, ep: Endpoint) -> Work:
        """Register the endpoint from :meth:`new_dialog`; forgotten if the work fails."""
        db.add_endpoint(ep)

        def committed() -> None:
            self._watch(ep)
            self._trace_begun(ep)

        return Work().add([endpoint_snapshot(ep)], committed, lambda _: db.remove_endpoint(ep))

    async def begin_dialog(
        self,
        from_service: str,
        to_service: str,
        contract: str,
        database: str | None = None,
        to_broker_instance: uuid.UUID | None = None,
        lifetime: int = 0,
        related_conversation: uuid.UUID | None = None,
    ) -> Endpoint:
        db, ep = self.new_dialog(
            from_service,
            to_service,
            contract,
            database,
            to_broker_instance,
            lifetime,
            related_conversation,
        )
        await self.commit(db, self.begin_dialog_work(db, ep))
        return ep

    def check_send(self, db: Database, ep: Endpoint, message_type: str, body: bytes) -> None:
        """SEND's checks: no system message type (SPEC §6), the endpoint's state, the size,
        the contract (R-DLG-3), validation."""
        if message_type in SYSTEM_MESSAGE_TYPES:
            raise SystemMessageType(
                f"SEND refused: {message_type!r} is a system message type; only the broker "
                "sends it (END CONVERSATION ends a dialog, BEGIN CONVERSATION TIMER sets a timer)"
            )
        if db.mirror_role == "mirror":
            raise NotPrincipal(f"SEND refused: {db.fenced_reason()}; send on the principal")
        problem = ep.may_send()
        if problem:
            raise ConversationEnded(f"cannot SEND on conversation {ep.handle}: {problem}")
        if len(body) > self.max_message_size:
            raise MessageTooLarge(
                f"message of {len(body)} bytes exceeds max_message_size {self.max_message_size}"
            )
        refusal = db.catalog.send_refusal(ep.contract, message_type, ep.initiator)
        if refusal:
            raise ContractViolation(f"SEND refused by contract {ep.contract!r}: {refusal}")
        invalid = db.catalog.validation_problem(message_type, body)
        if invalid:
            raise ValidationFailed(f"SEND refused: {invalid}")

    def send_work(
        self, db: Database, ep: Endpoint, message_type: str, body: bytes
    ) -> tuple[int, Work]:
        self.check_send(db, ep, message_type, body)
        return self._enqueue_work(db, ep, message_type, FLAG_SEQUENCED, body)

    async def send(self, handle: uuid.UUID, message_type: str, body: bytes) -> int:
        db, ep = self.endpoint(handle)
        seq, work = self.send_work(db, ep, message_type, body)
        await self.commit(db, work)
        return seq

    async def send_many(self, messages: list[tuple[uuid.UUID, str, bytes]]) -> list[int]:
        """SEND several messages with one commit per database (a producer's batched path).

        Every message is checked before any is queued: one refusal refuses the batch.
        """
        found = [
            (*self.endpoint(handle), message_type, body) for handle, message_type, body in messages
        ]
        for db, ep, message_type, body in found:
            self.check_send(db, ep, message_type, body)
        works: dict[str, tuple[Database, Work]] = {}
        seqs: list[int] = []
        flags = FLAG_SEQUENCED
        for db, ep, message_type, body in found:
            seq, work = self._enqueue_work(db, ep, message_type, flags, body)
            seqs.append(seq)
            works.setdefault(db.name, (db, Work()))[1].extend(work)
        # Queued at once, not from tasks started later: by then a message received on one
        # of these endpoints could have queued a newer snapshot than the ones taken here.
        await asyncio.gather(*(self.submit(db, work) for db, work in works.values()))
        return seqs

    def send_now(
        self,
        db: Database,
        ep: Endpoint,
        messages: Sequence[tuple[str, bytes]],
        then: Callable[[int, int], None],
        failed: Callable[[int, BaseException], None],
    ) -> None:
        """Pipelined SENDs on one conversation, outside a transaction, without a future:
        each committed on its own as :meth:`send_work` would, then ``then(i, sequence
        number)`` for ``messages[i]``, or ``failed(i, error)``. The client listener's path
        for every pipelined SEND (consecutive ones on one conversation come together), so
        it builds no :class:`Work`.

        A message that fails its checks is refused alone; the others go on, numbered in
        order. SENDs to a dialog whose far endpoint is in the same database go straight
        into that endpoint's queue when they can (R-DLG-13, :mod:`brokerd.dialogs.direct`),
        all in one job.
        """
        checked: list[tuple[int, str, bytes]] = []
        for i, (message_type, body) in enumerate(messages):
            try:
                self.check_send(db, ep, message_type, body)
            except BrokerError as exc:
                failed(i, exc)
            else:
                checked.append((i, message_type, body))
        if not checked:
            return
        far = direct_target(db, ep)
        if far is not None:
            self._send_direct(db, ep, far, checked, then, failed)
            return
        self._send_queued(db, ep, checked, then, failed)

    def _send_queued(
        self,
        db: Database,
        ep: Endpoint,
        messages: list[tuple[int, str, bytes]],
        then: Callable[[int, int], None],
        failed: Callable[[int, BaseException], None],
    ) -> None:
        """Pipelined SENDs (``(i, type, body)``) through the transmission queue, in one job:
        their rows and one endpoint row commit together, and each is handed to its link
        after that commit, in order. A failed commit gives every number back."""
        chain = ep.numbering
        statements: list[Statement] = []
        sent: list[tuple[int, int, Callable[[], None]]] = []
        for i, message_type, body in messages:
            seq, rows, committed, _ = self._enqueue_steps(
                db, ep, message_type, FLAG_SEQUENCED, body, snapshot=False
            )
            statements += rows
            sent.append((i, seq, committed))
        first, last = sent[0][1], sent[-1][1]
        statements.append(endpoint_snapshot(ep, sent=last))

        def on_commit() -> None:
            for i, seq, committed in sent:
                committed()
                then(i, seq)

        def on_failure(exc: BaseException) -> None:
            self._send_failed(ep, chain, first, exc, last - first + 1)
            for i, _, _ in sent:
                failed(i, exc)

        db.store.submit(statements, on_commit=on_commit, on_failure=on_failure, chains=(chain,))

    def _send_direct(
        self,
        db: Database,
        ep: Endpoint,
        far: Endpoint,
        messages: list[tuple[int, str, bytes]],
        then: Callable[[int, int], None],
        failed: Callable[[int, BaseException], None],
    ) -> None:
        """SEND ``messages`` (``(i, type, body)``) into ``far``'s queue in one transaction
        with both endpoints' rows (R-DLG-13): no transmission queue row, no fragment, no
        acknowledgement. The far side accepts the numbers now, as a receiver accepts a
        fragment before its commit; the messages are ready to RECEIVE once committed, and
        a failed commit gives every number back and reloads what the database has
        received from its file, as a failed receive does. One job for them all: one
        endpoint row each side, one callback, one trace entry per run of alike messages."""
        chain = ep.numbering
        count = len(messages)
        first = ep.send_sequence + 1
        ep.send_sequence += count
        last = ep.send_sequence
        ep.uncommitted_sends += count
        ep.refresh_state()
        seqs = list(range(first, last + 1))
        accepted = far.accepted
        for seq in seqs:
            accepted.add_message(seq)
        if far.refresh_state():
            self._trace_closed(far)
        queue = db.queue_of(far.service) or ""
        index = db.ready.get(queue)
        now = self.clock()
        statements = [
            _queue_row(far, queue, seq, 1, message_type, len(body), body, now)
            for seq, (_, message_type, body) in zip(seqs, messages, strict=True)
        ]
        statements.append(endpoint_snapshot(ep, sent=last))
        statements.append(endpoint_snapshot(far, received=accepted.through))
        self._trace_sent_runs(db, ep, seqs, messages)

        def on_commit() -> None:
            ep.uncommitted_sends -= count
            self.stats.sent_messages += count
            durable = far.durable
            for seq in seqs:
                durable.add_message(seq)
            if far.state in DELIVERING:
                self._delivered(db, far, queue, index, seqs, False)
            else:  # ended meanwhile: its END removes the rows again (R-DLG-10)
                self._trace_discarded(
                    far, seqs, "this side has ended the conversation", received=True
                )
            for seq, (i, _, _) in zip(seqs, messages, strict=True):
                then(i, seq)

        def on_failure(exc: BaseException) -> None:
            self._send_failed(ep, chain, first, exc, count)
            self._suspend_receiving(db)  # far.accepted claims the numbers: memory is reloaded
            for i, _, _ in messages:
                failed(i, exc)

        db.store.submit(
            statements, on_commit=on_commit, on_failure=on_failure, chains=(chain, far.receiving)
        )

    @staticmethod
    def _send_failed(
        ep: Endpoint, chain: Token, seq: int, exc: BaseException, count: int = 1
    ) -> None:
        """``count`` SENDs numbered from ``seq`` on, in one job, did not commit. If the store
        failed them (a :class:`StoreError`), their numbers and every later one of their
        generation, which the store refuses untried, are given back
        (:meth:`Endpoint.give_back`). If they never reached the store (a transaction whose
        later verb was refused at COMMIT), nothing in flight depends on them: their
        numbers are given back if they are still the last. The file never held them: an
        endpoint row counts only committed SENDs
        (:func:`~brokerd.dialogs.endpoint.endpoint_snapshot`)."""
        ep.uncommitted_sends -= count
        if isinstance(exc, StoreError):
            ep.give_back(chain, seq)
        elif ep.send_sequence == seq + count - 1:
            ep.send_sequence = seq - 1
        ep.refresh_state(undo=True)

    def _trace_sent(
        self, db: Database, ep: Endpoint, seq: int, message_type: str, size: int
    ) -> None:
        self.trace.emit_grouped(
            "message_sent",
            ep.conversation_id,
            "seq",
            seq,
            database=db.name,
            initiator=ep.initiator,
            size=size,
            message_type=message_type,
            service=ep.service,
            far_service=ep.far_service,
        )

    def _trace_sent_runs(
        self, db: Database, ep: Endpoint, seqs: list[int], messages: list[tuple[int, str, bytes]]
    ) -> None:
        """``message_sent`` of each of ``messages``, numbered ``seqs``: one buffered entry
        per run of messages of one type and size (their lines differ only in ``seq``)."""
        if not self.trace.enabled:
            return
        start = 0
        count = len(messages)
        while start < count:
            _, message_type, body = messages[start]
            size = len(body)
            end = start + 1
            while end < count and (messages[end][1], len(messages[end][2])) == (message_type, size):
                end += 1
            self.trace.emit_each(
                "message_sent",
                ep.conversation_id,
                "seq",
                seqs[start:end],
                database=db.name,
                initiator=ep.initiator,
                size=size,
                message_type=message_type,
                service=ep.service,
                far_service=ep.far_service,
            )
            start = end

    def _enqueue_work(
        self,
        db: Database,
        ep: Endpoint,
        message_type: str,
        flags: int,
        body: bytes,
        extra: Iterable[Statement] = (),
    ) -> tuple[int, Work]:
        chain = ep.numbering
        seq, statements, committed, failed = self._enqueue_steps(
            db, ep, message_type, flags, body, extra
        )
        return seq, Work().add(statements, committed, failed, chain)

    def _enqueue_steps(
        self,
        db: Database,
        ep: Endpoint,
        message_type: str,
        flags: int,
        body: bytes,
        extra: Iterable[Statement] = (),
        snapshot: bool = True,
    ) -> tuple[int, list[Statement], Callable[[], None], Callable[[BaseException], None]]:
        """A SEND's sequence number, rows, and what runs after its commit or failure (the
        job holding the rows extends the chain ``ep.numbering`` had before this call).
        Without ``snapshot`` the rows leave out the endpoint's: a caller that puts several
        SENDs in one job adds it once, after the last."""
        chain = ep.numbering
        ep.send_sequence += 1
        seq = ep.send_sequence
        if ep.initiator:
            flags |= FLAG_INITIATOR
        msg = OutMessage(
            seq=seq,
            message_type=message_type,
            flags=flags,
            body=body,
            length=len(body),
            enqueued_at=self.clock(),
            fragment_count=fragment_count(len(body), self.fragment_size),
        )
        ep.uncommitted_sends += 1
        ep.refresh_state()
        trace = self.trace
        self._trace_sent(db, ep, seq, message_type, len(body))
        statements: list[Statement] = [
            *extra,
            queries.sent_message(ep.handle_text, seq, message_type, flags, body, msg.enqueued_at),
        ]
        if snapshot:
            statements.append(endpoint_snapshot(ep, sent=seq))

        def committed() -> None:
            ep.uncommitted_sends -= 1
            behind = bool(ep.backlog) or (
                len(ep.outbox) >= self.transmission.spill and not self.transmission.link_open(ep)
            )
            if behind:
                # Behind a backlog (after a restart, or many messages waiting for a link
                # that is down): it is paged in after the messages before it, from the
                # file it was just committed to; no object of it stays in memory.
                ep.backlog.add(seq)
            else:
                ep.outbox[seq] = msg
            self.stats.sent_messages += 1
            trace.emit_grouped(
                "enqueued",
                ep.conversation_id,
                "seq",
                seq,
                database=db.name,
                initiator=ep.initiator,
                size=len(body),
                fragments=msg.fragment_count,
            )
            if behind:
                self.transmission.page_in(ep)
                return
            self.transmission.bodies.keep(msg)
            self.transmission.send_new(ep, msg)

        def failed(exc: BaseException) -> None:
            self._send_failed(ep, chain, seq, exc)

        return seq, statements, committed, failed

    @staticmethod
    def check_end(error_code: int | None, cleanup: bool = False) -> None:
        """END CONVERSATION's check: WITH ERROR takes a code greater than 0; the codes
        below zero are the broker's own (SPEC §6)."""
        if error_code is not None and not cleanup and error_code <= 0:
            raise InvalidErrorCode(
                f"END CONVERSATION WITH ERROR needs a code greater than 0, not {error_code}: "
                "codes of 0 and below are the broker's own"
            )

    def end_conversation_work(
        self,
        db: Database,
        ep: Endpoint,
        error_code: int | None = None,
        description: str = "",
        cleanup: bool = False,
    ) -> Work:
        self.check_end(error_code, cleanup)
        if cleanup:
            return self._cleanup_work(db, ep)
        if ep.ended_local or ep.state is State.CLOSED:
            return Work()
        ep.ended_local = True
        dropped = dict(ep.outbox)
        dropped_runs = ep.backlog.spans()
        dropped_seqs = [*dropped, *ep.backlog]
        queue = db.queue_of(ep.service)
        index = db.ready.get(queue) if queue else None
        unreceived = index.drop_conversation(ep.handle) if index is not None else []

        def failed(_: BaseException) -> None:
            ep.ended_local = False
            ep.outbox.update(dropped)
            ep.backlog.restore(dropped_runs)
            ep.refresh_state(undo=True)
            if index is not None:
                for group, items in unreceived:
                    index.put_back(group, items)

        # SPEC §6, R-DLG-10: what waits in this side's queue goes, and nothing more comes.
        work = Work().add(queries.discard_queued(ep.handle_text), on_failure=failed)
        if ep.broker_error:
            self._trace_discarded(ep, dropped_seqs, "END CONVERSATION after a broker error")
            self.transmission.discard(ep)
            ep.refresh_state()
            return work.add([endpoint_snapshot(ep)])
        if error_code is not None:
            self._trace_discarded(ep, dropped_seqs, "END CONVERSATION WITH ERROR")
            self.transmission.discard(ep)
            _, enqueued = self._enqueue_work(
                db,
                ep,
                ERROR,
                FLAG_SEQUENCED | FLAG_ERROR,
                error_body(error_code, description),
                _unqueue_sent(ep, list(dropped), runs=dropped_runs),
            )
        else:
            _, enqueued = self._enqueue_work(
                db, ep, END_DIALOG, FLAG_SEQUENCED | FLAG_END_DIALOG, b""
            )
        return work.extend(enqueued)

    async def end_conversation(
        self,
        handle: uuid.UUID,
        error_code: int | None = None,
        description: str = "",
        cleanup: bool = False,
    ) -> None:
        db, ep = self.endpoint(handle)
        work = self.end_conversation_work(db, ep, error_code, description, cleanup)
        if work.statements:
            await self.commit(db, work)

    def _cleanup_work(self, db: Database, ep: Endpoint) -> Work:
        self._trace_discarded(ep, [*ep.outbox, *ep.backlog], "END CONVERSATION WITH CLEANUP")
        self.transmission.discard(ep)
        ep.state = State.CLOSED
        self._trace_closed(ep)
        db.remove_endpoint(ep)
        queue = db.queue_of(ep.service)
        if queue in db.ready:
            db.ready[queue].drop_conversation(ep.handle)
        ep.timer_due = 0.0
        return Work().add([*queries.forget_conversation(ep.handle_text), endpoint_deletion(ep)])

    def check_move(
        self, db: Database, ep: Endpoint, group: uuid.UUID, owned: Collection[uuid.UUID] = ()
    ) -> None:
        """MOVE CONVERSATION's check: neither group is locked by another transaction
        (``owned`` are the groups the caller's own transaction holds)."""
        queue = db.queue_of(ep.service)
        index = db.ready.get(queue) if queue else None
        if index is None:
            return
        for gid in (ep.group_id, group):
            if gid in index.locked and gid not in owned:
                raise LockConflict(
                    f"conversation group {gid} is locked by a RECEIVE of another transaction"
                )

    def move_conversation_work(
        self, db: Database, ep: Endpoint, group: uuid.UUID, owned: Collection[uuid.UUID] = ()
    ) -> Work:
        """MOVE CONVERSATION: the conversation joins conversation group ``group``.

        Its waiting messages move with it. Refused while another transaction holds
        either group (its messages are being received).
        """
        old = ep.group_id
        if old == group:
            return Work()
        self.check_move(db, ep, group, owned)
        queue = db.queue_of(ep.service)
        index = db.ready.get(queue) if queue else None
        ep.group_id = group
        if index is not None:
            index.move_conversation(ep.handle, old, group)

        def failed(_: BaseException) -> None:
            ep.group_id = old
            if index is not None:
                index.move_conversation(ep.handle, group, old)

        return Work().add(
            [queries.regroup(ep.handle_text, ep.group_text), endpoint_snapshot(ep)],
            on_failure=failed,
        )

    async def move_conversation(self, handle: uuid.UUID, group: uuid.UUID) -> None:
        db, ep = self.endpoint(handle)
        await self.commit(db, self.move_conversation_work(db, ep, group))

    async def discard_received(self, ep: Endpoint) -> None:
        """Remove what ``ep`` received from its queue (system dialogs consume their replies)."""
        db = self.databases[ep.database]
        queue = db.queue_of(ep.service)
        if queue in db.ready:
            db.ready[queue].drop_conversation(ep.handle)
        await self.submit_wait(db, queries.discard_received(ep.handle_text))

    async def take_ready(
        self,
        queue: str,
        database: str | None = None,
        top: int = 1,
        timeout: float = 0.0,
        handle: uuid.UUID | None = None,
        owned: Collection[uuid.UUID] = (),
    ) -> Lease | None:
        """RECEIVE's choice: up to ``top`` ready messages of one conversation group, whose
        lock the returned lease holds; waits up to ``timeout`` s (negative: forever).

        ``owned`` are groups the caller's transaction already holds: they may be taken
        from again. None when nothing arrived in time.
        """
        db, info, index, group = self._ready_of(queue, database, handle)
        deadline = None if timeout < 0 else self.loop.time() + timeout
        while True:
            taken = index.take(max(1, top), handle, group, owned)
            if taken is not None:
                gid, items = taken
                return Lease(db, queue, index, gid, items, info.retention, gid not in owned)
            remaining = None if deadline is None else deadline - self.loop.time()
            if remaining is not None and remaining <= 0:
                return None
            index.changed.clear()
            try:
                await asyncio.wait_for(index.changed.wait(), remaining)
            except TimeoutError:
                return None

    def _ready_of(
        self, queue: str, database: str | None, handle: uuid.UUID | None
    ) -> tuple[Database, QueueInfo, ReadyIndex, uuid.UUID | None]:
        """RECEIVE's checks: the queue's database, the queue (enabled), its ready index,
        and the group of ``handle`` if one is named."""
        db = self._database_of_queue(queue, database)
        info = db.catalog.queues[queue]
        if not info.status:
            raise QueueDisabled(f"queue {queue!r} in database {db.name!r} is disabled (status off)")
        group = None
        if handle is not None:
            group = self.endpoint(handle)[1].group_id
        return db, info, db.ready[queue], group

    async def read_leased(
        self, lease: Lease, budget: queries.Budget | None = None
    ) -> list[dict[str, Any]]:
        """The rows of a lease's messages, read without removing them; the messages
        beyond ``budget`` go back to the queue at once (the lease keeps the lock)."""
        try:
            rows, used = await lease.db.store.run(
                lambda conn: queries.read_received(conn, lease.items, budget)
            )
        except BaseException:
            self.release(lease, received=False)
            raise
        self.trim(lease, used)
        return rows

    def trim(self, lease: Lease, used: int) -> None:
        """Keep the first ``used`` messages of a lease; the others go back in front of
        their group, in order, while the lease still holds the group's lock."""
        rest = lease.items[used:]
        if not rest:
            return
        lease.items = lease.items[:used]
        kept = [item for item in rest if item[0] in lease.db.endpoints]
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

    def release(self, lease: Lease, received: bool) -> None:
        """Unlock a lease's group; its messages go back in front, in order, unless received."""
        if lease.released:
            return
        lease.released = True
        index = lease.index
        if not received:
            # A conversation cleaned up or ended meanwhile has no rows left to give back.
            endpoints = lease.db.endpoints
            kept = [
                item
                for item in lease.items
                if (owner := endpoints.get(item[0])) is not None and owner.state in DELIVERING
            ]
            if kept:
                index.put_back(lease.group, kept)
            index.received([item for item in lease.items if item not in kept])
        else:
            index.received(lease.items)
        if lease.locks:
            index.locked.discard(lease.group)
        if index.count:
            index.changed.set()
        if received:
            self._trace_received(lease)

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
        budget: queries.Budget | None = None,
    ) -> list[dict[str, Any]]:
        """RECEIVE TOP (top) outside a transaction: the messages leave the queue in the
        same commit that reads them (autocommit; at most once to the application).

        ``budget`` cuts the batch to what the caller's reply can carry before anything
        is removed; the messages beyond it stay in the queue, first in their group."""
        lease = await self.take_ready(queue, database, top, timeout, handle)
        if lease is None:
            return []
        future = self._read_and_remove(lease, budget, None, None)
        assert future is not None
        rows: list[dict[str, Any]] = await future
        return rows

    def receive_now(
        self,
        queue: str,
        database: str | None,
        top: int,
        handle: uuid.UUID | None,
        budget: queries.Budget | None,
        then: Callable[[list[dict[str, Any]]], None],
        failed: Callable[[BaseException], None],
    ) -> bool:
        """:meth:`receive` without a task or a future when messages are ready now: the
        rows go to ``then`` from the callback of the commit that removed them (or the
        error to ``failed``). False, with nothing taken, when none are ready: the caller
        waits with :meth:`receive`. The client listener's path for RECEIVE, so that a
        consumer behind a busy event loop waits for its commit, not for further turns
        of the loop."""
        db, info, index, group = self._ready_of(queue, database, handle)
        taken = index.take(max(1, top), handle, group)
        if taken is None:
            return False
        gid, items = taken
        lease = Lease(db, queue, index, gid, items, info.retention)
        try:
            self._read_and_remove(lease, budget, then, failed)
        except BaseException:
            self.release(lease, received=False)
            raise
        return True

    def _read_and_remove(
        self,
        lease: Lease,
        budget: queries.Budget | None,
        then: Callable[[list[dict[str, Any]]], None] | None,
        failed: Callable[[BaseException], None] | None,
    ) -> asyncio.Future[Any] | None:
        """The autocommit RECEIVE's job: read the lease's rows (cut to ``budget``) and
        remove them in one commit; the rows to ``then`` (or the future, without it)."""
        used = [len(lease.items)]
        result: list[list[dict[str, Any]]] = [[]]

        def read_and_remove(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows, used[0] = queries.read_received(conn, lease.items, budget, True, lease.retention)
            result[0] = rows
            return rows

        def committed() -> None:
            self.trim(lease, used[0])
            self.release(lease, received=True)
            if then is not None:
                then(result[0])

        def not_committed(exc: BaseException) -> None:
            self.release(lease, received=False)
            if failed is not None:
                failed(exc)

        return lease.db.store.submit(
            (),
            fn=read_and_remove,
            on_commit=committed,
            on_failure=not_committed,
            wait=then is None,
        )

    async def alter_queue(self, queue: str, status: bool, database: str | None = None) -> None:
        """ALTER QUEUE ... WITH STATUS = ON | OFF (R-DLG-12).

        While a queue is off, messages for it are still accepted, stored and
        acknowledged, but RECEIVE refuses; turning it on makes them receivable.
        """
        db = self._database_of_queue(queue, database)
        info = db.catalog.queues[queue]
        await self.submit_wait(db, [queries.set_queue_status(queue, status)])
        info.status = status
        if status:
            db.ready[queue].changed.set()

    async def transmission_queue(self) -> list[dict[str, Any]]:
        """The ``transmission_queue`` view: what each database sent and has not had
        acknowledged, then what it received for a queue that is off and holds until the
        queue is turned on (R-DLG-12), read from its file."""
        backlogs: dict[uuid.UUID, list[queries.SentRow]] = {}
        for db in self.databases.values():
            for ep in list(db.endpoints.values()):
                for first, last in ep.backlog.spans():
                    page = await db.store.run(
                        functools.partial(
                            queries.read_sent_page, handle=ep.handle_text, first=first, last=last
                        )
                    )
                    backlogs.setdefault(ep.handle, []).extend(
                        row for row in page if row[0] in ep.backlog
                    )
        rows = views.transmission_queue(self.databases.values(), backlogs)
        for db in self.databases.values():
            off = [q.name for q in db.catalog.queues.values() if not q.status and not q.system]
            if off:
                held = await db.store.run(functools.partial(queries.read_held_for, queues=off))
                rows += views.held_for_disabled_queues(db, held)
        return rows

    def check_timer(self, ep: Endpoint, timeout: float) -> None:
        """BEGIN CONVERSATION TIMER's checks: an open conversation, a timeout >= 0."""
        if ep.state is State.CLOSED:
            raise ConversationEnded(f"cannot set a timer on conversation {ep.handle}: it is closed")
        if not timeout >= 0:
            raise InvalidRequest(f"timer timeout must be >= 0 seconds, not {timeout}")

    def timer_work(self, db: Database, ep: Endpoint, timeout: float) -> Work:
        """BEGIN CONVERSATION TIMER (R-DLG-11): a DialogTimer message in this side's queue
        after ``timeout`` seconds. A new timer replaces the conversation's current one; it
        is not shared with the other side and does not change the lifetime."""
        self.check_timer(ep, timeout)
        due = self.clock() + timeout

        def committed() -> None:
            ep.timer_due = due
            self._watch(ep)

        return Work().add(
            [queries.set_timer(ep.handle_text, due)],
            committed,
        )

    async def begin_conversation_timer(self, handle: uuid.UUID, timeout: float) -> None:
        db, ep = self.endpoint(handle)
        await self.commit(db, self.timer_work(db, ep, timeout))
