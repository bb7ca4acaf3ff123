"""The floor under W3: what the work every 1 MiB message requires costs on this machine.

``python -m bench floor`` measures, one at a time and in one thread, the CPU time of
each piece of work that carrying one 1 MiB message from a producer on A to a
consumer on B requires by design, whatever the code around it:

* **three TCP hops** over loopback (producer to A, A to B, B to consumer), each the
  kernel's copies on both ends;
* **sealing and opening** its 64 KiB fragments (R-DLG-8: an MD5 signature of the
  content under the session key; AES-GCM encryption by default), with the
  protocol's own :class:`~protocol.security.FrameSealer` and ``FrameOpener``;
* **the sender's store**: the transmission queue rows inserted and committed, then
  deleted and committed when acknowledged, as the committer does it (WAL,
  ``synchronous=FULL``, the store's page size and page cache; a large body in a
  segment file made durable before the COMMIT, ``brokerd.storage.body_files``),
  ``PER_COMMIT`` messages a commit as a group commit takes them;
* **the receiver's store**: the fragments inserted and committed as they arrive
  (each in a segment file), then read, joined, deleted and committed by RECEIVE, as
  many a commit.

Their sum is a floor on the CPU per message of the four processes together: the
work as this design and its protocol do it, without the code around it (the
sealing includes the implementation's copies of each fragment; the receiver's
queue row and any body read back are left out). Two cores divided by it is a
ceiling on W3's MB/s. The MD5 of the whole message is reported beside the pieces,
not added (the sealing computes it). ``--peer-mb-s`` sets the peer's W3 figure of
the same sitting, to print the ceiling as a ratio.

Beside it, **the least any design may do** under the behaviour contract: three hops,
the MD5 of every byte on each side (R-DLG-8) and nothing else of the sealing, and on
each side the body written once into a file whose space is already allocated, made
durable by one ``fdatasync`` per ``PER_COMMIT`` messages (R-DLG-5: durable before it
is acknowledged), with no index, no read back and no deletion. No storage design, no
cipher choice and no code around the work goes below it; two cores divided by it
bound W3 from above whatever is built.

    python -m bench floor --json
"""

from __future__ import annotations

import hashlib
import os
import socket
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokerd.storage import queries, reads, schema
from brokerd.storage.body_files import BodyFiles, directory_of
from brokerd.storage.committer import commit_batch
from brokerd.storage.connection import PAGE_CACHE_MB, connect
from protocol.fragments import DEFAULT_FRAGMENT_SIZE
from protocol.frames import DEFAULT_MAX_FRAME_SIZE, HEADER_SIZE, FrameType, decode_header
from protocol.security import FrameOpener, FrameSealer

__all__ = ["MIB", "PAGE_CACHE_MB", "PER_COMMIT", "cores", "cpu_ms", "describe", "measure"]

MIB = 1 << 20
PER_COMMIT = 4
"""Messages a commit holds: W3's producer keeps ``client_pending_mb`` (16 MB) of SENDs
awaiting their commits, so a group commit takes a few 1 MiB messages."""
HOP_TIMEOUT = 30.0
StoreWork = Callable[[sqlite3.Connection, BodyFiles, str, list[int]], None]
"""One step of a side's store work, on a database and its segment files of large bodies:
a conversation handle and the numbers it uses."""


def cpu_ms(step: Callable[[], object], iterations: int) -> float:
    """CPU time (every thread of this process, user and system) of one ``step``, in ms."""
    step()  # warm up: caches, the file's first pages
    start = time.process_time()
    for _ in range(iterations):
        step()
    return (time.process_time() - start) / iterations * 1000


def _pieces(body: bytes) -> list[memoryview]:
    view = memoryview(body)
    return [view[i : i + DEFAULT_FRAGMENT_SIZE] for i in range(0, len(body), DEFAULT_FRAGMENT_SIZE)]


def sealing(body: bytes, encrypt: bool, iterations: int) -> tuple[float, float]:
    """CPU ms to seal ``body``'s fragments, and to open them, as a link does (views of
    the body sealed, frames opened where they lie)."""
    key = os.urandom(32)
    sealer, opener = FrameSealer(key, encrypt, 1), FrameOpener(key, encrypt)
    pieces = _pieces(body)
    kind = FrameType.FRAGMENT
    frames = [sealer.seal_pieces(kind, (piece,), n) for n, piece in enumerate(pieces)]

    def seal() -> None:
        for n, piece in enumerate(pieces):
            sealer.seal_pieces(kind, (piece,), n)

    def open_() -> None:
        for frame in frames:
            head = bytes(frame[:HEADER_SIZE])
            header = decode_header(head, DEFAULT_MAX_FRAME_SIZE)
            opener.open_view(header, head, memoryview(frame)[HEADER_SIZE:])

    return cpu_ms(seal, iterations), cpu_ms(open_, iterations)


def tcp_hop(body: bytes, iterations: int) -> float:
    """CPU ms of one TCP hop of ``body`` over loopback: sending it (from a thread that
    lives for the whole measurement) and receiving it."""
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname(), timeout=HOP_TIMEOUT) as sender,
    ):
        receiver, _ = server.accept()
        receiver.settimeout(HOP_TIMEOUT)
        buffer = memoryview(bytearray(len(body)))
        go, stop = threading.Semaphore(0), threading.Event()
        failed: list[BaseException] = []

        def send() -> None:
            while go.acquire() and not stop.is_set():
                try:
                    sender.sendall(body)
                except OSError as exc:
                    failed.append(exc)
                    return

        def hop() -> None:
            go.release()
            got = 0
            while got < len(body):
                n = receiver.recv_into(buffer[got:], len(body) - got)
                if not n:
                    raise RuntimeError(f"the hop's sender stopped: {failed or 'closed'}")
                got += n

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        try:
            return cpu_ms(hop, iterations)
        finally:
            stop.set()
            go.release()
            thread.join()
            receiver.close()


def _database(
    directory: Path, name: str, page_cache_mb: int
) -> tuple[sqlite3.Connection, BodyFiles]:
    """A database file with the store's schema, and its segment files of large bodies."""
    conn = connect(directory / f"{name}.db", page_cache_mb)
    for step in schema.MIGRATIONS:
        for sql in step.script.split(";"):
            if sql.strip():
                conn.execute(sql)
    bodies = BodyFiles(directory_of(directory / f"{name}.db"))
    bodies.open(conn)
    return conn, bodies


@dataclass
class _Part:
    """One store job's statements, as the committer's batch holds them."""

    statements: list[schema.Statement]
    fn: Callable[[sqlite3.Connection], Any] | None = None
    result: Any = None


def _committed(
    conn: sqlite3.Connection, bodies: BodyFiles, statements: list[schema.Statement]
) -> None:
    """``statements`` committed as the committer commits a batch (``commit_batch``):
    grouped, large bodies to the segment files and made durable before the COMMIT,
    then segments collected."""
    commit_batch(conn, [_Part(statements)], bodies)


def _per_message(
    directory: Path, name: str, page_cache_mb: int, iterations: int, work: StoreWork
) -> float:
    """CPU ms per message of ``work(conn, handle, seqs)``, given ``PER_COMMIT`` new
    sequence numbers of one conversation each time, on a database file of its own."""
    conn, bodies = _database(directory, name, page_cache_mb)
    handle, numbers = str(uuid.uuid4()), iter(range(1, 1 << 62))

    def step() -> None:
        work(conn, bodies, handle, [next(numbers) for _ in range(PER_COMMIT)])

    try:
        return cpu_ms(step, iterations) / PER_COMMIT
    finally:
        bodies.close()
        conn.close()


def store_sender(directory: Path, body: bytes, iterations: int, page_cache_mb: int) -> float:
    """CPU ms per message of the sender's store: ``PER_COMMIT`` bodies into the
    transmission queue in one commit (their rows, the bodies in a segment file), then
    their rows deleted in one (their acknowledgements)."""

    def work(conn: sqlite3.Connection, bodies: BodyFiles, handle: str, seqs: list[int]) -> None:
        now = time.time()
        sent = [queries.sent_message(handle, seq, "large", 3, body, now) for seq in seqs]
        _committed(conn, bodies, sent)
        _committed(conn, bodies, queries.unqueue_sent(handle, [], through=seqs[-1]))

    return _per_message(directory, "sender", page_cache_mb, iterations, work)


_RECEIVED_FRAGMENTS = (
    "DELETE FROM message_fragments WHERE conversation_handle = ? "
    "AND message_sequence_number BETWEEN ? AND ?"
)


def store_receiver(directory: Path, body: bytes, iterations: int, page_cache_mb: int) -> float:
    """CPU ms per message of the receiver's store: the fragments of ``PER_COMMIT`` bodies
    stored in one commit, then read, each body joined, and deleted in one (RECEIVE)."""
    pieces = [bytes(piece) for piece in _pieces(body)]  # as fragments arrive: bytes each

    def work(conn: sqlite3.Connection, bodies: BodyFiles, handle: str, seqs: list[int]) -> None:
        _committed(
            conn,
            bodies,
            [
                queries.fragment(handle, seq, n, n * DEFAULT_FRAGMENT_SIZE, piece)
                for seq in seqs
                for n, piece in enumerate(pieces)
            ],
        )
        for seq in seqs:
            joined = queries.joined(reads.read_fragments(conn, handle, seq, bodies))
            if len(joined) != len(body):
                raise RuntimeError(f"message {seq}: {len(joined)} bytes read back")
        _committed(conn, bodies, [(_RECEIVED_FRAGMENTS, (handle, seqs[0], seqs[-1]))])

    return _per_message(directory, "receiver", page_cache_mb, iterations, work)


RING_SLOTS = 16
"""Bodies the durable file holds before its first one is written over."""


def durable_file(directory: Path, body: bytes, iterations: int) -> float:
    """CPU ms per message of the least a durable store does with a body: its bytes
    written once into space already allocated (and synced), ``PER_COMMIT`` of them
    made durable by one ``fdatasync``, as a group commit would."""
    path = directory / "bodies"
    with path.open("wb") as f:  # allocated and synced first: a write needs no metadata
        for _ in range(RING_SLOTS):
            f.write(bytes(len(body)))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_WRONLY)
    slots = iter(range(1 << 62))

    def step() -> None:
        for _ in range(PER_COMMIT):
            os.pwrite(fd, body, next(slots) % RING_SLOTS * len(body))
        os.fdatasync(fd)

    try:
        return cpu_ms(step, iterations) / PER_COMMIT
    finally:
        os.close(fd)


def cores() -> int:
    return len(os.sched_getaffinity(0))


def measure(
    iterations: int = 100,
    directory: Path | None = None,
    peer_mb_s: float | None = None,
    page_cache_mb: int = PAGE_CACHE_MB,
) -> dict[str, Any]:
    """The floor's pieces in CPU ms per 1 MiB message, their sum, and the ceiling."""
    body = hashlib.shake_256(b"floor").digest(MIB)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        work = Path(scratch)
        seal, open_ = sealing(body, True, iterations)
        seal_signed, open_signed = sealing(body, False, iterations)
        pieces = {
            "tcp_hop": tcp_hop(body, iterations),
            "seal": seal,
            "open": open_,
            "seal_signed_only": seal_signed,
            "open_signed_only": open_signed,
            "md5": cpu_ms(lambda: hashlib.md5(body, usedforsecurity=False).digest(), iterations),
            "store_sender": store_sender(work, body, iterations, page_cache_mb),
            "store_receiver": store_receiver(work, body, iterations, page_cache_mb),
            "durable_file": durable_file(work, body, iterations),
        }
    floor = (
        3 * pieces["tcp_hop"]
        + pieces["seal"]
        + pieces["open"]
        + pieces["store_sender"]
        + pieces["store_receiver"]
    )
    least = 3 * pieces["tcp_hop"] + 2 * pieces["md5"] + 2 * pieces["durable_file"]
    n = cores()
    ceiling = n * MIB / 1e6 / (floor / 1000)
    least_ceiling = n * MIB / 1e6 / (least / 1000)
    line: dict[str, Any] = {
        "what": "W3 floor: CPU ms per 1 MiB message",
        "iterations": iterations,
        "per_commit": PER_COMMIT,
        "page_cache_mb": page_cache_mb,
        **{k: round(v, 3) for k, v in pieces.items()},
        "floor_ms": round(floor, 3),
        "cores": n,
        "ceiling_mb_s": round(ceiling, 1),
        "least_ms": round(least, 3),
        "least_ceiling_mb_s": round(least_ceiling, 1),
    }
    if peer_mb_s:
        line["peer_mb_s"] = peer_mb_s
        line["ceiling_ratio"] = round(ceiling / peer_mb_s, 2)
        line["least_ceiling_ratio"] = round(least_ceiling / peer_mb_s, 2)
    return line


def describe(line: dict[str, Any]) -> str:
    rows = [
        f"{line['what']} ({line['iterations']} iterations each; {line['per_commit']} "
        f"messages a commit, a page cache of {line['page_cache_mb']} MB):"
    ]
    rows += [
        f"  {name:<18} {line[name]:8.3f} ms"
        for name in (
            "tcp_hop",
            "seal",
            "open",
            "seal_signed_only",
            "open_signed_only",
            "md5",
            "store_sender",
            "store_receiver",
            "durable_file",
        )
    ]
    rows.append(
        f"  floor: 3 hops + seal + open + both sides' stores = {line['floor_ms']:.2f} ms; "
        f"{line['cores']} cores: at most {line['ceiling_mb_s']} MB/s"
    )
    if "ceiling_ratio" in line:
        rows.append(f"  against the peer's {line['peer_mb_s']} MB/s: {line['ceiling_ratio']}x")
    rows.append(
        f"  least any design does: 3 hops + MD5 on each side + a durable file write on "
        f"each side = {line['least_ms']:.2f} ms; at most {line['least_ceiling_mb_s']} MB/s"
    )
    if "least_ceiling_ratio" in line:
        rows.append(
            f"  against the peer's {line['peer_mb_s']} MB/s: {line['least_ceiling_ratio']}x"
        )
    return "\n".join(rows)
