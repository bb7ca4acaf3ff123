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
conversation id crosses the wire, where it stays random (version 4, :func:`random_id`),
as route spreading over equal routes (R-ROUTE-5) and trace sampling take it; so does a
conversation group's id.

**Random bytes from a pool.** Every ``os.urandom`` call lets go of the interpreter's
lock around its ``getrandom`` system call; on the event loop, with the committer or
the trace writer's thread waiting for that lock, getting it back can take up to the
switch interval (``brokerd.server.interpreter``). A new dialog took three such calls
(its handle, its conversation id, its group) on the sender and two (the handle and the
group) on the receiver, so the first messages of many conversations waited on the lock
(in W4's first seconds py-spy put 8 % of the receiver's samples in making handles).
The identifiers here take their bytes from a pool of :data:`POOL_BYTES` filled by one
``os.urandom`` call: the same kernel source, drawn in larger pieces, each byte handed
out once (a lock guards the pool; a forked child starts with an empty one).
"""

from __future__ import annotations

import operator
import os
import threading
import time
import uuid

__all__ = ["new_handle", "random_bytes", "random_id"]

_MS_BITS = 48
_RANDOM_LOW_BITS = 62
_RANDOM_HIGH_BITS = 12

POOL_BYTES = 4096
"""Bytes one ``os.urandom`` call puts in the pool: 256 version-4 ids, 409 handles."""

_lock = threading.Lock()
_pool = b""
_taken = 0


def _empty_pool() -> None:
    """In a forked child: no byte of the parent's pool, and a lock of its own (a thread of
    the parent may have held it at the fork, and that thread is not in the child)."""
    global _lock, _pool, _taken
    _lock = threading.Lock()
    _pool, _taken = b"", 0


os.register_at_fork(after_in_child=_empty_pool)


def random_bytes(count: int) -> bytes:
    """``count`` bytes from the kernel's random source, through the pool (more than
    :data:`POOL_BYTES` at once: straight from it): never the same byte twice."""
    global _pool, _taken
    count = operator.index(count)
    if count < 0:
        raise ValueError(f"a count of random bytes is not negative, not {count}")
    if count > POOL_BYTES:
        return os.urandom(count)
    with _lock:
        start = _taken
        if start + count > len(_pool):
            _pool, start = os.urandom(POOL_BYTES), 0
        _taken = start + count
        return _pool[start : start + count]


def new_handle() -> uuid.UUID:
    """A conversation handle: time first (milliseconds), then 74 random bits."""
    ms = time.time_ns() // 1_000_000 & ((1 << _MS_BITS) - 1)
    rand = int.from_bytes(random_bytes(10), "big")
    high = rand >> _RANDOM_LOW_BITS & ((1 << _RANDOM_HIGH_BITS) - 1)
    low = rand & ((1 << _RANDOM_LOW_BITS) - 1)
    return uuid.UUID(int=ms << 80 | 0x7 << 76 | high << 64 | 0b10 << 62 | low)


def random_id() -> uuid.UUID:
    """A random identifier, RFC 9562's version 4, as ``uuid.uuid4()`` makes it (from the
    pool's bytes): a conversation id or a conversation group's id."""
    return uuid.UUID(bytes=random_bytes(16), version=4)
