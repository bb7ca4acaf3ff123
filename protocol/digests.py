"""The MD5 signatures of several frames at once (SPEC R-DLG-8).

Every protected frame carries the MD5 of its payload. MD5 runs one step after another
within a buffer, at about 750 MB/s on a current x86-64 core; for a large message that
is a third of each daemon's work. The MD5s of *several* buffers can run side by side,
each in a lane of one SIMD register: ``protocol._md5lanes`` (C, built by ``./dev setup``
where a C compiler is found) hashes 16 buffers at a time with AVX-512, 8 with AVX2, 4
with SSE2, at 2 to 6 times the rate of one stream. A large message leaves as several
frames (:meth:`protocol.connection.BrokerConnection.send_fragments`) and arrives several
to a read, so their signatures are taken together.

Without the compiled module (another platform, no compiler, or :func:`use_lanes`
turned off) every digest is ``hashlib``'s, one at a time: the same bytes, the pure path.
The digests are the same either way; ``tests/protocol/test_digests.py`` checks both
against each other and against RFC 1321's vectors.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Sequence
from types import ModuleType

from protocol.buffers import Buffer


def _load() -> ModuleType | None:
    try:
        return importlib.import_module("protocol._md5lanes")
    except ImportError:  # not built: hashlib alone
        return None


_native = _load()

COMPILED = _native is not None
"""Whether the lanes module was built and loaded."""
KINDS: tuple[str, ...] = tuple(_native.KINDS) if _native is not None else ()
"""The kinds of lanes this CPU has, widest first (``avx512``, ``avx512vl``, ``avx2``,
``avx512vl-4``, ``sse2``); empty without the compiled module."""

_lanes: ModuleType | None = _native if KINDS else None


def lanes() -> bool:
    """Whether several buffers are hashed at once (the module is there and on)."""
    return _lanes is not None


def use_lanes(on: bool) -> None:
    """Turn the lanes off (the pure path, ``hashlib`` only) or back on, where built."""
    global _lanes
    _lanes = _native if on and KINDS else None


def md5_each(payloads: Sequence[Buffer], kind: str = "") -> list[bytes]:
    """The MD5 of each buffer, in order: in lanes when there are two or more and the
    lanes are on (those of ``kind`` if given: tests and benchmarks), else one at a time."""
    native = _lanes
    if kind:
        if native is None:
            raise ValueError(f"MD5 lanes of kind {kind!r} are not available")
        forced: list[bytes] = native.digest(payloads, kind)
        return forced
    if native is None or len(payloads) < 2:
        return [hashlib.md5(p, usedforsecurity=False).digest() for p in payloads]
    digests: list[bytes] = native.digest(payloads)
    return digests
