"""The ready index (R-OBJ-3): what RECEIVE takes, and what taking costs."""

from __future__ import annotations

import uuid

from brokerd.dialogs.endpoints.ready import ReadyIndex


class _Untouchable:
    """A conversation handle that fails the test if it is hashed or compared."""

    def __hash__(self) -> int:
        raise AssertionError("a message behind the ones taken was looked at")

    def __eq__(self, other: object) -> bool:
        raise AssertionError("a message behind the ones taken was looked at")


def test_taking_the_head_of_a_group_does_not_look_at_the_messages_behind_it() -> None:
    """RECEIVE TOP (n) without a conversation takes the group's first n messages; what
    waits behind them is not scanned or hashed, so a RECEIVE costs what it takes, not
    the backlog (the local workload's consumer fell further behind as the queue grew)."""
    index = ReadyIndex()
    group, handle = uuid.uuid4(), uuid.uuid4()
    for seq in range(1, 4):
        index.add(group, handle, seq)
    behind = _Untouchable()
    for seq in range(4, 1004):
        index.add(group, behind, seq)  # type: ignore[arg-type]  # a stand-in handle
    taken = index.take(3, None, None)
    assert taken is not None
    assert taken[0] == group
    assert taken[1] == [(handle, 1), (handle, 2), (handle, 3)]
    assert index.count == 1000
    assert group in index.locked
    rest = index.groups[group]
    assert len(rest) == 1000 and rest[0][1] == 4 and rest[-1][1] == 1003


def test_taken_messages_put_back_come_first_again() -> None:
    index = ReadyIndex()
    group, handle = uuid.uuid4(), uuid.uuid4()
    for seq in range(1, 11):
        index.add(group, handle, seq)
    taken = index.take(4, None, None)
    assert taken is not None
    index.put_back(group, taken[1])
    index.locked.discard(group)
    again = index.take(100, None, None)
    assert again is not None
    assert [seq for _, seq in again[1]] == list(range(1, 11))
    assert index.count == 0 and group not in index.groups


def test_a_group_limited_take_takes_that_group_alone() -> None:
    """RECEIVE for one conversation group (SPEC §6) takes that group's messages, whatever
    waits in the groups ahead of it (whose messages it never looks at), and locks it."""
    index = ReadyIndex()
    ahead, wanted = uuid.uuid4(), uuid.uuid4()
    index.add(ahead, _Untouchable(), 1)  # type: ignore[arg-type]  # a stand-in handle
    handle = uuid.uuid4()
    index.add(wanted, handle, 1)
    index.add(wanted, handle, 2)
    taken = index.take(10, None, wanted)
    assert taken == (wanted, [(handle, 1), (handle, 2)])
    assert index.take(10, None, wanted) is None  # locked now, and empty


def test_next_group_skips_groups_held_by_others_and_errors_coming() -> None:
    """GET CONVERSATION GROUP's choice (SPEC §6, R-DLG-10): the oldest group with ready
    messages, not locked by another transaction (its own are allowed), none whose Error
    is on its way; the choice alone locks nothing."""
    index = ReadyIndex()
    first, second, third = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for group in (first, second, third):
        index.add(group, uuid.uuid4(), 1)
    assert index.next_group() == first
    assert index.next_group() == first  # not locked by choosing it
    index.lock(first)
    assert index.next_group() == second
    assert index.next_group(owned={first}) == first
    index.error_coming(second)
    assert index.next_group() == third
    index.lock(third)
    assert index.next_group() is None
    index.error_settled(second)
    assert index.next_group() == second


def test_a_conversation_set_aside_is_skipped_and_released_in_order() -> None:
    """Quarantine (SPEC §6): a conversation's messages leave its group, in order, and so
    do those added or put back later; the other conversation of the group still flows;
    release puts them back in front of the group, in order."""
    index = ReadyIndex()
    group, poisoned, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    index.add(group, poisoned, 1)
    index.add(group, other, 1)
    index.add(group, poisoned, 2)
    taken = index.take(10, None, None)
    assert taken is not None and taken[1] == [(poisoned, 1), (other, 1), (poisoned, 2)]
    index.locked.discard(group)
    index.put_back(group, taken[1])
    assert index.set_aside(poisoned) == 2
    assert index.count == 1
    index.add(group, poisoned, 3)
    index.put_back(group, [])
    assert index.count == 1
    assert index.take(10, None, None) == (group, [(other, 1)])
    index.locked.discard(group)
    assert index.take(10, None, None) is None

    index.clear()  # a reload: the quarantine stays, its messages are set aside again
    index.add(group, poisoned, 1)
    index.add(group, poisoned, 2)
    index.add(group, poisoned, 3)
    assert index.count == 0 and index.aside[poisoned] == [(poisoned, s) for s in (1, 2, 3)]
    assert index.release_aside(poisoned, group) == 3
    assert index.take(10, None, None) == (group, [(poisoned, 1), (poisoned, 2), (poisoned, 3)])
