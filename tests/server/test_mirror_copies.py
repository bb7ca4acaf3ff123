"""A copy of a mirrored database's file as the mirror receives it, into a file beside the
database's (SPEC R-ROUTE-16).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from brokerd.server.mirror_copies import CopyReceiver
from brokerd.storage.store import Store
from protocol.errors import RemoteProtocolError
from protocol.mirroring import Chunk, Kind

INSTANCE = uuid.UUID("2c8e5a1f-4b7d-4e3a-9f60-d1b2c3a4e5f6")


def part(lsn: int, data: bytes, final: bool) -> Chunk:
    return Chunk(Kind.SNAPSHOT, INSTANCE, lsn, 1, final, data)


def copies(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.glob("shop.sqlite.copy-*"))


def test_the_chunks_of_a_copy_make_its_file_and_nothing_else_stays(tmp_path: Path) -> None:
    """R-ROUTE-16: a copy's chunks are appended to a file beside the database's, handed
    over once the final one came; a copy cut off by a chunk of another, or beyond the
    bound, is refused and its file removed (the copy is asked for again)."""
    receiver = CopyReceiver(Store(tmp_path / "shop.sqlite", "shop"), limit=10)
    assert receiver.add(part(5, b"abcd", False)) is None and receiver.receiving
    done = receiver.add(part(5, b"efg", True))
    assert done is not None and done.read_bytes() == b"abcdefg" and not receiver.receiving
    done.unlink()

    assert receiver.add(part(6, b"abcd", False)) is None
    with pytest.raises(RemoteProtocolError, match="before the previous one was complete"):
        receiver.add(part(7, b"x", True))
    assert copies(tmp_path) == [] and not receiver.receiving

    assert receiver.add(part(8, b"abcdef", False)) is None
    with pytest.raises(RemoteProtocolError, match="exceeds 10 bytes"):
        receiver.add(part(8, b"ghijk", True))
    assert copies(tmp_path) == []

    assert receiver.add(part(9, b"abc", False)) is None
    receiver.reset()  # the session lost
    assert copies(tmp_path) == [] and not receiver.receiving
