"""MD5 of several buffers at once (SPEC R-DLG-8's signatures, ``protocol.digests``).

The compiled lanes (``protocol/_md5lanes.c``) and the pure path (``hashlib``, one buffer
at a time) must give the same digests: RFC 1321's own test suite, every length around
MD5's block and padding boundaries, buffers of unequal lengths in one pass, more buffers
than one pass takes, and every kind of lanes this CPU has.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterator

import pytest

from protocol import digests

RFC_1321 = [
    (b"", "d41d8cd98f00b204e9800998ecf8427e"),
    (b"a", "0cc175b9c0f1b6a831c399e269772661"),
    (b"abc", "900150983cd24fb0d6963f7d28e17f72"),
    (b"message digest", "f96b697d7cb7938d525a2f31aaf161d0"),
    (b"abcdefghijklmnopqrstuvwxyz", "c3fcd3d76192e4007dfb496cca67e13b"),
    (
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
        "d174ab98d277d9f5a5611c2c9f419d9f",
    ),
    (b"1234567890" * 8, "57edf4a22be3c955ac49da2e2107b67a"),
]

KINDS = ["", *digests.KINDS]
"""The default choice of lanes and each kind this CPU has."""


@pytest.fixture
def lanes_on() -> Iterator[None]:
    if not digests.COMPILED:
        pytest.skip("protocol._md5lanes is not built here")
    digests.use_lanes(True)
    yield


def _reference(buffers: list[bytes]) -> list[bytes]:
    return [hashlib.md5(b).digest() for b in buffers]


def test_the_lanes_module_is_built_where_the_project_is_tested() -> None:
    """``./dev setup`` compiles it (gcc and the Python headers are there); CI runs the
    compiled path, and the pure path below."""
    if not os.environ.get("CI"):
        pytest.skip("only required of the CI job")
    assert digests.COMPILED
    assert digests.KINDS


@pytest.mark.parametrize("kind", KINDS)
def test_rfc_1321_test_suite_in_lanes(lanes_on: None, kind: str) -> None:
    buffers = [message for message, _ in RFC_1321]
    assert [d.hex() for d in digests.md5_each(buffers, kind)] == [h for _, h in RFC_1321]


@pytest.mark.parametrize("kind", KINDS)
def test_every_length_around_the_block_and_padding_boundaries(lanes_on: None, kind: str) -> None:
    data = random.Random(7).randbytes(400)
    buffers = [data[:n] for n in range(400)]  # 0 .. 399: one, two and several blocks
    assert digests.md5_each(buffers, kind) == _reference(buffers)


@pytest.mark.parametrize("kind", KINDS)
def test_unequal_lengths_share_a_pass_and_groups_follow_one_another(
    lanes_on: None, kind: str
) -> None:
    rnd = random.Random(11)
    for _ in range(30):
        count = rnd.randint(1, 40)
        buffers = [
            rnd.randbytes(rnd.choice([0, 55, 56, 64, rnd.randint(0, 70_000)])) for _ in range(count)
        ]
        assert digests.md5_each(buffers, kind) == _reference(buffers)


def test_bytes_like_objects_are_read_where_they_lie(lanes_on: None) -> None:
    body = random.Random(3).randbytes(200_000)
    view = memoryview(body)
    buffers: list[bytes | bytearray | memoryview] = [
        body,
        bytearray(body[:70_000]),
        view[13:65_549],
        view[65_536:],
    ]
    assert digests.md5_each(buffers) == [hashlib.md5(b).digest() for b in buffers]


def test_what_is_not_a_contiguous_buffer_is_refused(lanes_on: None) -> None:
    with pytest.raises(TypeError):
        digests.md5_each(["text", b"bytes"])  # type: ignore[list-item]
    strided = memoryview(bytes(range(100)))[::2]
    with pytest.raises(BufferError):
        digests.md5_each([strided, b"x"])
    with pytest.raises(ValueError, match="kind"):
        digests.md5_each([b"x", b"y"], "no-such-lanes")


def test_the_pure_path_gives_the_same_digests() -> None:
    """With the lanes off (or not built) every digest is hashlib's, one at a time."""
    rnd = random.Random(5)
    buffers = [rnd.randbytes(rnd.randint(0, 100_000)) for _ in range(20)]
    with_lanes = digests.md5_each(buffers)
    digests.use_lanes(False)
    try:
        assert not digests.lanes()
        assert digests.md5_each(buffers) == with_lanes == _reference(buffers)
        with pytest.raises(ValueError, match="not available"):
            digests.md5_each(buffers, "sse2")
    finally:
        digests.use_lanes(True)
    assert digests.lanes() == digests.COMPILED
