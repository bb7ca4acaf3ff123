"""What arrives from links: fragments and broker errors (SPEC §4, R-DLG-2..8).

A fragment is routed (or forwarded, or dropped), checked against the target's
contract and validation, deduplicated (R-DLG-4), stored in order or held
(status 2) until the messages before it arrive (R-DLG-7), reassembled from its
fragments, and acknowledged only after the commit that made it durable
(R-DLG-5). A message of several fragments whose validation needs its whole body
(``well_formed_xml``, R-OBJ-1) is validated when its last fragment arrives,
before that fragment is stored or acknowledged. A refused message is answered with
an unsequenced broker Error; a broker Error that arrives ends the dialog on this side
(:class:`~brokerd.dialogs.arrivals.delivery.Delivery`).

Before any of that, what arrives passes
:class:`~brokerd.dialogs.arrivals.admission.Admission` (binding and dialog security,
R-DLG-14), and the acknowledgement it carries is applied
(:class:`~brokerd.dialogs.arrivals.acknowledgements.Acknowledgements`); a fragment of a
message of several passes
:class:`~brokerd.dialogs.arrivals.fragment_checks.FragmentChecks` (one cut of at least
the least fragment size, one length, at most ``limits.partial_messages`` partial
messages held) before it is stored.

May import: ``brokerd.dialogs.router``, ``brokerd.dialogs.transmission``,
``brokerd.dialogs.endpoints``, the other parts of ``brokerd.dialogs.arrivals`` below it
and what they may import.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import Any

from brokerd.dialogs.arrivals.acknowledgements import Acknowledgements
from brokerd.dialogs.arrivals.admission import Admission
from brokerd.dialogs.arrivals.delivery import Delivery
from brokerd.dialogs.arrivals.fragment_checks import FragmentChecks
from brokerd.dialogs.arrivals.in_order import InOrderRun
from brokerd.dialogs.endpoints import binding
from brokerd.dialogs.endpoints.broker_errors import (
    CODE_CONTRACT_NOT_SUPPORTED,
    CODE_SERVICE_NOT_FOUND,
    CODE_VALIDATION_FAILED,
)
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.deadlines import Deadlines
from brokerd.dialogs.endpoints.directory import Directory
from brokerd.dialogs.endpoints.endpoint import Endpoint, endpoint_snapshot, queue_row
from brokerd.dialogs.endpoints.events import DialogEvents
from brokerd.dialogs.endpoints.ready import Rank
from brokerd.dialogs.endpoints.runs import alike_runs
from brokerd.dialogs.endpoints.states import DELIVERING, State
from brokerd.dialogs.endpoints.stats import EngineStats
from brokerd.dialogs.router.router import Router
from brokerd.dialogs.transmission.links import Link
from brokerd.dialogs.transmission.transmission import Transmission
from brokerd.storage import queries, reads
from brokerd.storage.catalog import ROUTE_REQUESTER_SERVICE
from brokerd.storage.keys import new_handle, random_id
from brokerd.storage.schema import Statement
from brokerd.traces.writer import TraceWriter
from protocol.acks import UNKNOWN_COUNT
from protocol.buffers import Body
from protocol.dialog import FLAG_END_DIALOG, FLAG_ERROR, DialogHeader
from protocol.fragments import cut_size

ARRIVAL_WEIGHT = 2048
"""What a fragment's arrival weighs in the inbound backlog besides its bytes: its rows,
index entries and share of a commit cost as much as about 2 KiB of body, so thousands of
small messages count as a backlog too."""

log = logging.getLogger("brokerd.dialogs.receiving")
_END_COMMITTING = "this side's END CONVERSATION is committing; the sender resends it"
_RECEIVED = "received"
"""The key that joins the store jobs of received messages (``Store.submit_joined``)."""


class Arrivals:
    """Fragments from links, made durable and ready to RECEIVE, then acknowledged."""

    def __init__(
        self,
        directory: Directory,
        admission: Admission,
        acks: Acknowledgements,
        delivery: Delivery,
        checks: FragmentChecks,
        events: DialogEvents,
        transmission: Transmission,
        router: Router,
        deadlines: Deadlines,
        trace: TraceWriter,
        stats: EngineStats,
        clock: Callable[[], float],
    ) -> None:
        self.directory = directory
        self.admission = admission
        self.acks = acks
        self.delivery = delivery
        self.checks = checks
        self.events = events
        self.transmission = transmission
        self.router = router
        self.deadlines = deadlines
        self.trace = trace
        self.stats = stats
        self.clock = clock
        self.last_run: InOrderRun | None = None
        """The last run of in-order messages submitted (joined while its job is the last)."""

    def on_fragment(
        self,
        link: Link,
        header: DialogHeader,
        body: bytes,
        db: Database | None = None,
        payload: bytes | None = None,
    ) -> None:
        """One fragment arrived (already integrity-checked by the protocol layer).

        ``db`` is the target database when the sender is in this instance (its own
        routing chose it); a message from outside is routed here (R-ROUTE-1, R-ROUTE-2),
        and relayed or dropped if it is not for this instance. ``payload`` is the
        FRAGMENT payload it came in, which a forwarder relays as it is, but for the hop
        count.
        """
        self.stats.fragments_received += 1
        if self.trace.enabled:
            self.trace.emit_grouped(
                "fragment_received",
                header.conversation_id,
                "seq",
                header.sequence_number,
                initiator=header.initiator,
                fragment=header.fragment_index,
                fragments=header.fragment_count,
                size=len(body),
                hop=header.hop_count or None,
                peer=link.name,
            )
        if db is None:
            db = self.router.inbound(header, body, payload)
            if db is None:
                return
        if db.mirror_role == "mirror":
            self.events.drop(
                header, db.fenced_reason() + "; the sender retries toward the principal"
            )
            self.router.tell_mirror(link, db, header)
            return
        if db.mirror_in_doubt:
            # R-ROUTE-16: not even a duplicate's acknowledgement may reveal the file's
            # unconfirmed tail; the sender retries.
            return self.events.drop(header, db.in_doubt_reason())
        if db.rx_suspended:
            return self.events.drop(
                header, f"database {db.name!r} is recovering from a store error"
            )
        ep = db.by_key.get((header.conversation_id, not header.initiator))
        if ep is None:
            if not self.admission.may_begin(link, db, header):
                return
            created = self._new_target_endpoint(db, link, header, body)
            if created is None:
                return
            ep, body = created
            checked = True
        else:
            what = "error" if header.flags & FLAG_ERROR else "message"
            if self.admission.refused(link, ep, header, what):
                return
            if ep.keys is not None or header.security is not None:
                opened = self.admission.opened(ep, header, body, what)
                if opened is None:
                    return
                body = opened
            checked = False
        ep.last_link = link
        self.router.bind_far_instance(ep, header.from_broker_instance)  # R-ROUTE-3
        if header.ack.through or header.ack.ranges or header.ack.fragments:
            self.acks.apply(ep, header.ack, header.from_broker_instance, link.identity, header)
        elif not ep.far_peer:
            binding.bind(ep, header, link.identity, db.catalog.routes.values())
        if not header.sequenced:
            if header.flags & FLAG_ERROR:
                self._on_broker_error(db, ep, header, body)
            return
        seq = header.sequence_number
        if not checked and (
            self.checks.cut_wrongly(header, body) or self.checks.length_differs(ep, header)
        ):
            return
        if seq in ep.accepted.fragments and ep.accepted.cut_differently(
            seq,
            header.fragment_count,
            cut_size(header.fragment_index, header.fragment_offset, len(body)),
        ):
            self._drop_other_cut(db, ep, header)
        if ep.accepted.has_fragment(seq, header.fragment_index):
            self.stats.duplicates += 1
            self.trace.emit(
                "duplicate",
                ep.conversation_id,
                database=db.name,
                initiator=header.initiator,
                seq=seq,
                fragment=header.fragment_index,
                peer=link.name,
            )
            self.transmission.ack_needed(ep)  # R-DLG-4: acknowledged again, not enqueued again
            if ep.state is State.CLOSED:
                self.events.closing.touched(ep)  # its sender has no acknowledgement yet
            return
        if ep.state is State.CLOSED or ep.broker_error:
            return self.events.drop(header, f"conversation is {ep.state.value}")
        if self._end_committing(db, ep):
            return self.events.drop(header, _END_COMMITTING)
        if not checked and self.checks.too_many_partial(db, ep, header):
            return
        refusal = None if checked else self.admission.refusal(db, ep.contract, header, body)
        if refusal is not None:
            code, text = refusal
            self.admission.send_broker_error(link, db, header, code, text, ep)
            return
        if header.fragment_count == 1:
            self._accept_message(db, ep, seq, header.flags, header.message_type, body)
        elif self._completes_whole_check(db, ep, header):
            self._validate_whole(link, db, ep, header, body)
        else:
            self._accept_fragment(db, ep, header, body)

    @staticmethod
    def _end_committing(db: Database, ep: Endpoint) -> bool:
        """This side's END CONVERSATION of ``ep`` is applied and its commit not done. What
        arrives now is neither stored nor acknowledged (the sender resends it): taken
        in, it would be stored as discarded by this side's end and acknowledged, and
        lost if that END then fails to commit and the conversation goes on (R-DLG-1,
        R-DLG-5, R-DLG-10). Once the END's outcome is known, a copy is discarded and
        acknowledged (it committed) or received (it failed)."""
        if not ep.ended_local:
            return False
        queue = db.queue_of(ep.service)
        index = db.ready.get(queue) if queue else None
        return index is not None and index.end_committing(ep.handle)

    def _drop_other_cut(self, db: Database, ep: Endpoint, header: DialogHeader) -> None:
        """R-DLG-7: the fragments held of this message were cut at another size than the
        one arriving (its sender restarted with another ``limits.fragment_size``, or a
        mirror configured with another took over, and cut it again). Joined with the new
        ones they would not make the message, and by index the new ones would pass for
        duplicates of them. They go, from memory and from the file with the message's
        held row (a message now arriving whole would find that row and be lost), and
        acknowledgements stop claiming them; the message is taken as it is cut now.
        Nothing is lost: the sender keeps the message until it is acknowledged whole,
        and takes each acknowledgement's fragments as the receiver's whole answer
        (``fragment_acks.held_fragments``). The removal is a job with a function, which
        the store orders after the jobs before it and before those after it
        (``batch_sql.apply_batch``)."""
        seq = header.sequence_number
        held = len(ep.accepted.fragments.get(seq, ()))
        ep.accepted.drop_partial(seq)
        ep.durable.drop_partial(seq)
        self.stats.recut_messages += 1
        self.trace.emit(
            "cut_again",
            ep.conversation_id,
            database=db.name,
            initiator=ep.initiator,
            seq=seq,
            fragments=header.fragment_count,
            dropped=held,
        )
        self.events.note_drop(
            f"dropped the {held} fragments held of message {seq} of conversation "
            f"{ep.conversation_id}: it arrives cut at another size, into "
            f"{header.fragment_count} (R-DLG-7)"
        )

        def failed(exc: BaseException) -> None:
            log.error("store error while dropping fragments in %s: %s", db.name, exc)
            self.delivery.suspend_receiving(db)

        db.store.submit(
            queries.received([(ep.handle, seq)], False),
            fn=_ordered,
            on_failure=failed,
            chains=(ep.receiving,),
        )

    def _completes_whole_check(self, db: Database, ep: Endpoint, header: DialogHeader) -> bool:
        """This fragment completes a message whose validation needs the whole body."""
        if not db.catalog.needs_whole_body(header.message_type):
            return False
        held = ep.accepted.fragments_of(header.sequence_number)
        held.add(header.fragment_index)
        return len(held) >= header.fragment_count

    def _validate_whole(
        self, link: Link, db: Database, ep: Endpoint, header: DialogHeader, body: bytes
    ) -> None:
        """R-OBJ-1 for a message of several fragments: join the stored fragments and this
        last one in the store's thread and validate the whole; then accept the fragment,
        or refuse the message with a broker error (not acknowledged, like a refused
        single fragment, so a lost error is produced again on retransmission)."""
        seq = header.sequence_number
        if seq in ep.validating:
            return  # a retransmission while the body is checked: the sender sends it again
        ep.validating.add(seq)
        held = ep.accepted.fragments.get(seq)
        h, catalog, message_type = ep.handle_text, db.catalog, header.message_type
        problem: list[str | None] = [None]

        def check(conn: sqlite3.Connection) -> None:
            fragments = reads.read_fragments(conn, h, seq, db.store.bodies)
            fragments[header.fragment_index] = body
            problem[0] = catalog.validation_problem(message_type, queries.joined(fragments))

        def checked() -> None:
            ep.validating.discard(seq)
            if ep.state is State.CLOSED or ep.broker_error:
                self.events.drop(header, f"conversation is {ep.state.value}")
            elif self._end_committing(db, ep):
                self.events.drop(header, _END_COMMITTING)
            elif ep.accepted.fragments.get(seq) is not held:
                # Cut again while it was checked (_drop_other_cut): this fragment is of
                # the cut that was dropped, and the sender sends the new cut.
                self.events.drop(header, "the message was cut again while it was checked")
            elif problem[0] is not None:
                self.admission.send_broker_error(
                    link, db, header, CODE_VALIDATION_FAILED, problem[0], ep
                )
            elif not ep.accepted.has_fragment(seq, header.fragment_index):
                self._accept_fragment(db, ep, header, body)

        db.store.submit(
            (), fn=check, on_commit=checked, on_failure=lambda _: ep.validating.discard(seq)
        )

    def _new_target_endpoint(
        self, db: Database, link: Link, header: DialogHeader, body: bytes
    ) -> tuple[Endpoint, bytes] | None:
        """The target's endpoint, created by the first message if the target accepts it,
        and the message's plaintext (R-DLG-14: a secured dialog's key comes with it)."""
        service = db.catalog.services.get(header.to_service)
        if service is None:
            self.admission.send_broker_error(
                link,
                db,
                header,
                CODE_SERVICE_NOT_FOUND,
                f"service {header.to_service!r} does not exist in database {db.name!r}",
            )
            return None
        if header.contract not in service.contracts:
            self.admission.send_broker_error(
                link,
                db,
                header,
                CODE_CONTRACT_NOT_SUPPORTED,
                f"service {header.to_service!r} does not accept contract {header.contract!r}",
            )
            return None
        keys, plain = self.admission.target_keys(db, link, header, body)
        if plain is None:
            return None
        body = plain
        # before an endpoint is made for it
        if self.checks.cut_wrongly(header, body) or self.checks.too_many_partial(db, None, header):
            return None
        refusal = self.admission.refusal(db, header.contract, header, body)
        if refusal is not None:
            self.admission.send_broker_error(link, db, header, *refusal)
            return None
        ep = Endpoint(
            handle=new_handle(),
            conversation_id=header.conversation_id,
            initiator=False,
            group_id=random_id(),
            database=db.name,
            service=header.to_service,
            far_service=header.from_service,
            far_broker_instance=header.from_broker_instance,
            contract=header.contract,
            state=State.STARTED_INBOUND,
            # R-DLG-9: the header carries what is left of the lifetime, counted from BEGIN
            # DIALOG, so this side's deadline is the initiator's.
            lifetime=header.lifetime,
            created_at=self.clock(),
            keys=keys,
        )
        binding.bind(ep, header, link.identity, db.catalog.routes.values())
        db.add_endpoint(ep)
        self.deadlines.watch(ep)
        self.events.first_arrived(ep, link.name)
        return ep, body

    def _release(self, ep: Endpoint, released: list[int], seq: int, flags: int) -> bool:
        """Apply the ends among ``released``; True if the last of them is the other side's
        Error (it ends the dialog, so nothing follows it)."""
        error = False
        for s in released:
            f = flags if s == seq else ep.held_end_flags.pop(s, 0)
            if f & FLAG_ERROR:
                ep.ended_remote = True
                ep.error_received = error = True
            elif f & FLAG_END_DIALOG:
                ep.ended_remote = True
        if not released and flags & (FLAG_ERROR | FLAG_END_DIALOG):
            ep.held_end_flags[seq] = flags
        ep.refresh_state()  # a close is traced at its commit (_submit_received)
        return error

    def _complete(
        self, ep: Endpoint, seq: int, flags: int
    ) -> tuple[list[int], bool, list[Statement]]:
        """A whole message arrived: the messages it releases in order, whether the last of
        them is the other side's Error, and the statements promoting the held ones.

        The other side's Error never waits behind a gap (R-DLG-10): its sender dropped
        what it had not had acknowledged, so the Error closes every gap before it, and
        partial messages before it are abandoned.
        """
        h = ep.handle_text
        statements: list[Statement] = []
        if flags & FLAG_ERROR:
            if seq > ep.accepted.through + 1:
                statements += queries.abandon_before(h, seq)
            released = ep.accepted.add_last(seq)
        else:
            released = ep.accepted.add_message(seq)
        error = self._release(ep, released, seq, flags)
        statements += queries.promote(h, [s for s in released if s != seq])
        return released, error, statements

    def _accept_message(
        self, db: Database, ep: Endpoint, seq: int, flags: int, message_type: str, body: bytes
    ) -> None:
        """A whole message of one fragment, checked: stored (ready, or held until the ones
        before it arrive), acknowledged after its commit."""
        fenced = ep.state not in DELIVERING
        released, error, promoted = self._complete(ep, seq, flags)
        queue = db.queue_of(ep.service) or ""
        if (
            not fenced
            and len(released) == 1
            and not flags & (FLAG_ERROR | FLAG_END_DIALOG)
            and ep.state in DELIVERING
        ):
            self._arrived_in_order(db, ep, queue, seq, message_type, body)
            return
        statements: list[Statement] = [
            queue_row(
                ep,
                queue,
                seq,
                1 if released else 2,
                message_type,
                len(body),
                body,
                self.clock(),
            ),
            *promoted,
            endpoint_snapshot(ep, received=ep.accepted.through),
        ]
        if fenced and released:
            statements += queries.received([(ep.handle, s) for s in released], False)
        self._submit_received(
            db,
            ep,
            queue,
            statements,
            released,
            seq,
            None,
            fenced,
            error,
            arrived=len(body),
        )

    def _arrived_in_order(
        self, db: Database, ep: Endpoint, queue: str, seq: int, message_type: str, body: Body
    ) -> None:
        """A whole message that arrived in order and released only itself: the common case.
        Consecutive ones of one conversation in one turn (a frame's worth, or what the
        local link hands over) are stored by one job with one endpoint row and one commit
        callback (:class:`InOrderRun`), and acknowledged after it like any other."""
        row = queue_row(ep, queue, seq, 1, message_type, len(body), body, self.clock())
        snapshot = endpoint_snapshot(ep, received=ep.accepted.through)
        weight = ARRIVAL_WEIGHT + len(body)
        run = self.last_run
        if (
            run is not None
            and run.ep is ep
            and db.store.join_last(_RECEIVED, run, (row, snapshot), weight, True)
        ):
            run.seqs.append(seq)
            return
        run = self.last_run = InOrderRun(self, db, ep, queue, [seq])
        db.store.submit_joined(
            _RECEIVED, [row, snapshot], run, run.failed, weight, chains=(ep.receiving,)
        )

    # -- runs: the messages of one dialog after one that took the whole way ----------------
    # Used by what the local link and a connection hand over (``local_arrivals``,
    # ``remote_arrivals``), which tell whether a message repeats its run's first.

    @staticmethod
    def starts_run(db: Database, receiver: Endpoint, seq: int, before: int) -> bool:
        """``receiver`` (of ``db``) accepted the whole, plain message ``seq`` in order the
        whole way just now (``before``: what it had accepted until then; a duplicate,
        already accepted, proves nothing of its checks), its database takes arrivals, and
        its dialog is not secured: the messages after it may go straight to it."""
        return (
            before < seq
            and receiver.accepted.through == seq
            and receiver.keys is None
            and db.mirror_role != "mirror"
            and not db.mirror_in_doubt
            and not db.rx_suspended
        )

    @staticmethod
    def takes_next(db: Database, receiver: Endpoint, seq: int) -> bool:
        """A whole, plain message ``seq`` of a run releases itself only and leaves the
        endpoint's state as it is: it is next in order, nothing is held beyond it nor of
        it (held fragments of that number make it the message cut again, on the whole
        way: :meth:`_drop_other_cut`), and the receiver and its database still take
        messages."""
        accepted = receiver.accepted
        return (
            seq == accepted.through + 1
            and not accepted.beyond
            and seq not in accepted.fragments
            and receiver.state in DELIVERING
            and not receiver.broker_error
            and db.mirror_role != "mirror"
            and not db.mirror_in_doubt
            and not db.rx_suspended
        )

    def run_arrival(
        self,
        db: Database,
        receiver: Endpoint,
        seq: int,
        message_type: str,
        initiator: bool,
        body: Body,
    ) -> bool:
        """A message of a run (:meth:`takes_next`) after the checks of its own (contract,
        size, validation: R-DLG-3, R-OBJ-1): queued in order, acknowledged after its
        commit. False if refused: the whole way then answers it."""
        refusal = self.admission.refusal_of(
            db, receiver.contract, message_type, initiator, len(body), 1, body
        )
        if refusal is not None:
            return False
        self.stats.fragments_received += 1
        self.stats.fragments_in_runs += 1
        receiver.accepted.add_message(seq)
        queue = db.queue_of(receiver.service) or ""
        self._arrived_in_order(db, receiver, queue, seq, message_type, body)
        return True

    def trace_run(
        self,
        link: Link,
        receiver: Endpoint,
        initiator: bool,
        hop: int,
        arrived: list[tuple[int, int]],
    ) -> None:
        """``fragment_received`` of the messages ``(seq, size)`` of a run, as
        :meth:`on_fragment` traces each: one entry per run of messages of one size."""
        if not self.trace.enabled:
            return
        sizes = [size for _, size in arrived]
        for start, end in alike_runs(sizes):
            self.trace.emit_each(
                "fragment_received",
                receiver.conversation_id,
                "seq",
                [seq for seq, _ in arrived[start:end]],
                initiator=initiator,
                fragment=0,
                fragments=1,
                size=sizes[start],
                hop=hop or None,
                peer=link.name,
            )

    def _accept_fragment(
        self, db: Database, ep: Endpoint, header: DialogHeader, body: bytes
    ) -> None:
        seq, index = header.sequence_number, header.fragment_index
        fenced = ep.state not in DELIVERING
        first = seq not in ep.accepted.fragments
        cut = cut_size(index, header.fragment_offset, len(body))
        complete = ep.accepted.add_fragment(
            seq, index, header.fragment_count, cut, header.message_length
        )
        queue = db.queue_of(ep.service) or ""
        h = ep.handle_text
        statements: list[Statement] = []
        if first:
            statements.append(
                queue_row(
                    ep,
                    queue,
                    seq,
                    2,
                    header.message_type,
                    header.message_length,
                    None,
                    self.clock(),
                )
            )
        statements.append(queries.fragment(h, seq, index, header.fragment_offset, body))
        if not complete:
            statements.append(endpoint_snapshot(ep, received=ep.accepted.through))
            self._submit_received(
                db,
                ep,
                queue,
                statements,
                [],
                seq,
                index,
                fenced,
                False,
                arrived=len(body),
                held=ep.accepted.fragments[seq],
            )
            return
        released, error, promoted = self._complete(ep, seq, header.flags)
        statements += promoted
        statements.append(endpoint_snapshot(ep, received=ep.accepted.through))
        if fenced and released:
            statements.append(queries.drop_fragments(h, seq))
            statements += queries.received([(ep.handle, s) for s in released], False)
            self._submit_received(
                db,
                ep,
                queue,
                statements,
                released,
                seq,
                None,
                fenced,
                error,
                arrived=len(body),
            )
            return
        # The fragments stay where they are and are the body (schema.IN_FRAGMENTS): the
        # row's update is ordered after their inserts by the store (inserts first).
        statements.append(queries.complete_in_fragments(h, seq))
        if released:
            statements += queries.promote(h, [seq])
        self._submit_received(
            db,
            ep,
            queue,
            statements,
            released,
            seq,
            None,
            fenced,
            error,
            arrived=len(body),
        )

    def _submit_received(
        self,
        db: Database,
        ep: Endpoint,
        queue: str,
        statements: list[Statement],
        released: list[int],
        seq: int,
        fragment: int | None,
        fenced: bool,
        error: bool,
        fn: Callable[[sqlite3.Connection], Any] | None = None,
        *,
        arrived: int,
        held: set[int] | None = None,
    ) -> None:
        """Commit what arrived; then acknowledge it and make what it released ready, unless
        ``fenced`` (this side has ended: the statements remove it again, R-DLG-10).
        ``error``: the last released message is the other side's Error; ``arrived``: the
        bytes that arrived, counted (with ARRIVAL_WEIGHT) in the inbound backlog until the
        commit; ``held``: the fragment's message's held indexes when it was accepted (if the
        message has been cut again since, the commit claims nothing: ``_drop_other_cut``).

        An Error's endpoint shows ER from now on; until the commit makes the Error ready,
        its conversation group is not taken from, so no RECEIVE hands out the messages it
        goes ahead of before it (R-DLG-10, :meth:`ReadyIndex.error_coming`)."""
        index = db.ready.get(queue)
        coming = ep.group_id if error and not fenced and index is not None else None
        if coming is not None:
            assert index is not None
            index.error_coming(coming)

        def committed() -> None:
            if fragment is None:
                (ep.durable.add_last if error else ep.durable.add_message)(seq)
            elif ep.accepted.fragments.get(seq) is held:
                ep.durable.add_fragment(seq, fragment, UNKNOWN_COUNT)
            self.events.arrival_committed(ep)
            if fenced or ep.state not in DELIVERING:  # this side has ended (its END may commit)
                rank = Rank.ERROR if error else Rank.IN_SEQUENCE
                if (
                    fenced
                    or index is None
                    or not index.arrived_ending(ep.handle, ep.group_id, released, rank)
                ):
                    self.events.discarded(
                        ep, released, "this side has ended the conversation", received=True
                    )
                # else this side's END is committing: its outcome settles them
            else:
                self.delivery.delivered(db, ep, queue, index, released, error)
            if coming is not None:
                assert index is not None
                index.error_settled(coming)
            if released and ep.ended_remote and ep.service == ROUTE_REQUESTER_SERVICE:
                self.router.request_ended(ep)
            self.transmission.ack_needed(ep)

        def failed(exc: BaseException) -> None:
            log.error("store error while receiving into %s: %s", db.name, exc)
            if coming is not None:
                assert index is not None
                index.error_settled(coming)
            self.delivery.suspend_receiving(db)

        if fn is None:
            # The messages a link hands over in one turn are one job per database: any
            # failure means the same (receiving stops until memory matches the file),
            # and each message is still acknowledged only by its commit's callback.
            db.store.submit_joined(
                _RECEIVED,
                statements,
                committed,
                failed,
                ARRIVAL_WEIGHT + arrived,
                chains=(ep.receiving,),
            )
            return
        db.store.submit(
            statements,
            fn=fn,
            on_commit=committed,
            on_failure=failed,
            weight=ARRIVAL_WEIGHT + arrived,
            chains=(ep.receiving,),
        )

    def _on_broker_error(
        self, db: Database, ep: Endpoint, header: DialogHeader, body: bytes
    ) -> None:
        self.delivery.fail_locally(
            db, ep, body, "the broker reported an error for the conversation"
        )

    def on_corrupted_message(self, link: Link, reason: str) -> None:
        self.events.corrupted(link.name, reason)


def _ordered(conn: sqlite3.Connection) -> None:
    """A store job's function that does nothing: it makes the job's statements run after
    every statement of the jobs before it and before those of the jobs after it."""
