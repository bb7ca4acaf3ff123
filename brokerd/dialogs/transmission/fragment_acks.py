"""What a sender takes from the fragments an acknowledgement names (R-DLG-7).

An acknowledgement may name, per message of several fragments not yet acknowledged
whole, the fragments its receiver holds; those are not sent again. Pure: no I/O, no
engine state.
"""

from __future__ import annotations

from brokerd.dialogs.endpoints.endpoint import OutMessage
from protocol.dialog import MAX_FRAGMENT_ACKS, Acknowledgement


def held_fragments(msg: OutMessage, ack: Acknowledgement) -> None:
    """The fragments of ``msg`` (a message of several, not acknowledged whole) that
    ``ack`` says the receiver holds, kept in ``msg.acked_fragments``. They are all it
    holds, not more to add to the earlier ones: a receiver drops what it holds of a
    message that arrives cut at another size (``Arrivals._drop_other_cut``), and that
    is also why an acknowledgement naming every fragment, or one beyond this cut, tells
    of another cut and leaves every fragment to be sent. A list at its bound
    (``MAX_FRAGMENT_ACKS``) may stop inside its last message: what it names of that one
    adds to what was known. Each range is bounded by the message's own fragment count,
    whatever a peer writes."""
    count, held, seq = msg.fragment_count, set(), msg.seq
    for f in ack.fragments:
        if f.sequence_number == seq:
            if f.last >= count:
                held = set(range(count))
                break
            held.update(range(f.first, f.last + 1))
    if not held:
        return
    if len(ack.fragments) >= MAX_FRAGMENT_ACKS and ack.fragments[-1].sequence_number == seq:
        held.update(msg.acked_fragments)  # the list was cut short, maybe inside this one
    msg.acked_fragments = held if len(held) < count else frozenset()
