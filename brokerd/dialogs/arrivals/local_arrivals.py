"""What the local link hands over: the fragments of one sending endpoint, in order.

A fragment between two databases of this instance goes through
:meth:`Arrivals.on_fragment` as a connection's would: its header is built, routed,
and checked against the target's mirror role, the endpoint's binding and dialog
security, and carries the sender's acknowledgement (R-ROUTE-1, R-DLG-14). Once one
whole message of a run has been accepted in order that way, the whole messages after
it that follow it in order have nothing new to check there: the same endpoints, the
same link, the same acknowledgement. They skip the header, and go straight to the
checks of their own (contract, size, validation: R-DLG-3, R-OBJ-1) and to the
queue. Anything else (a message of several fragments, an ending, a gap, a duplicate,
a refusal, a changed acknowledgement, a secured dialog) takes the whole way, and the
run starts again after it.

The checks a run's messages share with a connection's runs (next in order, nothing
held, the receiver still taking messages) and their way to the queue are
:class:`~brokerd.dialogs.arrivals.receiving.Arrivals`' (``starts_run``, ``takes_next``,
``run_arrival``).

May import: ``protocol``, ``brokerd.dialogs.transmission``, ``brokerd.dialogs.endpoints``
and :mod:`brokerd.dialogs.arrivals.receiving`.
"""

from __future__ import annotations

from brokerd.dialogs.arrivals.receiving import Arrivals
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage
from brokerd.dialogs.transmission.links import Link
from brokerd.dialogs.transmission.transmission import Transmission
from protocol.dialog import FLAG_END_DIALOG, FLAG_ERROR, FLAG_SEQUENCED, DialogHeader

_NOT_PLAIN = FLAG_END_DIALOG | FLAG_ERROR
"""Flags of a message that must take the whole way (an ending)."""


class LocalArrivals:
    """The runs the local link hands over, given to :class:`Arrivals`."""

    def __init__(self, arrivals: Arrivals, transmission: Transmission) -> None:
        self.arrivals = arrivals
        self.transmission = transmission

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
        arrived: list[tuple[int, int]] = []
        """(sequence number, size) of the messages that went straight to ``receiver``."""
        try:
            for msg, index in pieces:
                body = msg.body
                if msg.seq not in sender.outbox or body is None:
                    continue  # acknowledged, or a copy already written (see the transport)
                if (
                    receiver is not None
                    and db is not None
                    and self._follows(sender, msg)
                    and self.arrivals.takes_next(db, receiver, msg.seq)
                    and self.arrivals.run_arrival(
                        db, receiver, msg.seq, msg.message_type, sender.initiator, body
                    )
                ):
                    arrived.append((msg.seq, msg.length))
                    self.transmission.fragment_left(sender, msg, index)
                    continue
                if arrived:
                    assert receiver is not None
                    self.arrivals.trace_run(link, receiver, sender.initiator, 0, arrived)
                    arrived = []
                before = self._accepted_through(sender, db)
                header, fragment = self._fragment(sender, msg, index)
                self.arrivals.on_fragment(link, header, fragment, db)  # a refusal is answered there
                receiver = self._run_receiver(sender, msg, db, before)
        finally:
            if arrived:
                assert receiver is not None
                self.arrivals.trace_run(link, receiver, sender.initiator, 0, arrived)

    def _fragment(self, ep: Endpoint, msg: OutMessage, index: int) -> tuple[DialogHeader, bytes]:
        """A fragment as the local link hands it over: its bytes are its own, since the
        receiving side keeps them (a link's frames take a view of the body instead)."""
        header, body = self.transmission.build_fragment(ep, msg, index)
        # a whole message's body in bytes is not copied (a large SEND body read in place,
        # a bytearray, is: the receiving side keeps what it is handed)
        return header, bytes(body)

    @staticmethod
    def _accepted_through(sender: Endpoint, db: Database | None) -> int:
        """What the far endpoint of ``sender`` in ``db`` has accepted in order (0: none yet)."""
        far = db.by_key.get((sender.conversation_id, not sender.initiator)) if db else None
        return far.accepted.through if far is not None else 0

    def _run_receiver(
        self, sender: Endpoint, msg: OutMessage, db: Database | None, before: int
    ) -> Endpoint | None:
        """The endpoint the messages after ``msg`` may go straight to, if ``msg`` was whole
        and plain and started a run (:meth:`Arrivals.starts_run`)."""
        if db is None or msg.fragment_count != 1 or sender.keys is not None:
            return None
        receiver = db.by_key.get((sender.conversation_id, not sender.initiator))
        if receiver is None or not self.arrivals.starts_run(db, receiver, msg.seq, before):
            return None
        return receiver

    @staticmethod
    def _follows(sender: Endpoint, msg: OutMessage) -> bool:
        """``msg`` is whole and plain, and the sender's acknowledgement is the one the
        run's first message carried (the rest is :meth:`Arrivals.takes_next`)."""
        return (
            msg.fragment_count == 1
            and msg.flags & (_NOT_PLAIN | FLAG_SEQUENCED) == FLAG_SEQUENCED
            and sender.ack_version == sender.ack_sent_version
        )
