"""Receive-side acknowledgement state of one conversation endpoint (R-DLG-4, R-DLG-5, R-DLG-7).

:class:`AckState` records which sequenced messages (and which fragments of
incomplete ones) an endpoint holds, answers "is this a duplicate?", and turns
itself into the :class:`~protocol.dialog.Acknowledgement` carried by outgoing
headers. The daemon keeps two per endpoint: one for what it has *accepted*
(duplicate detection and in-order promotion) and one for what is *durable*
(what acknowledgements may claim: never before the commit, R-DLG-5). The accepted
states of one database share a :class:`PartialCount`, which bounds the partial messages
its peers may leave held.

Pure data and arithmetic; no I/O.
"""

from __future__ import annotations

from protocol.dialog import (
    MAX_ACK_RANGES,
    MAX_FRAGMENT_ACKS,
    NO_ACK,
    Acknowledgement,
    AckRange,
    FragmentAck,
)

UNKNOWN_COUNT = 1 << 30
"""The fragment count :meth:`AckState.add_fragment` is given where it is not known (the
durable state, recovery): such a record never completes a message."""

MIXED_CUTS = -1
"""The cut recorded for a message whose held fragments were cut at two sizes (a file
written before they were told apart): any fragment that comes is of another cut."""


class PartialCount:
    """How many partial messages (some fragments held, not all) the :class:`AckState`
    objects that share it hold together: kept by :meth:`AckState.add_fragment` and
    :meth:`AckState.drop_partial`, so it is exact whichever way a partial message goes
    (completed, cut again, closed by an Error, its endpoint removed)."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = 0

    def add(self, state: AckState) -> None:
        """``state`` shares this count from now on (once, however often it is added)."""
        if state.partials is self:
            return
        if state.partials is not None:
            state.partials.remove(state)
        state.partials = self
        self.held += len(state.fragments)

    def remove(self, state: AckState) -> None:
        """``state`` no longer shares this count (its endpoint is gone)."""
        if state.partials is self:
            state.partials = None
            self.held -= len(state.fragments)


class AckState:
    __slots__ = ("beyond", "cuts", "fragments", "lengths", "partials", "through")

    def __init__(self, through: int = 0) -> None:
        self.through = through
        """Every message 1..through is held."""
        self.beyond: set[int] = set()
        """Complete messages held beyond ``through`` (arrived out of order)."""
        self.fragments: dict[int, set[int]] = {}
        """Fragment indexes held of messages not yet complete."""
        self.cuts: dict[int, int] | None = None
        """The size each such message's held fragments were cut at, where it is known
        (:meth:`cut_differently`), or :data:`MIXED_CUTS`; None until the first."""
        self.lengths: dict[int, int] | None = None
        """The message length the first held fragment of each such message named, where
        it is known (:meth:`length_of`); None until the first."""
        self.partials: PartialCount | None = None
        """The count of partial messages this state shares with others, if any."""

    def copy(self) -> AckState:
        """A copy that shares no :class:`PartialCount`."""
        twin = AckState(self.through)
        twin.beyond = set(self.beyond)
        twin.fragments = {seq: set(held) for seq, held in self.fragments.items()}
        twin.cuts = None if self.cuts is None else dict(self.cuts)
        twin.lengths = None if self.lengths is None else dict(self.lengths)
        return twin

    def has_message(self, seq: int) -> bool:
        return seq <= self.through or seq in self.beyond

    def has_fragment(self, seq: int, index: int) -> bool:
        if self.has_message(seq):
            return True
        held = self.fragments.get(seq)
        return held is not None and index in held

    def add_message(self, seq: int) -> list[int]:
        """Record a complete message; return the sequence numbers now deliverable in order.

        The list is empty when ``seq`` is out of order; otherwise it starts with
        ``seq`` and goes on with the held messages it releases.
        """
        self.drop_partial(seq)
        if seq <= self.through or seq in self.beyond:
            return []
        if seq != self.through + 1:
            self.beyond.add(seq)
            return []
        released = [seq]
        self.through = seq
        while self.through + 1 in self.beyond:
            self.through += 1
            self.beyond.discard(self.through)
            released.append(self.through)
        return released

    def add_last(self, seq: int) -> list[int]:
        """Record the message that ends the stream (the other side's Error, R-DLG-10).

        Its sender dropped whatever it had not had acknowledged, so nothing missing
        before it will come: every gap before ``seq`` closes. Returns the held messages
        before it, in order, then ``seq`` (empty if it is a duplicate).
        """
        if self.has_message(seq):
            return []
        for partial in [s for s in self.fragments if s < seq]:
            self.drop_partial(partial)
        held = sorted(s for s in self.beyond if s < seq)
        self.beyond.difference_update(held)
        self.through = max(self.through, seq - 1)
        return held + self.add_message(seq)

    def add_fragment(
        self, seq: int, index: int, count: int, cut: int = 0, length: int = -1
    ) -> bool:
        """Record one fragment of a message of ``length`` bytes (-1: not known) cut into
        ``count`` of ``cut`` bytes (0: not known); True when the message is now complete
        (all ``count`` held)."""
        if self.has_message(seq):
            return False
        held = self.fragments.get(seq)
        if held is None:
            held = self.fragments[seq] = set()
            if self.partials is not None:
                self.partials.held += 1
        held.add(index)
        if length >= 0:
            if self.lengths is None:
                self.lengths = {}
            self.lengths.setdefault(seq, length)
        if cut:
            if self.cuts is None:
                self.cuts = {}
            known = self.cuts.setdefault(seq, cut)
            if known != cut:
                self.cuts[seq] = MIXED_CUTS
        return len(held) >= count

    def cut_differently(self, seq: int, count: int, cut: int) -> bool:
        """Fragments of message ``seq`` are held, cut otherwise than a fragment of
        ``count`` cut at ``cut`` bytes: the sender cut the message again (R-DLG-7), as a
        broker restarted with another fragment size or a mirror configured with another
        does. Joined with the new ones they would not make the message, and by index
        alone the new ones would look like duplicates of them."""
        if seq not in self.fragments:
            return False
        if count == 1:
            return True  # held fragments are of a message of several
        held = self.cuts.get(seq) if self.cuts else None
        return held is not None and held != cut

    def length_of(self, seq: int) -> int | None:
        """The length of message ``seq`` its held fragments named, if known."""
        return self.lengths.get(seq) if self.lengths else None

    def drop_partial(self, seq: int) -> None:
        """Forget the fragments held of message ``seq``."""
        if self.fragments.pop(seq, None) is not None and self.partials is not None:
            self.partials.held -= 1
        if self.cuts:
            self.cuts.pop(seq, None)
        if self.lengths:
            self.lengths.pop(seq, None)

    def fragments_of(self, seq: int) -> set[int]:
        return set(self.fragments.get(seq, ()))

    def acknowledgement(self) -> Acknowledgement:
        """The acknowledgement for this state, within the header's bounds.

        Beyond the bounds, the lowest ranges win: they unblock the sender's oldest
        messages; the rest are acknowledged by a later header.
        """
        if not self.beyond and not self.fragments:  # every fragment header carries one
            return NO_ACK if not self.through else Acknowledgement(self.through, (), ())
        ranges: list[AckRange] = []
        if self.beyond:
            ordered = sorted(self.beyond)
            first = last = ordered[0]
            for seq in ordered[1:]:
                if seq == last + 1:
                    last = seq
                    continue
                ranges.append(AckRange(first, last))
                if len(ranges) == MAX_ACK_RANGES:
                    break
                first = last = seq
            else:
                ranges.append(AckRange(first, last))
        fragment_acks: list[FragmentAck] = []
        for seq in sorted(self.fragments):
            indexes = sorted(self.fragments[seq])
            first = last = indexes[0]
            for index in indexes[1:]:
                if index == last + 1:
                    last = index
                    continue
                fragment_acks.append(FragmentAck(seq, first, last))
                first = last = index
            fragment_acks.append(FragmentAck(seq, first, last))
            if len(fragment_acks) >= MAX_FRAGMENT_ACKS:
                del fragment_acks[MAX_FRAGMENT_ACKS:]
                break
        return Acknowledgement(self.through, tuple(ranges[:MAX_ACK_RANGES]), tuple(fragment_acks))
