"""SEND (SPEC §6, R-DLG-1, R-DLG-3, R-DLG-13): the contract's and the message type's
checks, a sequence number, and the message's way out: through the transmission queue
to its link, or straight into a target queue of the same database. One SEND as a
``*_work`` for a transaction, ``send_many``'s SENDs in one, and the client listener's
pipelined SENDs (a run on one conversation in one job).

May import: ``brokerd.dialogs.arrivals`` (a SEND inside one database is delivered as
an arrival is), ``brokerd.dialogs.transmission``, ``brokerd.dialogs.endpoints`` and what
they may import.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable, Iterable, Sequence

from brokerd.dialogs.arrivals.delivery import Delivery
from brokerd.dialogs.endpoints.commits import commit, submit
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.directory import Directory
from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage, endpoint_snapshot, queue_row
from brokerd.dialogs.endpoints.events import DialogEvents
from brokerd.dialogs.endpoints.ready import Rank
from brokerd.dialogs.endpoints.runs import alike_runs
from brokerd.dialogs.endpoints.states import DELIVERING
from brokerd.dialogs.endpoints.stats import EngineStats
from brokerd.dialogs.endpoints.work import Work
from brokerd.dialogs.transmission.transmission import Transmission
from brokerd.dialogs.verbs.direct import direct_target
from brokerd.errors import (
    BrokerError,
    ContractViolation,
    ConversationEnded,
    MessageTooLarge,
    NotPrincipal,
    StoreError,
    SystemMessageType,
    ValidationFailed,
)
from brokerd.storage import queries
from brokerd.storage.catalog import SYSTEM_MESSAGE_TYPES
from brokerd.storage.chains import Token
from brokerd.storage.schema import Statement
from brokerd.traces.writer import TraceWriter
from protocol.buffers import Body
from protocol.dialog import FLAG_INITIATOR, FLAG_SEQUENCED
from protocol.fragments import fragment_count


class SendVerbs:
    """SEND, and the messages a verb queues on a dialog (END CONVERSATION's ending)."""

    def __init__(
        self,
        directory: Directory,
        transmission: Transmission,
        delivery: Delivery,
        events: DialogEvents,
        trace: TraceWriter,
        stats: EngineStats,
        clock: Callable[[], float],
        fragment_size: int,
        max_message_size: int,
        key_window: float,
    ) -> None:
        self.directory = directory
        self.transmission = transmission
        self.delivery = delivery
        self.events = events
        self.trace = trace
        self.stats = stats
        self.clock = clock
        self.fragment_size = fragment_size
        self.max_message_size = max_message_size
        self.key_window = key_window
        """Seconds an idempotency key is kept (``limits.send_key_window``)."""

    def check_send(self, db: Database, ep: Endpoint, message_type: str, body: Body) -> None:
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
        return self.enqueue_work(db, ep, message_type, FLAG_SEQUENCED, body)

    async def send(self, handle: uuid.UUID, message_type: str, body: bytes) -> int:
        db, ep = self.directory.endpoint(handle)
        seq, work = self.send_work(db, ep, message_type, body)
        await commit(db, work)
        return seq

    async def send_many(
        self,
        messages: list[tuple[uuid.UUID, str, bytes]],
        keys: Sequence[str | None] | None = None,
    ) -> list[int]:
        """SEND several messages with one commit per database (a producer's batched path).

        Every message is checked before any is queued: one refusal refuses the batch.
        ``keys`` are their idempotency keys (as :meth:`send_now`'s): a message whose key
        its conversation has seen is not sent again, and gets the first one's number.
        """
        found = [
            (*self.directory.endpoint(handle), message_type, body)
            for handle, message_type, body in messages
        ]
        loop = asyncio.get_running_loop()
        answers: list[int | asyncio.Future[int] | None] = [None] * len(found)
        for n, (_, ep, _, _) in enumerate(found):
            key = keys[n] if keys is not None else None
            if key is None:
                continue
            if key in ep.sent_keys or key in ep.keys_in_flight:
                answers[n] = self._wait_for_key(ep, key, loop)
        for n, (db, ep, message_type, body) in enumerate(found):
            if answers[n] is None:
                self.check_send(db, ep, message_type, body)
        works: dict[str, tuple[Database, Work]] = {}
        registered: list[tuple[Endpoint, str]] = []
        """Keys this call put in flight: taken out again if it fails before submitting."""
        try:
            self._number_many(found, keys, answers, works, registered, loop)
        except BaseException as exc:
            for ep, key in registered:
                ep.key_failed(key, exc)
            raise
        # Queued at once, not from tasks started later: by then a message received on one
        # of these endpoints could have queued a newer snapshot than the ones taken here.
        await asyncio.gather(*(submit(db, work) for db, work in works.values()))
        return [a if isinstance(a, int) else await a for a in answers if a is not None]

    def _number_many(
        self,
        found: list[tuple[Database, Endpoint, str, bytes]],
        keys: Sequence[str | None] | None,
        answers: list[int | asyncio.Future[int] | None],
        works: dict[str, tuple[Database, Work]],
        registered: list[tuple[Endpoint, str]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """:meth:`send_many`'s numbering: each new message's work, per database, and the
        number (or the outcome to wait for) of each in ``answers``."""
        flags = FLAG_SEQUENCED
        for n, (db, ep, message_type, body) in enumerate(found):
            if answers[n] is not None:
                continue
            key = keys[n] if keys is not None else None
            if key is not None and key in ep.keys_in_flight:  # the same key earlier here
                answers[n] = self._wait_for_key(ep, key, loop)
                continue
            extra: list[Statement] = []
            now = self.clock()
            if key is not None:
                extra.append(queries.send_key(ep.handle_text, key, ep.send_sequence + 1, now))
                ep.keys_in_flight[key] = []
                registered.append((ep, key))
            seq, work = self.enqueue_work(db, ep, message_type, flags, body, extra)
            if key is not None:
                work.add(
                    [],
                    functools.partial(ep.key_committed, key, seq, now),
                    functools.partial(ep.key_failed, key),
                )
            answers[n] = seq
            works.setdefault(db.name, (db, Work()))[1].extend(work)

    @staticmethod
    def _wait_for_key(
        ep: Endpoint, key: str, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future[int]:
        """The number of the SEND with ``key`` (known, or committing now), as a future."""
        future: asyncio.Future[int] = loop.create_future()

        def then(_: int, seq: int) -> None:
            if not future.done():
                future.set_result(seq)

        def failed(_: int, exc: BaseException) -> None:
            if not future.done():
                future.set_exception(exc)

        ep.answer_by_key(key, 0, then, failed)
        return future

    def forget_old_keys(self, now: float) -> None:
        """Forget the idempotency keys kept longer than ``limits.send_key_window``, in
        memory and in each database's file."""
        before = now - self.key_window
        for db in self.directory.databases.values():
            if db.mirror_role == "mirror":
                continue  # its file changes only by what the principal ships
            old = 0
            for ep in db.endpoints.values():
                if ep.sent_keys:
                    stale = [k for k, (_, at) in ep.sent_keys.items() if at < before]
                    for k in stale:
                        del ep.sent_keys[k]
                    old += len(stale)
            if old:
                db.store.submit([queries.forget_send_keys(before)])

    def send_now(
        self,
        db: Database,
        ep: Endpoint,
        messages: Sequence[tuple[str, Body]],
        then: Callable[[int, int], None],
        failed: Callable[[int, BaseException], None],
        keys: Sequence[str | None] | None = None,
    ) -> None:
        """Pipelined SENDs on one conversation, outside a transaction, without a future:
        each committed on its own as :meth:`send_work` would, then ``then(i, sequence
        number)`` for ``messages[i]``, or ``failed(i, error)``. The client listener's path
        for every pipelined SEND (consecutive ones on one conversation come together), so
        it builds no :class:`Work`.

        A message that fails its checks is refused alone; the others go on, numbered in
        order. SENDs to a dialog whose far endpoint is in the same database go straight
        into that endpoint's queue when they can (R-DLG-13, :mod:`brokerd.dialogs.verbs.direct`),
        all in one job.

        ``keys`` are the SENDs' idempotency keys (None: none). A SEND whose key this
        conversation has seen within ``limits.send_key_window`` is not sent again: it is
        answered with the first one's number (or its outcome, while it commits). A key
        is kept in the SEND's own job, so it is durable exactly when the SEND is.
        """
        checked: list[tuple[int, str, Body]] = []
        key_of: dict[int, str] = {}
        """The idempotency key of each checked SEND that has one, by its ``i``."""
        for i, (message_type, body) in enumerate(messages):
            key = keys[i] if keys is not None else None
            if key is not None and ep.answer_by_key(key, i, then, failed):
                continue
            try:
                self.check_send(db, ep, message_type, body)
            except BrokerError as exc:
                failed(i, exc)
                continue
            if key is not None:
                ep.keys_in_flight[key] = []
                key_of[i] = key
            checked.append((i, message_type, body))
        if not checked:
            return
        extra: list[Statement] = []
        if key_of:
            then, failed, extra = self._keyed(ep, checked, key_of, then, failed)
        try:
            far = direct_target(db, ep)
            if far is not None:
                self._send_direct(db, ep, far, checked, then, failed, extra)
                return
            self._send_queued(db, ep, checked, then, failed, extra)
        except BaseException as exc:  # nothing was submitted: the keys are not in flight
            for key in key_of.values():
                ep.key_failed(key, exc)
            raise

    def _keyed(
        self,
        ep: Endpoint,
        checked: list[tuple[int, str, Body]],
        key_of: dict[int, str],
        then: Callable[[int, int], None],
        failed: Callable[[int, BaseException], None],
    ) -> tuple[Callable[[int, int], None], Callable[[int, BaseException], None], list[Statement]]:
        """The rows that keep the keys of ``checked``'s keyed SENDs with the numbers they
        are about to get (the next ones, in order, whichever path they take), and the
        callbacks that remember the keys once committed and answer the retries waiting."""
        now = self.clock()
        handle = ep.handle_text
        first = ep.send_sequence + 1
        extra = [
            queries.send_key(handle, key_of[i], seq, now)
            for seq, (i, _, _) in enumerate(checked, first)
            if i in key_of
        ]

        def keyed_then(i: int, seq: int) -> None:
            key = key_of.get(i)
            if key is not None:
                ep.key_committed(key, seq, now)
            then(i, seq)

        def keyed_failed(i: int, exc: BaseException) -> None:
            key = key_of.get(i)
            if key is not None:
                ep.key_failed(key, exc)
            failed(i, exc)

        return keyed_then, keyed_failed, extra

    def _send_queued(
        self,
        db: Database,
        ep: Endpoint,
        messages: list[tuple[int, str, Body]],
        then: Callable[[int, int], None],
        failed: Callable[[int, BaseException], None],
        extra: list[Statement],
    ) -> None:
        """Pipelined SENDs (``(i, type, body)``) through the transmission queue, in one job:
        their rows and one endpoint row commit together, and each is handed to its link
        after that commit, in order. A failed commit gives every number back."""
        chain = ep.numbering
        count = len(messages)
        first = ep.send_sequence + 1
        flags = FLAG_SEQUENCED | FLAG_INITIATOR if ep.initiator else FLAG_SEQUENCED
        now = self.clock()
        handle = ep.handle_text
        sent: list[OutMessage] = []
        statements: list[Statement] = list(extra)
        for seq, (_, message_type, body) in enumerate(messages, first):
            sent.append(self._new_message(seq, message_type, flags, body, now))
            statements.append(queries.sent_message(handle, seq, message_type, flags, body, now))
        ep.send_sequence += count
        last = ep.send_sequence
        ep.uncommitted_sends += count
        ep.refresh_state()
        statements.append(endpoint_snapshot(ep, sent=last))

        def on_commit() -> None:
            ep.uncommitted_sends -= count
            try:
                # R-TRACE-1: a SEND is traced once committed, never one rolled back
                self._trace_sent_runs(db, ep, list(range(first, last + 1)), messages)
                self._enqueued(db, ep, sent)
            finally:  # committed: every SEND of the run is answered, whatever happens here
                for (i, _, _), msg in zip(messages, sent, strict=True):
                    then(i, msg.seq)

        def on_failure(exc: BaseException) -> None:
            sends_failed(ep, chain, first, exc, count)
            for i, _, _ in messages:
                failed(i, exc)

        db.store.submit(statements, on_commit=on_commit, on_failure=on_failure, chains=(chain,))

    def _enqueued(self, db: Database, ep: Endpoint, messages: list[OutMessage]) -> None:
        """SENDs of ``ep`` committed (in order, one job): each joins the transmission queue
        in memory and goes to its link, or, behind a backlog (after a restart, or many
        messages waiting for a link that is down), is paged in after the messages before
        it, from the file it was just committed to (no object of it stays in memory)."""
        self.stats.sent_messages += len(messages)
        if ep.dropped_before and messages[0].seq < ep.dropped_before:
            # dropped by this side's END WITH ERROR, which deletes their rows (R-DLG-10)
            messages = [msg for msg in messages if msg.seq >= ep.dropped_before]
            if not messages:
                return
        self._trace_enqueued(db, ep, messages)
        transmission = self.transmission
        outbox, backlog = ep.outbox, ep.backlog
        new: list[OutMessage] = []
        for msg in messages:
            if backlog or (len(outbox) >= transmission.spill and not transmission.link_open(ep)):
                if new:
                    transmission.send_run(ep, new)
                    new = []
                backlog.add(msg.seq)
                transmission.page_in(ep)
                continue
            outbox[msg.seq] = msg
            transmission.bodies.keep(msg)
            new.append(msg)
        if new:
            transmission.send_run(ep, new)

    def _send_direct(
        self,
        db: Database,
        ep: Endpoint,
        far: Endpoint,
        messages: list[tuple[int, str, Body]],
        then: Callable[[int, int], None],
        failed: Callable[[int, BaseException], None],
        extra: list[Statement],
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
        far.refresh_state()  # a close is traced at the commit
        queue = db.queue_of(far.service) or ""
        index = db.ready.get(queue)
        now = self.clock()
        statements = [
            *extra,
            *(
                queue_row(far, queue, seq, 1, message_type, len(body), body, now)
                for seq, (_, message_type, body) in zip(seqs, messages, strict=True)
            ),
        ]
        statements.append(endpoint_snapshot(ep, sent=last))
        statements.append(endpoint_snapshot(far, received=accepted.through))

        def on_commit() -> None:
            ep.uncommitted_sends -= count
            self._trace_sent_runs(db, ep, seqs, messages)  # committed (R-TRACE-1)
            self.stats.sent_messages += count
            durable = far.durable
            for seq in seqs:
                durable.add_message(seq)
            if far.state in DELIVERING:
                self.delivery.delivered(db, far, queue, index, seqs, False)
            elif index is None or not index.arrived_ending(
                far.handle, far.group_id, seqs, Rank.IN_SEQUENCE
            ):  # ended meanwhile: its END removes the rows again (R-DLG-10)
                self.events.discarded(
                    far, seqs, "this side has ended the conversation", received=True
                )
            # else its END is committing: that END's outcome settles them
            self.events.closed(far)  # if these messages closed it (R-TRACE-1)
            for seq, (i, _, _) in zip(seqs, messages, strict=True):
                then(i, seq)

        def on_failure(exc: BaseException) -> None:
            sends_failed(ep, chain, first, exc, count)
            self.delivery.suspend_receiving(
                db
            )  # far.accepted claims the numbers: memory is reloaded
            for i, _, _ in messages:
                failed(i, exc)

        db.store.submit(
            statements, on_commit=on_commit, on_failure=on_failure, chains=(chain, far.receiving)
        )

    def _trace_sent(
        self, db: Database, ep: Endpoint, seqs: list[int], message_type: str, size: int
    ) -> None:
        """``message_sent`` of the messages numbered ``seqs``, of one type and size (their
        lines differ only in ``seq``), folded into a recent entry as the trace writer
        folds them."""
        self.trace.emit_each(
            "message_sent",
            ep.conversation_id,
            "seq",
            seqs,
            database=db.name,
            initiator=ep.initiator,
            size=size,
            message_type=message_type,
            service=ep.service,
            far_service=ep.far_service,
        )

    def _trace_sent_runs(
        self, db: Database, ep: Endpoint, seqs: list[int], messages: list[tuple[int, str, Body]]
    ) -> None:
        """``message_sent`` of each of ``messages``, numbered ``seqs``: one call per run of
        messages of one type and size."""
        if not self.trace.enabled:
            return
        for start, end in alike_runs([(t, len(body)) for _, t, body in messages]):
            _, message_type, body = messages[start]
            self._trace_sent(db, ep, seqs[start:end], message_type, len(body))

    def _trace_enqueued(self, db: Database, ep: Endpoint, messages: list[OutMessage]) -> None:
        """``enqueued`` of each of ``messages`` (committed): one call per run of messages of
        one size."""
        if not self.trace.enabled:
            return
        for start, end in alike_runs([msg.length for msg in messages]):
            first = messages[start]
            self.trace.emit_each(
                "enqueued",
                ep.conversation_id,
                "seq",
                [msg.seq for msg in messages[start:end]],
                database=db.name,
                initiator=ep.initiator,
                size=first.length,
                fragments=first.fragment_count,
            )

    def _new_message(
        self, seq: int, message_type: str, flags: int, body: Body, now: float
    ) -> OutMessage:
        return OutMessage(
            seq=seq,
            message_type=message_type,
            flags=flags,
            body=body,
            length=len(body),
            enqueued_at=now,
            fragment_count=fragment_count(len(body), self.fragment_size),
        )

    def enqueue_work(
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
    ) -> tuple[int, list[Statement], Callable[[], None], Callable[[BaseException], None]]:
        """A SEND's sequence number, rows, and what runs after its commit or failure (the
        job holding the rows extends the chain ``ep.numbering`` had before this call)."""
        chain = ep.numbering
        ep.send_sequence += 1
        seq = ep.send_sequence
        if ep.initiator:
            flags |= FLAG_INITIATOR
        msg = self._new_message(seq, message_type, flags, body, self.clock())
        ep.uncommitted_sends += 1
        ep.refresh_state()
        size = len(body)
        statements: list[Statement] = [
            *extra,
            queries.sent_message(ep.handle_text, seq, message_type, flags, body, msg.enqueued_at),
            endpoint_snapshot(ep, sent=seq),
        ]

        def committed() -> None:
            ep.uncommitted_sends -= 1
            # R-TRACE-1: traced once committed (a client transaction rolled back at its
            # COMMIT sends nothing, and its number is given back)
            self._trace_sent(db, ep, [seq], message_type, size)
            self._enqueued(db, ep, [msg])

        def failed(exc: BaseException) -> None:
            sends_failed(ep, chain, seq, exc)

        return seq, statements, committed, failed


def sends_failed(ep: Endpoint, chain: Token, seq: int, exc: BaseException, count: int = 1) -> None:
    """``count`` SENDs numbered from ``seq`` on, in one job, did not commit. If the store
    failed them (a :class:`StoreError`), their numbers and every later one of their
    generation, which the store refuses untried, are given back
    (:meth:`Endpoint.give_back`). If they never reached the store (a transaction whose
    later verb was refused at COMMIT), nothing in flight depends on them: their
    numbers are given back if they are still the last. The file never held them: an
    endpoint row counts only committed SENDs
    (:func:`~brokerd.dialogs.endpoints.endpoint.endpoint_snapshot`)."""
    ep.uncommitted_sends -= count
    if isinstance(exc, StoreError):
        ep.give_back(chain, seq)
    elif ep.send_sequence == seq + count - 1:
        ep.send_sequence = seq - 1
    ep.refresh_state(undo=True)
