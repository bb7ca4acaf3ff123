"""The floor under W3: what the work every 1 MiB message requires costs on this machine.

``python -m bench floor`` measures, one at a time and in one thread, the CPU time of
each piece of work that carrying one 1 MiB message from a producer on A to a
consumer on B requires by design, whatever the code around it:

* **three TCP hops** over loopback (producer to A, A to B, B to consumer), each the
  kernel's copies on both ends;
* **sealing and opening** its 64 KiB fragments (R-DLG-8: an MD5 signature of the
  content under the session key; AES-GCM encryption by default), with the
  protocol's own :class:`~protocol.security.FrameSealer` and ``FrameOpener``;
* **the sender's SQLite work**: the transmission queue row inserted and committed,
  then deleted and committed when acknowledged (WAL, ``synchronous=FULL``, the
  store's page size);
* **the receiver's SQLite work**: the fragments inserted and committed as they
  arrive, then read, deleted and committed by RECEIVE.

Their sum is a floor on the CPU per message of the four processes together, and two
cores divided by it is a ceiling on W3's MB/s that no Python code around this work
can beat. ``--peer-mb-s`` sets the peer's W3 figure of the same sitting, to print
the ceiling as a ratio.

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
from pathlib import Path
from typing import Any

from brokerd.storage import queries
from brokerd.storage.store import connect
from protocol.fragments import DEFAULT_FRAGMENT_SIZE
from protocol.frames import DEFAULT_MAX_FRAME_SIZE, HEADER_SIZE, FrameType, decode_header
from protocol.security import FrameOpener, FrameSealer

MIB = 1 << 20


def cpu_ms(step: Callable[[], None], iterations: int) -> float:
    """CPU time (every thread of this process, user and system) of one ``step``, in ms."""
    step()  # warm up: caches, the file's first pages
    start = time.process_time()
    for _ in range(iterations):
        step()
    return (time.process_time() - start) / iterations * 1000


def _pieces(body: bytes) -> list[bytes]:
    return [body[i : i + DEFAULT_FRAGMENT_SIZE] for i in range(0, len(body), DEFAULT_FRAGMENT_SIZE)]


def sealing(body: bytes, encrypt: bool, iterations: int) -> tuple[float, float]:
    """CPU ms to seal ``body``'s fragments, and to open them."""
    key = os.urandom(32)
    sealer, opener = FrameSealer(key, encrypt, 1), FrameOpener(key, encrypt)
    pieces = _pieces(body)
    kind = FrameType.FRAGMENT
    frames = [sealer.seal(kind, piece, n) for n, piece in enumerate(pieces)]

    def seal() -> None:
        for n, piece in enumerate(pieces):
            sealer.seal(kind, piece, n)

    def open_() -> None:
        for frame in frames:
            head = frame[:HEADER_SIZE]
            header = decode_header(head, DEFAULT_MAX_FRAME_SIZE)
            opener.open(header, head, frame[HEADER_SIZE:])

    return cpu_ms(seal, iterations), cpu_ms(open_, iterations)


def tcp_hop(body: bytes, iterations: int) -> float:
    """CPU ms of one TCP hop of ``body`` over loopback: sending and receiving it."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname())
        receiver, _ = server.accept()
        buffer = memoryview(bytearray(len(body)))

        def hop() -> None:
            thread = threading.Thread(target=sender.sendall, args=(body,))
            thread.start()
            got = 0
            while got < len(body):
                got += receiver.recv_into(buffer[got:], len(body) - got)
            thread.join()

        try:
            return cpu_ms(hop, iterations)
        finally:
            sender.close()
            receiver.close()


def _database(directory: Path, name: str) -> sqlite3.Connection:
    conn = connect(directory / f"{name}.db")
    for step in queries.MIGRATIONS:
        for sql in step.script.split(";"):
            if sql.strip():
                conn.execute(sql)
    return conn


def _committed(conn: sqlite3.Connection, *statements: tuple[str, Any], many: bool = False) -> None:
    conn.execute("BEGIN IMMEDIATE")
    for sql, params in statements:
        if many:
            conn.executemany(sql, params)
        else:
            conn.execute(sql, params)
    conn.execute("COMMIT")


def sqlite_sender(directory: Path, body: bytes, iterations: int) -> float:
    """CPU ms of the sender's rows: ``body`` into the transmission queue and committed,
    then deleted and committed (its acknowledgement)."""
    conn = _database(directory, "sender")
    handle, numbers = str(uuid.uuid4()), iter(range(1, 1 << 62))

    def step() -> None:
        seq = next(numbers)
        _committed(
            conn,
            (
                "INSERT INTO transmission_queue VALUES (?, ?, ?, ?, ?, ?)",
                (handle, seq, "large", 3, body, time.time()),
            ),
        )
        _committed(
            conn,
            (
                "DELETE FROM transmission_queue "
                "WHERE conversation_handle = ? AND message_sequence_number = ?",
                (handle, seq),
            ),
        )

    try:
        return cpu_ms(step, iterations)
    finally:
        conn.close()


def sqlite_receiver(directory: Path, body: bytes, iterations: int) -> float:
    """CPU ms of the receiver's rows: ``body``'s fragments stored and committed, then
    read, joined, deleted and committed (RECEIVE)."""
    conn = _database(directory, "receiver")
    handle, numbers = str(uuid.uuid4()), iter(range(1, 1 << 62))
    pieces = _pieces(body)

    def step() -> None:
        seq = next(numbers)
        rows = [
            (handle, seq, n, n * DEFAULT_FRAGMENT_SIZE, piece) for n, piece in enumerate(pieces)
        ]
        _committed(conn, ("INSERT INTO message_fragments VALUES (?, ?, ?, ?, ?)", rows), many=True)
        conn.execute("BEGIN IMMEDIATE")
        key = (handle, seq)
        read = conn.execute(
            "SELECT data FROM message_fragments WHERE conversation_handle = ? "
            "AND message_sequence_number = ? ORDER BY fragment_index",
            key,
        ).fetchall()
        assert len(b"".join(row[0] for row in read)) == len(body)
        conn.execute(
            "DELETE FROM message_fragments "
            "WHERE conversation_handle = ? AND message_sequence_number = ?",
            key,
        )
        conn.execute("COMMIT")

    try:
        return cpu_ms(step, iterations)
    finally:
        conn.close()


def cores() -> int:
    return len(os.sched_getaffinity(0))


def measure(
    iterations: int = 100, directory: Path | None = None, peer_mb_s: float | None = None
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
            "sqlite_sender": sqlite_sender(work, body, iterations),
            "sqlite_receiver": sqlite_receiver(work, body, iterations),
        }
    floor = (
        3 * pieces["tcp_hop"]
        + pieces["seal"]
        + pieces["open"]
        + pieces["sqlite_sender"]
        + pieces["sqlite_receiver"]
    )
    n = cores()
    ceiling = n * MIB / 1e6 / (floor / 1000)
    line: dict[str, Any] = {
        "what": "W3 floor: CPU ms per 1 MiB message",
        "iterations": iterations,
        **{k: round(v, 3) for k, v in pieces.items()},
        "floor_ms": round(floor, 3),
        "cores": n,
        "ceiling_mb_s": round(ceiling, 1),
    }
    if peer_mb_s:
        line["peer_mb_s"] = peer_mb_s
        line["ceiling_ratio"] = round(ceiling / peer_mb_s, 2)
    return line


def describe(line: dict[str, Any]) -> str:
    rows = [f"{line['what']} ({line['iterations']} iterations each):"]
    rows += [
        f"  {name:<18} {line[name]:8.3f} ms"
        for name in (
            "tcp_hop",
            "seal",
            "open",
            "seal_signed_only",
            "open_signed_only",
            "sqlite_sender",
            "sqlite_receiver",
        )
    ]
    rows.append(
        f"  floor: 3 hops + seal + open + both sides' SQLite = {line['floor_ms']:.2f} ms; "
        f"{line['cores']} cores: at most {line['ceiling_mb_s']} MB/s"
    )
    if "ceiling_ratio" in line:
        rows.append(f"  against the peer's {line['peer_mb_s']} MB/s: {line['ceiling_ratio']}x")
    return "\n".join(rows)
