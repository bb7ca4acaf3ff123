"""Row keys that sort in the order they were made: the conversation handles brokerd gives
its endpoints.

A handle keys an endpoint's rows in every table that holds them: its endpoint row
(through the primary-key index; the rows themselves are in the order they were
inserted), its transmission-queue and queue rows (with their sequence numbers), its
fragments and its timer. Random handles (version 4) scatter the rows of
conversations begun together over every page of those B-trees, so a commit that
writes a message each to a few hundred conversations dirties a page for nearly every
one of them, and each such page is written to the WAL and again by the checkpoint.

A handle here has the layout of RFC 9562's version 7: 48 bits of Unix time in
milliseconds first, then the version, 74 random bits and the variant. Its text, the
key, sorts in the order the handles were made, to the millisecond (within one, in
random order; a clock set back costs only locality), so the rows of conversations
begun together stay together. On the many-dialogs workload (``python -m bench run
--workload W4``, ``written_kb_per_msg``) the receiver wrote 11 kB to its files per
200-byte message instead of 20, and spent 6-8 % less CPU (docs/performance.md,
"Time-ordered conversation handles").

A handle is no capability (a client's token must own the conversation's service), and
now tells when its conversation began. Only local identifiers are made so: a
conversation id crosses the wire, where it stays random (version 4), as route
spreading over equal routes (R-ROUTE-5) and trace sampling take it.
"""

from __future__ import annotations

import os
import time
import uuid

__all__ = ["new_handle"]

_MS_BITS = 48
_RANDOM_LOW_BITS = 62
_RANDOM_HIGH_BITS = 12


def new_handle() -> uuid.UUID:
    """A conversation handle: time first (milliseconds), then 74 random bits."""
    ms = time.time_ns() // 1_000_000 & ((1 << _MS_BITS) - 1)
    rand = int.from_bytes(os.urandom(10), "big")
    high = rand >> _RANDOM_LOW_BITS & ((1 << _RANDOM_HIGH_BITS) - 1)
    low = rand & ((1 << _RANDOM_LOW_BITS) - 1)
    return uuid.UUID(int=ms << 80 | 0x7 << 76 | high << 64 | 0b10 << 62 | low)
