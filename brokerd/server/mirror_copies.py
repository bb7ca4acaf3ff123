"""A copy of a mirrored database's whole file, sent to the mirror and received there, in
bounded memory (SPEC R-ROUTE-16; docs/design.md "Mirroring: units of work shipped to the
partner").

A principal sends a copy of its file when the mirror that attaches is not in its history
(too far behind, or diverged). The copy goes through files on both sides, never whole in
memory (a file may be up to :data:`protocol.mirroring.MAX_SNAPSHOT_BYTES`):

* **Sending** (:func:`send_copy`): the store writes the copy to a file beside the
  database's, between two group commits (:meth:`Store.snapshot_to`); it is read back a
  chunk at a time, each chunk queued on the mirror's connection once the ones before
  have gone to the socket (:meth:`BrokerProtocol.drained`), then removed.
* **Receiving** (:class:`CopyReceiver`): each SNAPSHOT chunk is appended to a file beside
  the mirror's database file, within the copy's bound and in order (chunks of one copy
  only, as :class:`protocol.mirroring.ChunkAssembler` holds them); the complete file is
  installed by :meth:`Store.install_snapshot` (the backup API, one transaction of the
  mirror's file) and removed.

May import: ``brokerd.errors``, ``brokerd.storage`` and ``protocol``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from brokerd.errors import StoreError
from brokerd.storage.store import Store
from protocol import events, mirroring
from protocol.errors import RemoteProtocolError
from protocol.mirroring import Chunk, Kind

if TYPE_CHECKING:
    import uuid

    from brokerd.server.peer_connection import BrokerProtocol

FILE_MODE = 0o600
"""A received copy holds what the database's file does (dialog keys): its owner's only."""
AHEAD = 4
"""Chunks queued on the connection before the sender waits for them to go to the socket."""
_numbers = itertools.count(1)


def copy_path(store: Store, what: str) -> Path:
    """A file beside the database's for a copy (``what``: ``out`` or ``in``), named so that
    no two copies of one process share one."""
    return store.path.with_name(f"{store.path.name}.copy-{what}-{next(_numbers)}")


def remove_stale_copies(store: Store) -> None:
    """Copies a process that stopped (or was killed) left beside the database's file."""
    for stale in store.path.parent.glob(f"{store.path.name}.copy-*"):
        with contextlib.suppress(OSError):
            stale.unlink()


async def send_copy(
    protocol: BrokerProtocol,
    store: Store,
    instance: uuid.UUID,
    wanted: Callable[[], bool],
) -> int | None:
    """Send a copy of ``store``'s file to the mirror on ``protocol``, a chunk at a time;
    the LSN the copy holds once every chunk is queued, or None if the copy was no longer
    ``wanted`` (the session displaced or lost) before. StoreError if it cannot be taken, or
    is beyond what a mirror takes (:data:`~protocol.mirroring.MAX_SNAPSHOT_BYTES`)."""
    path = copy_path(store, "out")
    try:
        lsn, epoch = await store.snapshot_to(path)
        try:
            total = path.stat().st_size
            stream: IO[bytes] = path.open("rb")
        except OSError as exc:
            raise StoreError(f"cannot read the copy {path}: {exc}") from exc
        with stream:
            if total > mirroring.MAX_SNAPSHOT_BYTES:
                raise StoreError(
                    f"the file is {total} bytes, beyond the {mirroring.MAX_SNAPSHOT_BYTES} a "
                    "copy for a mirror may hold"
                )
            size = mirroring.chunk_size(protocol.conn.peer_max_frame_size)
            sent = 0
            for count in itertools.count(1):
                if not wanted():
                    return None
                data = stream.read(size)
                sent += len(data)
                final = sent >= total or not data
                chunk = Chunk(Kind.SNAPSHOT, instance, lsn, epoch, final, data)
                protocol.send_control(events.Mirror(mirroring.encode(chunk)))
                if final:
                    break
                if count % AHEAD == 0:
                    await protocol.drained()
        return lsn
    finally:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


class CopyReceiver:
    """The mirror's side of one copy at a time: its chunks appended to a file."""

    def __init__(self, store: Store, limit: int = mirroring.MAX_SNAPSHOT_BYTES) -> None:
        self.store = store
        self.limit = limit
        self._key: tuple[int, int] | None = None
        self._path: Path | None = None
        self._file: IO[bytes] | None = None
        self._size = 0

    @property
    def receiving(self) -> bool:
        """Whether a copy has begun and not ended."""
        return self._key is not None

    def reset(self) -> None:
        """Forget the copy being received (its file removed)."""
        if self._file is not None:
            self._file.close()
        if self._path is not None:
            with contextlib.suppress(OSError):
                self._path.unlink(missing_ok=True)
        self._key, self._path, self._file, self._size = None, None, None, 0

    def add(self, chunk: Chunk) -> Path | None:
        """The complete copy's file once ``chunk`` is its final one (the caller installs and
        removes it); None while chunks are missing. A chunk of another copy before this one
        is complete, or a copy beyond the bound, raises RemoteProtocolError (and forgets the
        copy); StoreError if the file cannot be written."""
        key = (chunk.lsn, chunk.epoch)
        if self._key is not None and key != self._key:
            self.reset()
            raise RemoteProtocolError(
                f"SNAPSHOT chunk for LSN {chunk.lsn} arrived before the previous one was complete"
            )
        if self._size + len(chunk.data) > self.limit:
            self.reset()
            raise RemoteProtocolError(f"SNAPSHOT exceeds {self.limit} bytes")
        try:
            if self._file is None:
                self._path = copy_path(self.store, "in")
                fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
                self._file = os.fdopen(fd, "wb")
            self._key = key
            self._file.write(chunk.data)
            self._size += len(chunk.data)
            if not chunk.final:
                return None
            self._file.close()
        except OSError as exc:
            self.reset()
            raise StoreError(f"cannot write the principal's copy: {exc}") from exc
        path = self._path
        self._key, self._path, self._file, self._size = None, None, None, 0
        return path
