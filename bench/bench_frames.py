"""Micro-benchmark of the adjacent-broker frame path: small frames a second on one core,
and the CPU a large message costs on each side of a link.

Measures build + protect + parse + verify of FRAGMENT frames through two real
sans-I/O BrokerConnection objects (handshake done, real session keys), in one
thread (= one core), for 200 B and 64 KiB payloads, encrypted and signed-only:

* ``frame``: ``a.receive_data(i.send(Fragment(payload)))`` once per frame;
* ``frame, batch 64``: 64 frames sealed, then parsed from one ``receive_data``
  call (what a TCP read of a busy connection hands over);
* ``+dialog``: additionally encodes and decodes the dialog message header
  (``protocol.dialog``), i.e. the whole per-fragment protocol cost;
* ``link, 1 MiB``: a 1 MiB message as a link carries it (W3's): sixteen 64 KiB
  fragments framed from views of the body by ``send_fragments``, and on the other
  side fed in 256 KiB reads and decoded; CPU ms per MiB on each side, beside the MD5
  and AES-GCM of the same bytes alone (``least``), which no framing goes below.

Usage: python bench/bench_frames.py [--seconds 1.5] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import time
import uuid
from collections.abc import Callable

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from brokerd.server.allocator import tune_allocator
from brokerd.tools.certs import create_ca, identity_for, issue_instance
from protocol import BrokerConnection, ConnectionSettings, EncryptionMode, Role
from protocol.dialog import (
    DialogHeader,
    MessageFlags,
    decode_fragment,
    encode_fragment,
    fragment_pieces,
)
from protocol.events import Fragment


def _pair(mode: EncryptionMode) -> tuple[BrokerConnection, BrokerConnection]:
    now = dt.datetime.now(dt.UTC)
    ca = create_ca("bench CA")
    i = BrokerConnection(
        Role.INITIATOR,
        ConnectionSettings(identity_for(issue_instance(ca, "alpha"), ca), encryption=mode),
        now,
    )
    a = BrokerConnection(
        Role.ACCEPTOR,
        ConnectionSettings(identity_for(issue_instance(ca, "beta"), ca), encryption=mode),
        now,
    )
    a.receive_data(i.start())
    i.receive_data(a.data_to_send())
    a.receive_data(i.data_to_send())
    i.receive_data(a.data_to_send())
    return i, a


def _rate(step: Callable[[], int], seconds: float) -> float:
    """Frames per second of ``step`` (which returns the frames it handled)."""
    step()  # warm up
    frames = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        frames += step()
    return frames / (time.perf_counter() - start)


def _steps(
    i: BrokerConnection, a: BrokerConnection, payload: bytes, header: DialogHeader
) -> list[tuple[str, Callable[[], int]]]:
    """The three measured paths for one connection pair and payload."""
    event = Fragment(payload)

    def single() -> int:
        for _ in range(100):
            a.receive_data(i.send(event))
        return 100

    def batch() -> int:
        data = b"".join([i.send(event) for _ in range(64)])
        assert len(a.receive_data(data)) == 64
        return 64

    def dialog() -> int:
        for _ in range(100):
            (got,) = a.receive_data(i.send(Fragment(encode_fragment(header, payload))))
            assert isinstance(got, Fragment)
            decode_fragment(got.payload)
        return 100

    return [("frame", single), ("frame, batch 64", batch), ("+dialog", dialog)]


_HEADER = DialogHeader(
    conversation_id=uuid.uuid4(),
    from_service="//Adventure-Works.com/Expenses",
    to_service="//Adventure-Works.com/Accounting",
    from_broker_instance=uuid.uuid4(),
    contract="//Adventure-Works.com/Expenses/ExpenseSubmission",
    message_type="//Adventure-Works.com/Expenses/SubmitExpense",
    flags=MessageFlags.SEQUENCED | MessageFlags.INITIATOR,
    sequence_number=1,
)


def run(seconds: float) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    header = _HEADER
    for size in (200, 64 * 1024):
        payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
        dialog_header = header._replace(message_length=size)
        for mode in (EncryptionMode.REQUIRED, EncryptionMode.DISABLED):
            i, a = _pair(mode)
            for label, step in _steps(i, a, payload, dialog_header):
                rate = _rate(step, seconds)
                rows.append(
                    {
                        "payload_bytes": size,
                        "mode": "encrypted" if mode is EncryptionMode.REQUIRED else "signed",
                        "path": label,
                        "frames_per_second": round(rate),
                        "mib_per_second": round(rate * size / 2**20, 1),
                    }
                )
    return rows


MIB = 1 << 20
LINK_FRAGMENT = 64 * 1024
LINK_READ = 256 * 1024
"""A 1 MiB message's fragments, and the reads the receiving side gets them in."""


def link(header: DialogHeader, messages: int) -> dict[str, object]:
    """CPU ms per MiB of a 1 MiB message sent and received over an encrypted link."""
    i, a = _pair(EncryptionMode.REQUIRED)
    body = bytes(range(256)) * (MIB // 256)
    view = memoryview(body)
    count = MIB // LINK_FRAGMENT
    headers = [
        header._replace(
            message_length=MIB,
            fragment_index=n,
            fragment_count=count,
            fragment_offset=n * LINK_FRAGMENT,
        )
        for n in range(count)
    ]

    def send() -> bytes:
        pieces = [
            fragment_pieces(h, view[n * LINK_FRAGMENT : (n + 1) * LINK_FRAGMENT])
            for n, h in enumerate(headers)
        ]
        return b"".join(i.send_fragments(pieces))  # the join stands for the socket's copy

    def receive(wire: bytes) -> None:
        got = 0
        for at in range(0, len(wire), LINK_READ):
            for event in a.receive_data(wire[at : at + LINK_READ]):
                assert isinstance(event, Fragment)
                got += len(decode_fragment(event.payload)[1])
        assert got == MIB

    aead = AESGCM(os.urandom(32))

    def least() -> None:
        for n in range(count):
            piece = view[n * LINK_FRAGMENT : (n + 1) * LINK_FRAGMENT]
            hashlib.md5(piece, usedforsecurity=False).digest()
            aead.encrypt(os.urandom(12), piece, b"")

    for _ in range(5):
        receive(send())
        least()
    sending = receiving = smallest = 0.0
    for _ in range(messages):
        start = time.process_time()
        wire = send()
        sent = time.process_time()
        receive(wire)
        received = time.process_time()
        least()
        smallest += time.process_time() - received
        sending += sent - start
        receiving += received - sent
    per = 1000 / messages
    return {
        "path": "link, 1 MiB",
        "messages": messages,
        "send_ms_per_mib": round(sending * per, 2),
        "receive_ms_per_mib": round(receiving * per, 2),
        "least_ms_per_mib": round(smallest * per, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="time per measurement")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--messages", type=int, default=300, help="1 MiB messages, link path")
    args = parser.parse_args()
    tune_allocator()  # as a daemon does: large buffers reused, not faulted in again
    rows = run(args.seconds)
    print(
        f"{platform.python_implementation()} {platform.python_version()} on "
        f"{platform.machine()}, one thread, {args.seconds} s per row"
    )
    print(f"{'payload':>8} {'mode':>10} {'path':>16} {'frames/s':>10} {'MiB/s':>8}")
    for r in rows:
        print(
            f"{r['payload_bytes']:>8} {r['mode']:>10} {r['path']:>16} "
            f"{r['frames_per_second']:>10,} {r['mib_per_second']:>8}"
        )
    large = link(_HEADER, args.messages)
    print(
        f"link, 1 MiB messages ({large['messages']}), CPU ms per MiB: send "
        f"{large['send_ms_per_mib']}, receive {large['receive_ms_per_mib']}, "
        f"MD5 + AES-GCM alone {large['least_ms_per_mib']}"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {"python": platform.python_version(), "rows": rows, "link": large},
                handle,
                indent=2,
            )


if __name__ == "__main__":
    main()
