"""Conversation endpoints and their transmission objects (SPEC §5, R-DLG-9..11, R-DLG-13).

An :class:`Endpoint` is one side of a dialog in one database: its identity,
its state (``SO SI CO DI DO ER CD``), the messages it has sent and not yet had
acknowledged (:class:`OutMessage`, the in-memory image of its transmission
queue rows; after a restart most of them are only numbers in its
:class:`~brokerd.dialogs.endpoints.backlog.Backlog` until paged in), and the two
acknowledgement states of what it received (accepted, and durable). The state
rules are data, in :mod:`brokerd.dialogs.endpoints.states`.
Rows are written as whole snapshots (:func:`endpoint_snapshot`), always inside
the same transaction as the message that changed them.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from brokerd.dialogs.endpoints.backlog import Backlog
from brokerd.dialogs.endpoints.states import State, check, state_of
from brokerd.storage import queries
from brokerd.storage.chains import Token
from brokerd.storage.queries import ENDPOINT_DELETE, ENDPOINT_SNAPSHOT
from brokerd.storage.schema import Statement
from protocol.acks import AckState
from protocol.buffers import Body
from protocol.dialog_security import DialogKeys

if TYPE_CHECKING:
    from brokerd.routing.rules import Decision


@dataclass(slots=True, eq=False)
class OutMessage:
    """A sequenced message sent and not yet acknowledged (a transmission queue row)."""

    seq: int
    message_type: str
    flags: int
    body: Body | None
    """In memory while held or about to be written; None: read back when sent
    (:mod:`brokerd.dialogs.transmission.bodies`)."""
    length: int
    enqueued_at: float
    fragment_count: int
    acked_fragments: set[int] | frozenset[int] = frozenset()
    """Fragments the peer acknowledged (of a message of several): a set of its own once
    there is one, the shared empty one until then (most messages are one fragment)."""
    attempts: int = 0
    due: float = 0.0
    """Loop time of the next (re)transmission; 0 = as soon as a link is open; ``inf``
    while it waits in a connection's outbox (the retry clock starts when it is written)."""
    sent_via: str = ""
    """The connection it was last handed to; empty while it waits for one (the
    endpoint's ``waiting_status`` then says why)."""
    retry_wait: float = 0.0
    """Seconds until it is sent again if no acknowledgement comes."""
    last_sent_at: float = 0.0
    """Loop time its last fragment was written to the connection."""
    held: bool = False
    """Its body stays in memory until acknowledged (within ``limits.held_bodies_mb``)."""
    in_transit: bool = False
    """Its body is in memory only until the connection writes it."""
    read_ahead: bool = False
    """Its body came with its page of a backlog and waits for a link to take it
    (:meth:`~brokerd.dialogs.transmission.bodies.Bodies.prefetched`)."""
    window: object | None = None
    """The send window that counts it (handed over, not yet acknowledged): the window
    itself, not its link's name, since a link's next connection has a window of its own
    (:class:`~brokerd.dialogs.transmission.window.SendWindow`)."""
    unanswered: int = 0
    """Retransmissions since its link last acknowledged anything (``answer_epoch``)."""
    answer_epoch: int = 0
    paged: bool = False
    """Paged in from its endpoint's backlog (counted against ``Transmission.paged_limit``)."""


KeyWaiter = tuple[Callable[[int, int], None], Callable[[int, BaseException], None], int]
"""A SEND retried while the first one with its key commits: its ``then`` and ``failed``
(a sequence number or the error, for request ``i``) and its ``i``."""


@dataclass(slots=True, eq=False)
class Endpoint:
    handle: uuid.UUID
    conversation_id: uuid.UUID
    initiator: bool
    group_id: uuid.UUID
    database: str
    service: str
    far_service: str
    far_broker_instance: uuid.UUID | None
    contract: str
    state: State
    lifetime: int
    created_at: float
    far_peer: str = ""
    """Who may speak for the far side (``brokerd.dialogs.endpoints.binding``, R-DLG-14):
    ``peer:NAME``, ``forwarded`` or ``local``; empty until the far side first answers."""
    keys: DialogKeys | None = None
    """Dialog security (R-DLG-14): the dialog key, persisted with the endpoint; None =
    the dialog is not secured."""
    key_confirmed: bool = False
    """The far side has answered under the dialog key: the initiator stops sending the key
    exchange (in memory; after a restart it is sent again until the next answer)."""
    key_exchange: bytes = b""
    """The initiator's key exchange, made when first sent in this process, and again once
    it is older than half the time a target keeps a closed endpoint."""
    key_exchange_at: float = 0.0
    """When ``key_exchange`` was made (wall-clock seconds; the exchange carries it)."""
    send_sequence: int = 0
    send_generation: int = field(default_factory=time.monotonic_ns)
    """The generation SENDs are numbered in: a SEND that fails to commit ends it, and the
    numbers after the last stored one are given again in the next (:meth:`give_back`).
    It starts at the clock's nanoseconds, above every generation an earlier object of
    the same endpoint had (one rebuilt after a mirror's role changed, say), whose broken
    chains the store may still remember."""
    receive_generation: int = field(default_factory=time.monotonic_ns)
    """The generation of the jobs that store what this endpoint receives: a failed one
    takes down those after it (:attr:`receiving`); a reload of what the database received
    from its file starts a new one."""
    send_rewound: tuple[int, int] | None = None
    """``(generation, number)``: the generation a failed SEND ended, and the number the
    numbering went back to, while no SEND has been numbered since."""
    ended_local: bool = False
    ended_remote: bool = False
    broker_error: bool = False
    """The other side's broker refused the dialog (an unsequenced error arrived)."""
    error_received: bool = False
    """The other side ended the dialog with an error (a sequenced Error message)."""
    held_end_flags: dict[int, int] = field(default_factory=dict)
    """End/error flags of messages accepted out of order, applied when they are released."""
    accepted: AckState = field(default_factory=AckState)
    validating: set[int] = field(default_factory=set)
    """Messages whose last fragment waits while the whole body is validated (R-OBJ-1)."""
    sent_keys: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Idempotency keys of this side's committed SENDs: key -> (sequence number, when it
    was committed), for ``limits.send_key_window``."""
    keys_in_flight: dict[str, list[KeyWaiter]] = field(default_factory=dict)
    """Keys of SENDs numbered and not yet committed, with the retries of the same key
    that wait for their outcome."""
    durable: AckState = field(default_factory=AckState)
    outbox: dict[int, OutMessage] = field(default_factory=dict)
    """The unacknowledged messages in memory, in sequence order."""
    backlog: Backlog = field(default_factory=Backlog)
    """Unacknowledged messages only in the file (after a restart), all numbered above the
    outbox's: paged in as the link has room (:mod:`brokerd.dialogs.endpoints.backlog`)."""
    ack_version: int = 0
    ack_sent_version: int = 0
    last_link: Any = None
    route: Decision | None = None
    route_link: Any = None
    route_expires: float = 0.0
    """Wall-clock time until which ``route_link`` may be reused (a route lifetime, R-OBJ-5)."""
    broker_errors: int = 0
    uncommitted_sends: int = 0
    """Messages queued by SEND whose transaction has not committed yet."""
    dropped_before: int = 0
    """The number of this side's END WITH ERROR while it is in memory: a SEND numbered
    below it that commits with it or before it (of its transaction, or in flight then)
    is dropped with the messages waiting to be sent, not sent (R-DLG-10); 0 = none."""
    timer_due: float = 0.0
    """Wall-clock time the conversation timer fires (R-DLG-11); 0 = no timer."""
    wakeup: float = 0.0
    """Loop time the engine will next look at this endpoint's outbox; 0 = not scheduled."""
    bodies_waiting: int = 0
    """Messages of this endpoint waiting for their bodies to be read back (in order)."""
    waiting_status: str = "waiting to be sent"
    """Why its messages not handed to a connection wait (no route, DELAYED, the
    connection's status), for the transmission_queue view. Kept per endpoint, so a
    SEND behind a backlog touches none of the messages already waiting."""
    handle_text: str = field(init=False)
    """``str(handle)``, the key of the endpoint's rows, made once."""
    conversation_text: str = field(init=False)
    _group_text: tuple[uuid.UUID, str] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.handle_text = str(self.handle)
        self.conversation_text = str(self.conversation_id)

    @property
    def group_text(self) -> str:
        """``str(group_id)``, made once per group."""
        cached = self._group_text
        if cached is None or cached[0] is not self.group_id:
            cached = self._group_text = (self.group_id, str(self.group_id))
        return cached[1]

    @property
    def unacknowledged(self) -> int:
        """Messages sent and not yet acknowledged, in memory or only in the file."""
        return len(self.outbox) + self.backlog.count

    @property
    def has_unacknowledged(self) -> bool:
        return bool(self.outbox) or self.backlog.count > 0

    @property
    def lifetime_ends(self) -> float:
        """Wall-clock time the dialog's lifetime passes (R-DLG-9); 0 = no lifetime."""
        return self.created_at + self.lifetime if self.lifetime > 0 else 0.0

    def lifetime_left(self, now: float) -> int:
        """Whole seconds of the lifetime left at ``now``, rounded up, as a message header
        carries it (R-DLG-9); 0 = no lifetime. At least 1 while the dialog has one."""
        if self.lifetime <= 0:
            return 0
        return max(1, math.ceil(self.lifetime_ends - now))

    @property
    def key(self) -> tuple[uuid.UUID, bool]:
        return (self.conversation_id, self.initiator)

    def may_send(self) -> str | None:
        """Why this endpoint cannot SEND now, or None."""
        if self.state is State.CLOSED:
            return "the conversation is closed"
        if self.ended_local:
            return "this side has ended the conversation"
        if self.state is State.ERROR:
            return "the conversation is in error; end it"
        if self.ended_remote:
            return "the other side has ended the conversation (state DI); end it"
        return None

    @property
    def numbering(self) -> Token:
        """The chain a SEND numbered now extends (:mod:`brokerd.storage.chains`)."""
        return (self.handle, self.send_generation)

    @property
    def receiving(self) -> Token:
        """The chain a job storing a message this endpoint received extends: the endpoint's
        receive sequence in that job counts every message accepted before it, so it must
        not commit after one of them failed to."""
        return ((self.handle, "received"), self.receive_generation)

    def give_back(self, chain: Token, seq: int) -> None:
        """The SEND numbered ``seq`` in ``chain`` failed to commit (R-DLG-1): the numbering
        goes back to the number before it, in a new generation.

        Every SEND numbered after it in the same generation is refused untried by the
        store (:mod:`brokerd.storage.chains`), so ``seq - 1`` is the last number stored,
        whatever order their failures are told in: failures of separate commits come
        first-first (the later ones change nothing), and the SENDs of one transaction
        are undone last-first (each moves the numbering one further back, as long as
        nothing was numbered meanwhile)."""
        generation = chain[1]
        if generation == self.send_generation:
            self.send_generation = max(generation + 1, time.monotonic_ns())
        elif self.send_rewound != (generation, seq) or self.send_sequence != seq:
            return
        self.send_sequence = seq - 1
        self.send_rewound = (generation, seq - 1)

    def refresh_state(self, undo: bool = False) -> bool:
        """Move to the state the dialog's facts call for (``states.Facts``, passed as
        arguments: no tuple on the hot path); True if it changed (SPEC §5).

        ``undo`` is for a unit of work that failed to commit: its memory effects are
        reversed, so the state may go back to what it was before it. Otherwise a closed
        endpoint stays closed (ended WITH CLEANUP while its removal commits, say).
        """
        if self.state is State.CLOSED and not undo:
            return False
        new = state_of(
            self.initiator,
            self.send_sequence > 0,
            self.accepted.through > 0,
            self.ended_local,
            self.ended_remote,
            self.error_received,
            self.broker_error,
            not self.outbox and not self.backlog and not self.uncommitted_sends,
        )
        if new is self.state:
            return False
        self.state = new if undo else check(self.state, new)
        return True

    def mark_ack_needed(self) -> None:
        self.ack_version += 1

    # -- idempotency keys of SENDs ---------------------------------------------------------

    def answer_by_key(
        self,
        key: str,
        i: int,
        then: Callable[[int, int], None],
        failed: Callable[[int, BaseException], None],
    ) -> bool:
        """A SEND (request ``i``) whose idempotency key this endpoint knows is not sent
        again: ``then`` gets the number the first SEND with that key was committed with,
        or, while that one commits, its outcome (``then`` or ``failed``). False if the
        key is new."""
        known = self.sent_keys.get(key)
        if known is not None:
            then(i, known[0])
            return True
        waiting = self.keys_in_flight.get(key)
        if waiting is not None:
            waiting.append((then, failed, i))
            return True
        return False

    def key_committed(self, key: str, seq: int, now: float) -> None:
        """The SEND with ``key`` committed as ``seq``: the key is known from now on, and the
        retries that waited for it get the same number."""
        self.sent_keys[key] = (seq, now)
        for then, _, i in self.keys_in_flight.pop(key, ()):
            then(i, seq)

    def key_failed(self, key: str, exc: BaseException) -> None:
        """The SEND with ``key`` did not commit: the retries that waited for it fail as it
        did, and the key is new again."""
        for _, failed, i in self.keys_in_flight.pop(key, ()):
            failed(i, exc)


@lru_cache(maxsize=1024)
def _text(instance: uuid.UUID) -> str:
    return str(instance)


def _remote_bits(ep: Endpoint) -> int:
    return int(ep.ended_remote) | (2 if ep.broker_error else 0) | (4 if ep.error_received else 0)


def endpoint_snapshot(
    ep: Endpoint, sent: int | None = None, received: int | None = None
) -> Statement:
    """The endpoint's whole row, written with the job that changed it (deduplicated per
    batch). Its send sequence counts only the SENDs already committed, or is ``sent``, the
    number of the SEND whose job this is; its receive sequence only what was received
    and committed, or is ``received``, in the job that stores a message this endpoint
    received (``ep.accepted.through`` then): a number is in the file only with its
    message (``queries.ENDPOINT_SNAPSHOT``)."""
    return (
        ENDPOINT_SNAPSHOT,
        (
            ep.handle_text,
            ep.conversation_text,
            int(ep.initiator),
            ep.group_text,
            ep.service,
            ep.far_service,
            _text(ep.far_broker_instance) if ep.far_broker_instance else None,
            ep.contract,
            ep.state.value,
            ep.lifetime,
            ep.created_at,
            ep.send_sequence - ep.uncommitted_sends if sent is None else sent,
            ep.durable.through if received is None else received,
            int(ep.ended_local),
            _remote_bits(ep),
            ep.far_peer or None,
            ep.keys.key if ep.keys is not None else None,
        ),
    )


def endpoint_deletion(ep: Endpoint) -> Statement:
    return (ENDPOINT_DELETE, (ep.handle_text,))


def queue_row(
    ep: Endpoint,
    queue: str,
    seq: int,
    status: int,
    message_type: str,
    length: int,
    body: Body | None,
    now: float,
) -> Statement:
    """A message's row in ``ep``'s service queue, received by ``ep`` (``body`` None while
    its fragments arrive)."""
    return queries.queued_message(
        queue,
        ep.group_text,
        ep.handle_text,
        seq,
        status,
        ep.service,
        ep.contract,
        message_type,
        length,
        body,
        now,
    )


def unqueue_sent(
    ep: Endpoint,
    seqs: Iterable[int],
    through: int = 0,
    runs: Iterable[tuple[int, int]] = (),
) -> list[Statement]:
    """Delete messages ``ep`` sent from the transmission queue (acknowledged, or dropped by
    an error): ``seqs``, every number up to ``through``, and the runs ``first..last`` (of
    a backlog)."""
    return queries.unqueue_sent(ep.handle_text, seqs, through, runs)


def endpoint_from_row(row: Any, database: str) -> Endpoint:
    ended_remote = int(row["ended_remote"])
    ep = Endpoint(
        handle=uuid.UUID(row["conversation_handle"]),
        conversation_id=uuid.UUID(row["conversation_id"]),
        initiator=bool(row["is_initiator"]),
        group_id=uuid.UUID(row["conversation_group_id"]),
        database=database,
        service=row["service_name"],
        far_service=row["far_service"],
        far_broker_instance=(
            uuid.UUID(row["far_broker_instance"]) if row["far_broker_instance"] else None
        ),
        contract=row["contract"],
        state=State(row["state"]),
        lifetime=int(row["lifetime"]),
        created_at=float(row["created_at"]),
        far_peer=row["far_peer"] or "",
        keys=DialogKeys(bytes(row["dialog_key"])) if row["dialog_key"] else None,
        send_sequence=int(row["send_sequence"]),
        ended_local=bool(row["ended_local"]),
        ended_remote=bool(ended_remote & 1),
        broker_error=bool(ended_remote & 2),
        error_received=bool(ended_remote & 4),
    )
    ep.accepted.through = ep.durable.through = int(row["receive_sequence"])
    return ep
