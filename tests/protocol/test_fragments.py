"""Tests of protocol/fragments.py: fragmentation and reassembly (SPEC R-DLG-7).

R-DLG-7: a small message travels as one fragment, a large one as many; a lost
fragment is resent alone (fragment_at); small messages may be interleaved
between the fragments of a large one; the receiver rebuilds messages from
fragments arriving in any order and with duplicates (R-DLG-4), in bounded memory:
a fragment that would break a bound is refused with ReassemblyFull (retriable:
not acknowledged, R-DLG-5, so the sender retransmits it, R-DLG-6).
"""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.errors import LocalProtocolError, ReassemblyError, ReassemblyFull
from protocol.fragments import (
    DEFAULT_FRAGMENT_SIZE,
    MIN_FRAGMENT_SIZE,
    FragmentSlice,
    Reassembler,
    cut_size,
    extent_problem,
    fragment_at,
    fragment_count,
    split_message,
)

KIB = 1024


def state(r: Reassembler, keys: Any = ()) -> tuple[Any, ...]:
    """Everything observable about a reassembler (for "state unchanged" checks)."""
    return (r.held_bytes, r.held_messages, tuple(r.received(k) for k in keys))


def feed(r: Reassembler, key: Any, piece: FragmentSlice, length: int) -> bytes | None:
    return r.add(key, piece.index, piece.count, piece.offset, length, piece.data)


# ------------------------------------------------------------------ split_message


def test_split_empty_body_is_one_empty_fragment() -> None:
    """R-DLG-7: every message, even an empty one, travels as at least one fragment."""
    assert list(split_message(b"", 10)) == [FragmentSlice(0, 1, 0, b"")]
    assert list(split_message(b"")) == [FragmentSlice(0, 1, 0, b"")]
    assert fragment_at(b"", 0, 10) == FragmentSlice(0, 1, 0, b"")


def test_split_small_message_is_one_fragment() -> None:
    assert list(split_message(b"hello")) == [FragmentSlice(0, 1, 0, b"hello")]
    body = bytes(DEFAULT_FRAGMENT_SIZE)
    assert len(list(split_message(body))) == 1


def test_split_exact_multiple() -> None:
    body = bytes(range(30))
    pieces = list(split_message(body, 10))
    assert pieces == [
        FragmentSlice(0, 3, 0, body[0:10]),
        FragmentSlice(1, 3, 10, body[10:20]),
        FragmentSlice(2, 3, 20, body[20:30]),
    ]


def test_split_with_remainder() -> None:
    body = bytes(range(31))
    pieces = list(split_message(body, 10))
    assert [(p.index, p.count, p.offset, len(p.data)) for p in pieces] == [
        (0, 4, 0, 10),
        (1, 4, 10, 10),
        (2, 4, 20, 10),
        (3, 4, 30, 1),
    ]
    assert pieces[-1].data == body[30:]


def test_split_default_fragment_size_boundary() -> None:
    body = bytes(DEFAULT_FRAGMENT_SIZE + 1)
    pieces = list(split_message(body))
    assert [len(p.data) for p in pieces] == [DEFAULT_FRAGMENT_SIZE, 1]


@pytest.mark.parametrize("size", [0, -1])
def test_split_refuses_non_positive_fragment_size(size: int) -> None:
    with pytest.raises(LocalProtocolError):
        list(split_message(b"abc", size))


def test_fragment_at_out_of_range_is_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        fragment_at(b"abcdef", 3, 2)
    with pytest.raises(LocalProtocolError):
        fragment_at(b"abcdef", -1, 2)
    with pytest.raises(LocalProtocolError):
        fragment_at(b"", 1, 2)


@pytest.mark.parametrize("size", [0, -2])
def test_fragment_at_refuses_non_positive_fragment_size(size: int) -> None:
    with pytest.raises(LocalProtocolError):
        fragment_at(b"abc", 0, size)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300), size=st.integers(1, 64))
def test_split_properties(body: bytes, size: int) -> None:
    """Concatenation is the body; offsets follow indexes; fragment_at resends one alone."""
    pieces = list(split_message(body, size))
    assert b"".join(p.data for p in pieces) == body
    assert len(pieces) == fragment_count(len(body), size) == max(1, -(-len(body) // size))
    for i, p in enumerate(pieces):
        assert (p.index, p.count, p.offset) == (i, len(pieces), i * size)
        assert p.data == body[p.offset : p.offset + size]
        assert fragment_at(body, i, size) == p
    assert all(len(p.data) == size for p in pieces[:-1])
    assert (len(pieces[-1].data) > 0) == (len(body) > 0)


# ------------------------------------------------------- reassembly, hypothesis


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[list[bytes], list[tuple[int, FragmentSlice, bool]]]:
    """Several messages, their fragments interleaved, each message's fragments in a random
    order with duplicates of already-held fragments sprinkled in.

    Duplicates are only delivered while their message is still incomplete: once a
    message is complete the dialog layer acknowledges a late copy by sequence number
    (R-DLG-4) and never hands it to the reassembler.

    Returns the bodies and the schedule [(message, fragment, completes_message)].
    """
    bodies: list[bytes] = []
    per_message: list[list[FragmentSlice]] = []
    for m in range(draw(st.integers(1, 4))):
        length = draw(st.integers(0, 200 * KIB) | st.integers(0, 64))
        seed = draw(st.integers(0, 2**32))
        body = random.Random(seed).randbytes(length)
        min_size = max(1, -(-length // 48))  # at most 48 fragments per message
        size = draw(st.integers(min_size, max(min_size, length + 8)))
        pieces = list(split_message(body, size))
        order = draw(st.permutations(pieces))
        if len(order) > 1:
            dups = draw(st.lists(st.sampled_from(order[:-1]), max_size=len(order)))
            early = draw(st.permutations(list(order[:-1]) + dups))
            order = [*early, order[-1]]
        bodies.append(body)
        per_message.append(list(order))
        del m
    slots = [m for m, seq in enumerate(per_message) for _ in seq]
    interleaving = draw(st.permutations(slots))
    cursors = [0] * len(per_message)
    schedule = []
    for m in interleaving:
        piece = per_message[m][cursors[m]]
        cursors[m] += 1
        schedule.append((m, piece, cursors[m] == len(per_message[m])))
    return bodies, schedule


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=deliveries())
def test_reassembly_any_order_with_duplicates_and_interleaving(
    case: tuple[list[bytes], list[tuple[int, FragmentSlice, bool]]],
) -> None:
    """R-DLG-7/R-DLG-4: each message is rebuilt exactly once, equal to the original,
    returned exactly when its last missing fragment arrives; memory is released."""
    bodies, schedule = case
    r = Reassembler()
    done: dict[int, bytes] = {}
    held: dict[int, dict[int, int]] = {m: {} for m in range(len(bodies))}
    for m, piece, completes in schedule:
        key = ("conversation", True, m)
        out = feed(r, key, piece, len(bodies[m]))
        if completes:
            assert out is not None, "message not returned when its last fragment arrived"
            assert m not in done, "message reassembled twice"
            assert out == bodies[m]
            done[m] = out
            held[m] = {}
            assert r.received(key) == []
        else:
            assert out is None
            held[m][piece.index] = len(piece.data)
            assert r.received(key) == sorted(held[m])
        assert r.held_bytes == sum(sum(h.values()) for h in held.values())
        assert r.held_messages == sum(1 for h in held.values() if h)
    assert done == dict(enumerate(bodies))
    assert r.held_bytes == 0
    assert r.held_messages == 0


def test_small_message_interleaved_with_a_large_one() -> None:
    """R-DLG-7: a one-fragment message is delivered at once, between fragments of a large
    message, without disturbing it."""
    r = Reassembler()
    big = bytes(range(256)) * 40
    pieces = list(split_message(big, 1000))
    assert feed(r, "big", pieces[0], len(big)) is None
    assert r.add("small", 0, 1, 0, 2, b"hi") == b"hi"
    for p in pieces[1:-1]:
        assert feed(r, "big", p, len(big)) is None
    assert r.add("small2", 0, 1, 0, 0, b"") == b""
    assert feed(r, "big", pieces[-1], len(big)) == big
    assert (r.held_bytes, r.held_messages) == (0, 0)


def test_duplicate_fragment_is_ignored() -> None:
    """R-DLG-4: a second copy is accepted (so it can be acknowledged again), not stored."""
    r = Reassembler()
    assert r.add("k", 0, 2, 0, 4, b"ab") is None
    before = state(r, ["k"])
    assert r.add("k", 0, 2, 0, 4, b"ab") is None
    assert state(r, ["k"]) == before
    assert r.add("k", 1, 2, 2, 4, b"cd") == b"abcd"


# ------------------------------------------------------------------- memory bounds


@settings(max_examples=150, deadline=None)
@given(
    bound=st.integers(1, 200),
    sizes=st.lists(st.integers(1, 60), min_size=8, max_size=8),
    adds=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 5)), max_size=80),
)
def test_held_bytes_never_exceed_the_bound(
    bound: int, sizes: list[int], adds: list[tuple[int, int]]
) -> None:
    """Many partial messages: held_bytes stays within max_held_bytes; every refusal is
    ReassemblyFull (retriable) and keeps what was held (R-DLG-5: refuse unacknowledged).

    Message ``key`` has 6 fragments of ``sizes[key]`` bytes; adds name (key, index).
    (held_messages after a refusal is checked separately, below.)
    """
    r = Reassembler(max_held_bytes=bound)
    keys = range(8)
    for key, index in adds:
        size = sizes[key]
        before = state(r, keys)
        try:
            out = r.add(key, index, 6, index * size, 6 * size, bytes([key]) * size)
        except ReassemblyFull as exc:
            assert exc.retriable is True
            assert index not in r.received(key)
            assert before[0] + size > bound
            assert (r.held_bytes, state(r, keys)[2]) == (before[0], before[2])
        else:
            if out is not None:
                assert out == bytes([key]) * (6 * size)
                assert r.received(key) == []
            else:
                assert index in r.received(key)
        assert r.held_bytes <= bound
        assert r.held_bytes == sum(sizes[k] * len(r.received(k)) for k in keys)


def test_refused_fragment_of_a_held_message_leaves_state_unchanged() -> None:
    r = Reassembler(max_held_bytes=10)
    assert r.add("a", 0, 3, 0, 30, b"x" * 6) is None
    before = state(r, ["a"])
    with pytest.raises(ReassemblyFull) as info:
        r.add("a", 1, 3, 10, 30, b"y" * 5)
    assert info.value.retriable is True
    assert state(r, ["a"]) == before
    # The same fragment succeeds once memory is released (retriable indeed).
    r.discard("a")
    assert r.add("a", 1, 3, 10, 30, b"y" * 5) is None


def test_refused_first_fragment_of_a_new_message_leaves_state_unchanged() -> None:
    r = Reassembler(max_held_bytes=10, max_held_messages=2)
    with pytest.raises(ReassemblyFull):
        r.add("big-1", 0, 2, 0, 40, b"x" * 20)
    assert state(r, ["big-1"]) == (0, 0, ([],))
    with pytest.raises(ReassemblyFull):
        r.add("big-2", 0, 2, 0, 40, b"x" * 20)
    # Nothing is held, so a small new message must still be accepted.
    assert r.add("small", 0, 2, 0, 4, b"ab") is None


def test_max_held_messages() -> None:
    r = Reassembler(max_held_messages=2)
    assert r.add("a", 0, 2, 0, 4, b"ab") is None
    assert r.add("b", 0, 2, 0, 4, b"ab") is None
    before = state(r, ["a", "b", "c"])
    with pytest.raises(ReassemblyFull, match="already reassembling 2") as info:
        r.add("c", 0, 2, 0, 4, b"ab")
    assert info.value.retriable is True
    assert state(r, ["a", "b", "c"]) == before
    # Held messages still progress, and single-fragment messages are never held.
    assert r.add("a", 0, 2, 0, 4, b"ab") is None
    assert r.add("single", 0, 1, 0, 3, b"abc") == b"abc"
    assert r.add("a", 1, 2, 2, 4, b"cd") == b"abcd"
    # A slot is free again.
    assert r.add("c", 0, 2, 0, 4, b"ab") is None
    assert r.held_messages == 2


@pytest.mark.parametrize("count", [1, 3])
def test_message_over_max_message_size_is_not_retriable(count: int) -> None:
    r = Reassembler(max_message_size=100)
    with pytest.raises(ReassemblyError, match="exceeds the limit of 100") as info:
        r.add("k", 0, count, 0, 101, b"x")
    assert not isinstance(info.value, ReassemblyFull)
    assert info.value.retriable is False
    assert state(r, ["k"]) == (0, 0, ([],))
    # Exactly at the limit is fine.
    assert r.add("ok", 0, 1, 0, 100, b"x" * 100) == b"x" * 100


# ---------------------------------------------------------------- inconsistencies


def test_different_count_for_the_same_key() -> None:
    r = Reassembler()
    r.add("k", 0, 3, 0, 9, b"abc")
    before = state(r, ["k"])
    with pytest.raises(ReassemblyError, match="4 fragments / 9 bytes"):
        r.add("k", 1, 4, 3, 9, b"de")
    assert state(r, ["k"]) == before


def test_different_length_for_the_same_key() -> None:
    r = Reassembler()
    r.add("k", 0, 3, 0, 9, b"abc")
    before = state(r, ["k"])
    with pytest.raises(ReassemblyError, match="earlier ones said 3 / 9"):
        r.add("k", 1, 3, 3, 12, b"def")
    assert state(r, ["k"]) == before


def test_single_fragment_contradicting_a_partial_message() -> None:
    r = Reassembler()
    r.add("k", 0, 3, 0, 9, b"abc")
    with pytest.raises(ReassemblyError):
        r.add("k", 0, 1, 0, 3, b"xyz")


@pytest.mark.parametrize(
    ("offset", "data"),
    [(1, b"abc"), (0, b"ab"), (0, b"abcd")],
    ids=["other-offset", "shorter", "longer"],
)
def test_same_index_with_different_extent(offset: int, data: bytes) -> None:
    r = Reassembler()
    r.add("k", 0, 3, 0, 9, b"abc")
    before = state(r, ["k"])
    with pytest.raises(ReassemblyError, match="different extents"):
        r.add("k", 0, 3, offset, 9, data)
    assert state(r, ["k"]) == before


@pytest.mark.parametrize(
    ("pieces", "length", "message"),
    [
        ([(0, b"abcde"), (6, b"ghij")], 10, "offset 6, expected 5"),  # gap
        ([(0, b"abcdef"), (5, b"fghij")], 10, "offset 5, expected 6"),  # overlap
        ([(0, b"abcd"), (4, b"efgh")], 10, "hold 8 bytes, message has 10"),  # short
        ([(4, b"efgh"), (0, b"abcd")], 8, "offset 4, expected 0"),  # out of index order
        ([(1, b"abcd"), (5, b"efg")], 8, "offset 1, expected 0"),  # does not start at 0
    ],
    ids=["gap", "overlap", "short", "swapped", "late-start"],
)
def test_gaps_and_overlaps_found_at_completion(
    pieces: list[tuple[int, bytes]], length: int, message: str
) -> None:
    """Fragments that cannot form the message are refused when it completes, and the
    memory they held is released."""
    r = Reassembler()
    *first, (last_offset, last_data) = pieces
    for index, (offset, data) in enumerate(first):
        assert r.add("k", index, len(pieces), offset, length, data) is None
    with pytest.raises(ReassemblyError, match=message):
        r.add("k", len(pieces) - 1, len(pieces), last_offset, length, last_data)
    assert state(r, ["k"]) == (0, 0, ([],))


@pytest.mark.parametrize(
    ("index", "count", "offset", "length", "data"),
    [
        (3, 3, 0, 9, b"a"),  # index == count
        (-1, 3, 0, 9, b"a"),
        (0, 0, 0, 9, b""),  # no fragments
        (1, 3, 8, 9, b"ab"),  # overruns the message
        (0, 5, 0, 4, b"a"),  # more fragments than bytes
        (0, 1, 0, 5, b"abc"),  # single fragment shorter than the message
        (0, 1, 1, 4, b"abc"),  # single fragment not at offset 0
    ],
)
def test_fragment_that_cannot_fit_is_refused(
    index: int, count: int, offset: int, length: int, data: bytes
) -> None:
    r = Reassembler()
    with pytest.raises(ReassemblyError) as info:
        r.add("k", index, count, offset, length, data)
    assert not isinstance(info.value, ReassemblyFull)
    assert state(r, ["k"]) == (0, 0, ([],))


def test_discard_releases_memory() -> None:
    r = Reassembler(max_held_bytes=10, max_held_messages=1)
    r.add("a", 0, 3, 0, 12, b"abcd")
    r.add("a", 2, 3, 8, 12, b"ijkl")
    assert state(r, ["a"]) == (8, 1, ([0, 2],))
    with pytest.raises(ReassemblyFull):
        r.add("a", 1, 3, 4, 12, b"efgh")  # 12 bytes > 10
    with pytest.raises(ReassemblyFull):
        r.add("b", 0, 2, 0, 4, b"ab")  # a second message > 1
    r.discard("a")
    assert state(r, ["a"]) == (0, 0, ([],))
    r.discard("a")  # discarding an unknown key is a no-op
    r.discard("never-seen")
    assert state(r, ["a"]) == (0, 0, ([],))
    # A discarded message starts afresh (its earlier fragments are gone).
    assert r.add("a", 1, 3, 4, 12, b"efgh") is None
    assert r.received("a") == [1]
    assert r.held_bytes == 4


@pytest.mark.parametrize("size", [1, 7, 1000, 4096])
def test_cut_size_reads_the_size_a_fragment_was_cut_at(size: int) -> None:
    """The receiver tells a message cut again by the size its fragments were cut at
    (R-DLG-7): each fragment of several says it, from its index, offset and length."""
    body = bytes(range(256)) * 40
    pieces = list(split_message(body, size))
    assert len(pieces) > 1
    assert {cut_size(p.index, p.offset, len(p.data)) for p in pieces} == {size}


@given(st.integers(1, 5000), st.integers(1, 700))
def test_every_fragment_a_sender_cuts_has_the_extent_of_its_cut(length: int, size: int) -> None:
    """R-DLG-7: the fragments ``split_message`` cuts, at any size, each pass
    ``extent_problem`` against their message's length."""
    for piece in split_message(bytes(length), size):
        assert (
            extent_problem(piece.index, piece.count, piece.offset, len(piece.data), length) is None
        )


@pytest.mark.parametrize(
    ("index", "count", "offset", "length"),
    [
        (1, 3, 100, 900),  # at its cut's offset, but the rest of the message
        (2, 3, 200, 800),
        (1, 3, 150, 100),  # 150 is no multiple of a size that gives three fragments
        (0, 3, 0, 500),  # a first fragment of 500 bytes cuts 1000 bytes in two
        (2, 3, 201, 100),  # not at a multiple of its index
        (0, 2, 0, 0),  # an empty first fragment
    ],
)
def test_a_fragment_beside_its_cut_is_named(
    index: int, count: int, offset: int, length: int
) -> None:
    """R-DLG-7: a fragment of a 1000-byte message that no cut at one size makes (joined
    with the others by index, it would not make the message) is named, with why."""
    assert extent_problem(index, count, offset, length, 1000)


@pytest.mark.parametrize(("size", "refused"), [(1023, True), (1024, False), (4096, False)])
def test_a_cut_below_the_least_size_is_named(size: int, refused: bool) -> None:
    """R-DLG-7: with ``min_size`` (a daemon gives ``MIN_FRAGMENT_SIZE``), every fragment
    of a message of several cut below it is named, the last one too; a message of one
    fragment, however small, is not."""
    length = 3 * size + 1
    pieces = list(split_message(bytes(length), size))
    named = [
        extent_problem(p.index, p.count, p.offset, len(p.data), length, MIN_FRAGMENT_SIZE)
        for p in pieces
    ]
    assert all(named) if refused else not any(named)
    assert extent_problem(0, 1, 0, 10, 10, MIN_FRAGMENT_SIZE) is None


def test_fragments_of_a_byte_or_two_cannot_hold_memory_beyond_the_bounds() -> None:
    """R-DLG-7: a message cut into tiny fragments (every cut of one size is valid, down
    to a byte) is held within a bound on the fragments as well as on their bytes: each
    fragment costs about 200 bytes of bookkeeping besides its data, so the bytes bound
    alone would let a peer make the memory held a hundred times ``max_held_bytes``."""
    r = Reassembler(max_held_bytes=1024 * 1024)
    length = 2 * 200_000
    tracemalloc.start()
    try:
        with pytest.raises(ReassemblyFull, match="fragments") as info:
            for index in range(200_000):
                r.add("tiny", index, 200_000, 2 * index, length, b"ab")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.retriable is True
    assert r.held_fragments == len(r.received("tiny")) == r.max_held_fragments
    assert peak < r.max_held_bytes + 256 * r.max_held_fragments
    # Nothing of the refused fragment was kept, and a discard gives every slot back.
    r.discard("tiny")
    assert (r.held_bytes, r.held_fragments, r.held_messages) == (0, 0, 0)
