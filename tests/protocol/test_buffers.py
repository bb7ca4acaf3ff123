"""Many buffers to one socket write: small pieces joined, large ones as they are."""

from __future__ import annotations

from protocol.buffers import LARGE, blank, coalesce


def test_small_pieces_are_joined_in_order() -> None:
    assert coalesce([b"a", b"bc", b"d"]) == [b"abcd"]


def test_a_large_piece_is_kept_as_it_is_between_joined_runs() -> None:
    large = memoryview(b"x" * LARGE)
    pieces = coalesce([b"a", b"b", large, b"c", b"d"])
    assert pieces == [b"ab", large, b"cd"]
    assert pieces[1] is large  # not copied


def test_a_single_piece_is_not_copied() -> None:
    piece = b"only"
    (got,) = coalesce([piece])
    assert got is piece
    assert coalesce([]) == []


def test_the_bytes_are_those_of_the_pieces() -> None:
    pieces = [bytes([n]) * n for n in range(1, 200)] + [b"y" * (LARGE + 1), b"z"]
    assert b"".join(coalesce(pieces)) == b"".join(pieces)


def test_a_blank_buffer_has_its_size_and_takes_what_is_written() -> None:
    for size in (0, 1, 4096, 3 * 1024 * 1024 + 5):
        buffer = blank(size)
        assert type(buffer) is bytearray and len(buffer) == size
        data = bytes(i % 253 for i in range(size))
        memoryview(buffer)[:] = data
        assert buffer == data
    grown = blank(3)
    grown += b"xyz"  # an ordinary bytearray: it grows and shrinks as any does
    del grown[:3]
    assert grown == b"xyz"
