"""What the local link hands over: the fragments of one sending endpoint, in order.

A fragment between two databases of this instance goes through
:meth:`Receiving.on_fragment` as a connection's would: its header is built, routed,
and checked against the target's mirror role, the endpoint's binding and dialog
security, and carries the sender's acknowledgement (R-ROUTE-1, R-DLG-14). Once one
whole message of a run has been accepted in order that way, the whole messages after
it that follow it in order have nothing new to check there: the same endpoints, the
same link, the same acknowledgement. They skip the header, and go straight to the
checks of their own (contract, size, validation: R-DLG-3, R-OBJ-1) and to the
queue. Anything else (a message of several fragments, an ending, a gap, a duplicate,
a refusal, a changed acknowledgement, a secured dialog) takes the whole way, and the
run starts again after it.

May import: ``protocol``, ``brokerd.dialogs`` models, :mod:`brokerd.dialogs.receiving` and
:mod:`brokerd.dialogs.runs`.
"""

from __future__ import annotations

from brokerd.dialogs.database import Database
from brokerd.dialogs.endpoint import Endpoint, OutMessage
from brokerd.dialogs.links import Link
from brokerd.dialogs.receiving import Receiving
from brokerd.dialogs.runs import alike_runs
from brokerd.dialogs.states import DELIVERING
from protocol.dialog import FLAG_END_DIALOG, FLAG_ERROR, FLAG_SEQUENCED

_NOT_PLAIN = FLAG_END_DIALOG | FLAG_ERROR
"""Flags of a message that must take the whole way (an ending)."""


class LocalArrivals(Receiving):
    """:class:`Receiving`, with the runs the local link hands over."""

    def on_local_fragments(
        self,
        link: Link,
        sender: Endpoint,
        pieces: list[tuple[OutMessage, int]],
        db: Database | None,
    ) -> None:
        """Fragments ``(message, index)`` of ``sender``, in the order they were queued,
        for ``db`` (None: routed on arrival)."""
        receiver: Endpoint | None = None
        arrived: list[OutMessage] = []
        """The messages that went straight to ``receiver``, not yet traced."""
        try:
            for msg, index in pieces:
                body = msg.body
                if msg.seq not in sender.outbox or body is None:
                    continue  # acknowledged, or a copy already written (see the transport)
                if receiver is not None and db is not None and self._follows(sender, receiver, msg):
                    refusal = self._refusal_of(
                        db,
                        receiver.contract,
                        msg.message_type,
                        sender.initiator,
                        msg.length,
                        1,
                        body,
                    )
                    if refusal is None:
                        arrived.append(msg)
                        self.transmission.fragment_left(sender, msg, index)
                        self.stats.fragments_received += 1
                        self.stats.fragments_in_runs += 1
                        # Nothing is held beyond it and no end is pending (_follows): it
                        # releases itself only, and the endpoint's state stays as it is.
                        receiver.accepted.add_message(msg.seq)
                        queue = db.queue_of(receiver.service) or ""
                        self._arrived_in_order(db, receiver, queue, msg.seq, msg.message_type, body)
                        continue
                if arrived:
                    assert receiver is not None
                    self._trace_arrived(link, sender, receiver, arrived)
                    arrived = []
                before = self._accepted_through(sender, db)
                header, fragment = self.build_fragment(sender, msg, index)
                self.on_fragment(link, header, fragment, db)  # a refusal is answered there
                receiver = self._run_receiver(sender, msg, db, before)
        finally:
            if arrived:
                assert receiver is not None
                self._trace_arrived(link, sender, receiver, arrived)

    @staticmethod
    def _accepted_through(sender: Endpoint, db: Database | None) -> int:
        """What the far endpoint of ``sender`` in ``db`` has accepted in order (0: none yet)."""
        far = db.by_key.get((sender.conversation_id, not sender.initiator)) if db else None
        return far.accepted.through if far is not None else 0

    def _run_receiver(
        self, sender: Endpoint, msg: OutMessage, db: Database | None, before: int
    ) -> Endpoint | None:
        """The endpoint the messages after ``msg`` may go straight to: ``msg`` was whole
        and accepted in order the whole way just now (``before``: what the endpoint had
        accepted until then; a duplicate, already accepted, proves nothing of its checks),
        by a database that takes arrivals now, and the dialog is not secured."""
        if (
            db is None
            or msg.fragment_count != 1
            or before >= msg.seq
            or sender.keys is not None
            or db.mirror_role == "mirror"
            or db.mirror_in_doubt
            or db.rx_suspended
        ):
            return None
        receiver = db.by_key.get((sender.conversation_id, not sender.initiator))
        if receiver is None or receiver.keys is not None or receiver.accepted.through != msg.seq:
            return None
        return receiver

    def _follows(self, sender: Endpoint, receiver: Endpoint, msg: OutMessage) -> bool:
        """``msg`` is whole, plain and next in order with nothing held beyond it, the
        receiver still takes messages, and the sender's acknowledgement is the one the
        run's first message carried."""
        accepted = receiver.accepted
        return (
            msg.fragment_count == 1
            and msg.seq == accepted.through + 1
            and not accepted.beyond
            and msg.seq not in accepted.fragments
            and msg.flags & (_NOT_PLAIN | FLAG_SEQUENCED) == FLAG_SEQUENCED
            and receiver.state in DELIVERING
            and not receiver.broker_error
            and sender.ack_version == sender.ack_sent_version
        )

    def _trace_arrived(
        self, link: Link, sender: Endpoint, receiver: Endpoint, messages: list[OutMessage]
    ) -> None:
        """``fragment_received`` of messages that went straight to ``receiver``, as
        :meth:`on_fragment` traces each: one entry per run of messages of one size."""
        if not self.trace.enabled:
            return
        for start, end in alike_runs([msg.length for msg in messages]):
            self.trace.emit_each(
                "fragment_received",
                receiver.conversation_id,
                "seq",
                [msg.seq for msg in messages[start:end]],
                initiator=sender.initiator,
                fragment=0,
                fragments=1,
                size=messages[start].length,
                hop=None,
                peer=link.name,
            )
