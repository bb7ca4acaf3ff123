"""Message bodies and the ledger files of the soak (the checker reads nothing else).

A body is a header line ``key index length sha256`` and ``length`` payload bytes:
``key`` names the dialog as its producer knows it (a consumer sees only its own
conversation handle), ``index`` counts that dialog's messages from 0 in SEND order.
A key begins with its producer's stream: ``ab`` and ``ba`` for the dialogs between A
and B, ``ll`` for the local stream (both services in one database of A,
:data:`LOCAL_STREAM`).

Ledgers are text files of one record per line, appended and flushed:

* ``sent-*.log`` (producers): ``T key index`` before a SEND is issued,
  ``C key index`` once its commit was acknowledged, ``F key index`` once it is known
  not to have taken effect (refused by the daemon, or its transaction rolled back).
  A SEND whose connection broke before its answer is sent again under its
  idempotency key until it gets one (:mod:`.producers`); only a SEND of a
  transaction whose COMMIT's outcome is unknown (or of a producer cancelled) keeps
  its ``T`` line alone: it may arrive at most once.
* ``received-*.log`` (consumers): ``R batch key index ok`` for every message of a
  batch inside the transaction, before COMMIT (``ok`` is 1 when the payload matches
  its length and checksum), ``X batch kind detail`` for a message that is not a
  soak body, ``P batch`` when the handler is done and the COMMIT is about to be
  asked for, then ``K batch`` after the COMMIT returned, fsynced each time.
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass
from pathlib import Path

LOCAL_STREAM = "ll"
"""The producer stream between two services of one database (direct delivery, R-DLG-13)."""


def stream_of(key: str) -> str:
    """``local`` for the keys of the local stream (and their replies), else ``remote``."""
    return "local" if key.startswith(LOCAL_STREAM) else "remote"


@dataclass(frozen=True)
class Parsed:
    key: str
    index: int
    intact: bool


def make_body(key: str, index: int, size: int, rng: random.Random) -> bytes:
    payload = rng.randbytes(size)
    digest = hashlib.sha256(payload).hexdigest()
    return f"{key} {index} {size} {digest}\n".encode() + payload


def parse_body(body: bytes) -> Parsed | None:
    """The header of a soak body and whether its payload is intact; None if not a soak body."""
    head, sep, payload = body.partition(b"\n")
    if not sep:
        return None
    try:
        key, index, size, digest = head.decode().split(" ")
        n = int(index)
        length = int(size)
    except ValueError:
        return None
    intact = len(payload) == length and hashlib.sha256(payload).hexdigest() == digest
    return Parsed(key, n, intact)


class Ledger:
    """An append-only record file; ``sync`` makes every write durable before returning.

    A process SIGKILLed while writing can leave its last line cut short. Each write is
    one system call (an unbuffered file), and a ledger opened on a file whose last line
    was cut short begins on a line of its own: the next process's first record must not
    be glued to the torn one, where the checker could not read it."""

    def __init__(self, path: Path, *, sync: bool) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._sync = sync
        with path.open("rb") as f:
            torn = (
                f.seek(0, os.SEEK_END) > 0 and f.seek(-1, os.SEEK_END) >= 0 and (f.read(1) != b"\n")
            )
        if torn:
            self._write(b"\n")

    def write(self, lines: list[str]) -> None:
        if not lines:
            return
        self._write("".join(line + "\n" for line in lines).encode())
        if self._sync:
            os.fsync(self._fd)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        os.close(self._fd)
