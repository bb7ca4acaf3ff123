"""What a sender takes from the fragments an acknowledgement names (R-DLG-7): all the
receiver holds of a message of several, which it may have dropped for a new cut of
the message; a list at its bound adds to what was known of its last message."""

from __future__ import annotations

from brokerd.dialogs.endpoints.endpoint import OutMessage
from brokerd.dialogs.transmission.fragment_acks import held_fragments
from protocol.dialog import MAX_FRAGMENT_ACKS, Acknowledgement, FragmentAck


def _message(seq: int, fragments: int, acked: set[int] | None = None) -> OutMessage:
    msg = OutMessage(seq, "t", 0, None, fragments * 100, 0.0, fragments)
    if acked is not None:
        msg.acked_fragments = acked
    return msg


def _ack(*fragments: tuple[int, int, int]) -> Acknowledgement:
    return Acknowledgement(0, (), tuple(FragmentAck(*f) for f in fragments))


def test_an_acknowledgement_names_all_the_receiver_holds() -> None:
    msg = _message(3, 5, {0, 1, 2})
    held_fragments(msg, _ack((3, 3, 3)))
    assert msg.acked_fragments == {3}  # 0-2 were dropped for a new cut: sent again
    held_fragments(msg, _ack((2, 0, 1)))
    assert msg.acked_fragments == {3}  # names nothing of this message


def test_every_fragment_or_one_beyond_the_cut_is_of_another_cut() -> None:
    msg = _message(3, 2, {1})
    held_fragments(msg, _ack((3, 0, 1)))
    assert msg.acked_fragments == frozenset()
    msg = _message(3, 2, {1})
    held_fragments(msg, _ack((3, 0, 0), (3, 2, 4_000_000_000)))
    assert msg.acked_fragments == frozenset()


def test_a_list_at_its_bound_adds_to_what_was_known_of_its_last_message() -> None:
    gaps = [(9, i, i) for i in range(0, 2 * MAX_FRAGMENT_ACKS, 2)][:MAX_FRAGMENT_ACKS]
    msg = _message(9, 100, {97})
    held_fragments(msg, _ack(*gaps))
    assert msg.acked_fragments == {97, *range(0, 2 * MAX_FRAGMENT_ACKS, 2)}
    shorter = _message(9, 100, {97})
    held_fragments(shorter, _ack(*gaps[:-1]))
    assert shorter.acked_fragments == set(range(0, 2 * MAX_FRAGMENT_ACKS - 2, 2))
