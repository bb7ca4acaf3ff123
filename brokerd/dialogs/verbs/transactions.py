"""Client transactions: RECEIVE, GET CONVERSATION GROUP, SEND, BEGIN DIALOG, END
CONVERSATION, BEGIN CONVERSATION TIMER and MOVE CONVERSATION committed together or not
at all (SPEC §6).

A :class:`Transaction` belongs to one client connection and one database (its
SQLite file is the unit of atomicity; a second database is refused). Its verbs
are checked when they are called, so a refusal reaches the application at once,
but they take effect only at COMMIT, where their works
(:mod:`brokerd.dialogs.endpoints.work`) are concatenated into one store job:

* RECEIVE takes messages at once and holds their conversation group's lock
  (:class:`~brokerd.dialogs.endpoints.ready.Lease`) until COMMIT removes them or ROLLBACK
  puts them back, in front and in order. Other readers skip a locked group.
  GET CONVERSATION GROUP holds a group's lock the same way, with a lease of no
  message, so the transaction's RECEIVEs of that group find it theirs.
* SEND, BEGIN DIALOG, END CONVERSATION, the timer and MOVE are applied at COMMIT,
  in the order they were called; sequence numbers are assigned then, so a
  rolled-back SEND leaves no gap. No SEND waits for a disk write of its own:
  the COMMIT is the transaction's one durability point.
* A connection that closes, or a daemon that dies, before COMMIT leaves nothing
  behind: the leases are released (or, after a crash, never existed on disk).
* Every message a ROLLBACK puts back (an explicit one with its optional reason, a
  COMMIT that found a verb refused, a connection that closed) counts one rollback for
  poison-message handling (:mod:`brokerd.dialogs.verbs.poison`, SPEC §6).

The states and their transitions are the table :data:`TRANSITIONS`. What one
transaction holds in memory is bounded: :data:`MAX_VERBS` verbs, and SEND bodies
of at most :data:`SEND_BUDGET_MESSAGES` times the broker's ``max_message_size``;
a verb beyond either is refused with TransactionError (the transaction stays
open and may still commit what it holds).
"""

from __future__ import annotations

import asyncio
import enum
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from brokerd.dialogs.endpoints.commits import commit
from brokerd.dialogs.endpoints.directory import Directory
from brokerd.dialogs.endpoints.work import Work
from brokerd.dialogs.verbs.conversation import ConversationVerbs
from brokerd.dialogs.verbs.poison import PoisonVerbs
from brokerd.dialogs.verbs.receive import ReceiveVerbs, Withdrawal
from brokerd.dialogs.verbs.send import SendVerbs
from brokerd.errors import StoreError, TransactionError, TransactionRolledBack

if TYPE_CHECKING:
    from brokerd.dialogs.endpoints.database import Database, Lease
    from brokerd.dialogs.endpoints.endpoint import Endpoint
    from brokerd.storage.reads import Budget


MAX_VERBS = 10_000
"""Verbs (RECEIVE, SEND, ...) one transaction may hold until COMMIT."""
SEND_BUDGET_MESSAGES = 4
"""A transaction's SEND bodies may add up to this many maximum-size messages."""


class TxState(enum.Enum):
    ACTIVE = "active"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled back"


TRANSITIONS: dict[tuple[TxState, str], TxState] = {
    (TxState.ACTIVE, "commit"): TxState.COMMITTING,
    (TxState.ACTIVE, "rollback"): TxState.ROLLED_BACK,
    (TxState.COMMITTING, "committed"): TxState.COMMITTED,
    (TxState.COMMITTING, "failed"): TxState.ROLLED_BACK,
}
"""(state, event) -> next state; any other pair is refused with TransactionError."""


class Transaction:
    def __init__(
        self,
        directory: Directory,
        conversations: ConversationVerbs,
        sending: SendVerbs,
        receiving: ReceiveVerbs,
        poison: PoisonVerbs,
        tx_id: int,
    ) -> None:
        self.directory = directory
        self.conversations = conversations
        self.sending = sending
        self.receiving = receiving
        self.poison = poison
        self.id = tx_id
        self.state = TxState.ACTIVE
        self.db: Database | None = None
        self.image = 0
        """The database's :attr:`Database.image` when the transaction first touched it."""
        self.leases: list[Lease] = []
        self.message_types: dict[tuple[str, int], str] = {}
        """The type of each message received, by (handle text, number): what a
        quarantine names if this transaction's rollback makes one (SPEC §6)."""
        self.new_endpoints: dict[uuid.UUID, Endpoint] = {}
        self.steps: list[Callable[[], Work]] = []
        self.sequence_numbers: list[int] = []
        """The sequence numbers of the transaction's SENDs, set at COMMIT."""
        self.verbs = 0
        self.send_bytes = 0

    # -- states -------------------------------------------------------------------

    def _event(self, event: str) -> None:
        following = TRANSITIONS.get((self.state, event))
        if following is None:
            raise TransactionError(f"transaction {self.id} is {self.state.value}; cannot {event}")
        self.state = following

    def _require_active(self) -> None:
        if self.state is not TxState.ACTIVE:
            raise TransactionError(f"transaction {self.id} is {self.state.value}")
        if self.db is not None and self.db.image != self.image:
            raise TransactionError(self._stale())

    def _stale(self) -> str:
        """Why a transaction that outlived its database's image can do nothing more: its
        leases hold groups of the dropped image, not of the rebuilt one (R-ROUTE-16)."""
        assert self.db is not None
        return (
            f"transaction {self.id}: database {self.db.name!r} changed partner role since "
            "the transaction began (R-ROUTE-16): what it read and holds belongs to an image "
            "that is gone; roll it back"
        )

    def _admit(self, body_bytes: int = 0) -> None:
        """Count one more verb (and its SEND body) against the transaction's bounds."""
        self._require_active()
        if self.verbs >= MAX_VERBS:
            raise TransactionError(
                f"transaction {self.id} holds {MAX_VERBS} verbs, the most one may; commit it"
            )
        budget = SEND_BUDGET_MESSAGES * self.sending.max_message_size
        if self.send_bytes + body_bytes > budget:
            raise TransactionError(
                f"transaction {self.id}'s SENDs would hold {self.send_bytes + body_bytes} "
                f"bytes, over its budget of {budget}; commit it"
            )
        self.verbs += 1
        self.send_bytes += body_bytes

    def _bind(self, db: Database) -> None:
        if self.db is None:
            self.db = db
            self.image = db.image
        elif self.db is not db:
            raise TransactionError(
                f"transaction {self.id} works in database {self.db.name!r}; a transaction "
                f"cannot also touch {db.name!r} (each database is its own file)"
            )

    def _endpoint(self, handle: uuid.UUID) -> tuple[Database, Endpoint]:
        self._require_active()
        ep = self.new_endpoints.get(handle)
        if ep is not None:
            db = self.directory.databases[ep.database]
        else:
            db, ep = self.directory.endpoint(handle)
        self._bind(db)
        return db, ep

    # -- verbs ----------------------------------------------------------------------

    def begin_dialog(
        self,
        from_service: str,
        to_service: str,
        contract: str,
        database: str | None = None,
        to_broker_instance: uuid.UUID | None = None,
        lifetime: int = 0,
        related_conversation: uuid.UUID | None = None,
        related_group: uuid.UUID | None = None,
    ) -> Endpoint:
        """BEGIN DIALOG: the handle may be used in this transaction at once; the
        endpoint exists for everyone else from COMMIT on."""
        self._require_active()
        db, ep = self.conversations.new_dialog(
            from_service,
            to_service,
            contract,
            database,
            to_broker_instance,
            lifetime,
            related_conversation,
            related_group,
        )
        self._bind(db)
        self._admit()
        self.new_endpoints[ep.handle] = ep
        self.steps.append(lambda: self.conversations.begin_dialog_work(db, ep))
        return ep

    def send(self, handle: uuid.UUID, message_type: str, body: bytes) -> None:
        db, ep = self._endpoint(handle)
        self.sending.check_send(db, ep, message_type, body)
        self._admit(len(body))

        def step() -> Work:
            seq, work = self.sending.send_work(db, ep, message_type, body)
            self.sequence_numbers.append(seq)
            return work

        self.steps.append(step)

    def end_conversation(
        self,
        handle: uuid.UUID,
        error_code: int | None = None,
        description: str = "",
        cleanup: bool = False,
    ) -> None:
        db, ep = self._endpoint(handle)
        self.conversations.check_end(error_code, cleanup)
        self._admit()
        self.steps.append(
            lambda: self.conversations.end_conversation_work(
                db, ep, error_code, description, cleanup
            )
        )

    def begin_conversation_timer(self, handle: uuid.UUID, timeout: float) -> None:
        db, ep = self._endpoint(handle)
        self.conversations.check_timer(ep, timeout)
        self._admit()
        self.steps.append(lambda: self.conversations.timer_work(db, ep, timeout))

    def move_conversation(self, handle: uuid.UUID, group: uuid.UUID) -> None:
        db, ep = self._endpoint(handle)
        self.conversations.check_move(db, ep, group, self._owned())
        self._admit()
        self.steps.append(
            lambda: self.conversations.move_conversation_work(db, ep, group, self._owned())
        )

    def _owned(self) -> set[uuid.UUID]:
        """The conversation groups this transaction's RECEIVEs hold."""
        return {lease.group for lease in self.leases}

    async def receive(
        self,
        queue: str,
        database: str | None = None,
        top: int = 1,
        timeout: float = 0.0,
        handle: uuid.UUID | None = None,
        budget: Budget | None = None,
        group: uuid.UUID | None = None,
        groups: int = 1,
        withdrawal: Withdrawal | None = None,
    ) -> list[dict[str, Any]]:
        """RECEIVE inside the transaction: the group stays locked until COMMIT or ROLLBACK
        (with ``groups``, each of the up to that many groups it returns, SPEC §6).

        ``handle`` or ``group`` limits it to one conversation or conversation group (a
        group another transaction holds is waited for, per ``timeout``, never taken).
        ``budget`` cuts the batch to what the caller's reply can carry: COMMIT removes
        exactly the messages returned, and the others are receivable again at once."""
        self._admit()
        leases = await self.receiving.take_ready(
            queue,
            self._database(database),
            top,
            timeout,
            handle,
            self._owned(),
            group,
            groups,
            withdrawal,
        )
        if not leases:
            return []
        try:
            for lease in leases:
                self._hold(lease)
        except TransactionError:
            self.receiving.release_all(leases)
            raise
        rows = await self.receiving.read_leased(leases, budget)
        if self.state is not TxState.ACTIVE:  # rolled back while the rows were read
            self.receiving.release_all(leases)
            raise TransactionError(f"transaction {self.id} is {self.state.value}")
        for lease in leases:
            if not lease.items:  # a group the reply's limit left out: not returned, not held
                self.receiving.release(lease, received=False)
        self.leases.extend(lease for lease in leases if lease.items)
        types = self.message_types
        for row in rows:
            types[row["conversation_handle"], row["message_sequence_number"]] = row[
                "message_type_name"
            ]
        return rows

    async def get_conversation_group(
        self,
        queue: str,
        database: str | None = None,
        timeout: float = 0.0,
        withdrawal: Withdrawal | None = None,
    ) -> uuid.UUID | None:
        """GET CONVERSATION GROUP (SPEC §6): the next conversation group of ``queue`` with
        messages ready that no other transaction holds, locked until COMMIT or ROLLBACK
        (which receive nothing of it by themselves). Waits up to ``timeout`` s (negative:
        forever, or until ``withdrawal`` takes the request back); None when none came."""
        self._admit()
        lease = await self.receiving.hold_group(
            queue, self._database(database), timeout, self._owned(), withdrawal
        )
        if lease is None:
            return None
        self._hold(lease)
        self.leases.append(lease)
        return lease.group

    def _database(self, database: str | None) -> str | None:
        """The database a RECEIVE or GET CONVERSATION GROUP looks in: the one named, or the
        transaction's own once it has one."""
        if database is None and self.db is not None:
            return self.db.name
        return database

    def _hold(self, lease: Lease) -> None:
        """Keep a lease just taken, or give it back if the transaction cannot (it finished
        or changed image while the lease was awaited, or works in another database)."""
        try:
            self._require_active()
            self._bind(lease.db)
        except TransactionError:
            self.receiving.release(lease, received=False)
            raise

    # -- the end ------------------------------------------------------------------------

    async def commit(self) -> list[int]:
        """Apply every verb and remove every received message in one SQLite transaction.

        Raises TransactionRolledBack (nothing took effect, the received messages are
        back in their queue) when a verb is refused now or the commit fails.
        """
        self._event("commit")
        db = self.db
        work = Work()
        try:
            if db is not None and db.image != self.image:
                raise TransactionError(self._stale())
            for step in self.steps:
                work.extend(step())
        except Exception as exc:
            work.failed(exc)
            counted = self._put_back(f"{type(exc).__name__}: {exc}")
            self.state = TxState.ROLLED_BACK
            if counted:  # SPEC §6: the rollback's counts are written before it is answered
                await asyncio.gather(*counted, return_exceptions=True)
            raise TransactionRolledBack(
                f"transaction {self.id} rolled back: {type(exc).__name__}: {exc}"
            ) from exc
        for lease in self.leases:
            work.extend(self.receiving.receive_work(lease))
            work.extend(self.poison.received_work(lease))
        if db is None:
            self._event("committed")
            return []
        try:
            await commit(db, work)
        except StoreError as exc:
            self._event("failed")
            raise TransactionRolledBack(f"transaction {self.id} rolled back: {exc}") from exc
        self._event("committed")
        return self.sequence_numbers

    def rollback(self, reason: str = "") -> list[asyncio.Future[Any]]:
        """Undo: received messages go back, in order; nothing else happened yet. Each
        counts one rollback, with ``reason`` (SPEC §6); the futures returned are done
        once the counts are written.

        A transaction already committing is left to finish (its outcome is decided
        by the store); a finished one is left as it is.
        """
        if self.state is not TxState.ACTIVE:
            return []
        self._event("rollback")
        return self._put_back(reason)

    def _put_back(self, reason: str) -> list[asyncio.Future[Any]]:
        self.receiving.release_all(self.leases)
        if self.receiving.stop_begun or not self.leases:
            return []  # a daemon stopping gracefully: not the messages' fault
        return self.poison.rolled_back(self.leases, reason, self.message_types)
