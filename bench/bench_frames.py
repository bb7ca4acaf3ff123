"""Micro-benchmark of the adjacent-broker frame path (issue: 100,000 small frames/s/core).

Measures build + protect + parse + verify of FRAGMENT frames through two real
sans-I/O BrokerConnection objects (handshake done, real session keys), in one
thread (= one core), for 200 B and 64 KiB payloads, encrypted and signed-only:

* ``frame``: ``a.receive_data(i.send(Fragment(payload)))`` once per frame;
* ``frame, batch 64``: 64 frames sealed, then parsed from one ``receive_data``
  call (what a TCP read of a busy connection hands over);
* ``+dialog``: additionally encodes and decodes the dialog message header
  (``protocol.dialog``), i.e. the whole per-fragment protocol cost.

Usage: python bench/bench_frames.py [--seconds 1.5] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import time
import uuid
from collections.abc import Callable

from brokerd.tools.certs import create_ca, identity_for, issue_instance
from protocol import BrokerConnection, ConnectionSettings, EncryptionMode, Role
from protocol.dialog import DialogHeader, MessageFlags, decode_fragment, encode_fragment
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


def run(seconds: float) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    header = DialogHeader(
        conversation_id=uuid.uuid4(),
        from_service="//Adventure-Works.com/Expenses",
        to_service="//Adventure-Works.com/Accounting",
        from_broker_instance=uuid.uuid4(),
        contract="//Adventure-Works.com/Expenses/ExpenseSubmission",
        message_type="//Adventure-Works.com/Expenses/SubmitExpense",
        flags=MessageFlags.SEQUENCED | MessageFlags.INITIATOR,
        sequence_number=1,
    )
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="time per measurement")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
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
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"python": platform.python_version(), "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
