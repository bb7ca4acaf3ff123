"""The receive-side acknowledgement state (R-DLG-4, R-DLG-10), without I/O."""

from __future__ import annotations

from protocol.acks import MIXED_CUTS, UNKNOWN_COUNT, AckState, PartialCount


def test_messages_are_released_in_order_and_held_beyond_a_gap() -> None:
    state = AckState()
    assert state.add_message(1) == [1]
    assert state.add_message(3) == []
    assert state.add_message(2) == [2, 3]
    assert state.add_message(2) == []  # a duplicate (R-DLG-4)
    assert state.through == 3 and not state.beyond


def test_the_last_message_closes_every_gap_before_it() -> None:
    """R-DLG-10: an Error is released at once; what is held before it comes first, in
    order; partial messages before it are given up; a second copy is a duplicate."""
    state = AckState()
    assert state.add_message(1) == [1]
    assert state.add_message(4) == []
    assert not state.add_fragment(3, 0, 2)
    assert state.add_last(6) == [4, 6]
    assert state.through == 6 and not state.beyond and not state.fragments
    assert state.add_last(6) == [] and state.has_message(5)


def test_the_last_message_in_order_is_an_ordinary_release() -> None:
    state = AckState(2)
    assert state.add_last(3) == [3]
    assert state.acknowledgement().through == 3


def test_a_message_cut_again_is_told_from_its_held_fragments() -> None:
    """R-DLG-7: the held fragments of a message remember the size they were cut at; a
    fragment of another cut, or the message whole, is told apart from them, and
    dropping them leaves no trace in the acknowledgement."""
    state = AckState(1)
    assert not state.cut_differently(2, 4, 250)  # nothing held
    assert not state.add_fragment(2, 0, 4, 250)
    assert not state.add_fragment(2, 2, 4, 250)
    assert not state.cut_differently(2, 4, 250)
    assert state.cut_differently(2, 2, 500)
    assert state.cut_differently(2, 1, 1000)  # whole: held fragments are of another cut
    twin = state.copy()
    state.drop_partial(2)
    assert not state.fragments and not state.cuts
    assert state.acknowledgement().fragments == ()
    assert twin.cut_differently(2, 2, 500)  # the copy keeps its own
    assert not twin.add_fragment(3, 1, 2, 0)  # a cut not known is never called another
    assert not twin.cut_differently(3, 2, 500)
    assert twin.add_message(2) == [2]
    assert twin.cuts == {}


def test_fragments_held_of_two_cuts_give_way_to_any() -> None:
    """A file written before cuts were told apart may hold fragments of one message cut
    at two sizes: read back, they count as cut otherwise than anything that comes."""
    state = AckState()
    state.add_fragment(4, 0, UNKNOWN_COUNT, 300)
    state.add_fragment(4, 1, UNKNOWN_COUNT, 400)
    assert state.cuts == {4: MIXED_CUTS}
    assert state.cut_differently(4, 2, 300) and state.cut_differently(4, 2, 400)


def test_the_length_held_fragments_named_is_kept_with_them() -> None:
    """R-DLG-7: the length the first fragment held of a message named is what every later
    fragment of it must name; it goes with the fragments, and a copy keeps it."""
    state = AckState()
    assert state.length_of(2) is None
    state.add_fragment(2, 0, 3, 1024, 2500)
    state.add_fragment(2, 1, 3, 1024, 3000)  # the first length stays
    assert state.length_of(2) == 2500
    assert state.copy().length_of(2) == 2500
    state.drop_partial(2)
    assert state.length_of(2) is None


def test_a_partial_count_follows_every_way_a_partial_message_goes() -> None:
    """R-DLG-7 (``limits.partial_messages``): the partial messages of the states sharing a
    count are counted exactly as they begin, complete, are given up before an Error,
    dropped for another cut, and leave with their state; a copy does not count."""
    count, one, two = PartialCount(), AckState(), AckState()
    one.add_fragment(5, 0, 2)
    count.add(one)
    count.add(two)
    assert count.held == 1
    one.add_fragment(5, 1, 2)  # a second fragment of a message held: no new one
    two.add_fragment(1, 0, 2)
    two.add_fragment(2, 0, 2)
    two.add_fragment(4, 0, 2)
    assert count.held == 4
    twin = two.copy()
    twin.add_fragment(9, 0, 2)
    twin.drop_partial(1)
    assert count.held == 4
    two.add_message(1)  # completed
    two.drop_partial(2)  # cut again
    assert count.held == 2
    two.add_last(6)  # an Error gives up the partial messages before it
    assert count.held == 1
    count.remove(one)
    assert count.held == 0
    one.add_fragment(7, 0, 2)
    assert count.held == 0
