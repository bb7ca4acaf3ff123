"""The body every benchmark message carries, as the peer's benchmark does: its index
in the run and its send time, then padding up to the body size.

The send time is ``time.monotonic_ns()`` (CLOCK_MONOTONIC, one clock for every process
on the host), taken just before the SEND is written, so a consumer in another process
computes the latency of each message as its own receive time minus this value.
"""

from __future__ import annotations

import struct

HEADER = struct.Struct("<QQ")
"""(index within the run, send time in CLOCK_MONOTONIC nanoseconds)."""


def padding(size: int) -> bytes:
    """What follows the header in a body of ``size`` bytes."""
    if size < HEADER.size:
        raise ValueError(f"a body holds at least {HEADER.size} bytes, not {size}")
    return b"." * (size - HEADER.size)


def body(index: int, sent_ns: int, pad: bytes) -> bytes:
    return HEADER.pack(index, sent_ns) + pad


def header(data: bytes) -> tuple[int, int] | None:
    """(index, send time) of a body, or None when it is too short to be one of ours."""
    if len(data) < HEADER.size:
        return None
    index, sent_ns = HEADER.unpack_from(data)
    return int(index), int(sent_ns)
