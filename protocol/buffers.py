"""How many buffers go to a socket in one write: large ones as they are, small ones
joined.

A reply, a pump round or a client's pipelined requests can be many buffers: the
bodies of a RECEIVE, the frames of a round, the SENDs of one turn of the event
loop. Joining them all copies every byte once more (for 1 MiB bodies, a
reply-sized copy whose pages fault in); writing them all as separate pieces makes
a ``writev`` of thousands of tiny pieces for small messages. :func:`coalesce` does
both: consecutive small pieces are joined, large ones kept, so the socket gets a
few pieces and no large body is copied.

Pure (no I/O): the daemon's connections and the SDK write what it returns.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

Buffer = bytes | bytearray | memoryview

Body = bytes | bytearray
"""A message body as the daemon holds it: ``bytes``, or a ``bytearray`` that only its
message refers to (a large SEND body the client listener read in place, never changed
after)."""


def _blank_maker() -> Callable[[int], bytearray]:
    # CPython's C API: with no source, the new bytearray's bytes are left as they are. A
    # prototype of its own: the shared ctypes.pythonapi function object is left unchanged.
    prototype = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t)
    try:
        make = prototype(("PyByteArray_FromStringAndSize", ctypes.pythonapi))
    except AttributeError:  # not CPython
        return bytearray

    def blank(size: int) -> bytearray:
        made: bytearray = make(None, size)
        return made

    return blank


blank: Callable[[int], bytearray] = _blank_maker()
"""``blank(size)``: a ``bytearray`` of ``size`` bytes whose contents are undefined, for a
buffer that is written whole before any of it is read (a large body read in place).
``bytearray(size)`` writes ``size`` zeros first: for a 1 MiB SEND body, a pass over it
that the socket's write into it then repeats."""

LARGE = 64 * 1024
"""A piece at least this large is written as it is."""


def coalesce(pieces: Sequence[Buffer]) -> list[Buffer]:
    """``pieces`` with every run of pieces smaller than :data:`LARGE` joined into one."""
    out: list[Buffer] = []
    run: list[Buffer] = []
    for piece in pieces:
        if len(piece) < LARGE:
            run.append(piece)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else b"".join(run))
            run = []
        out.append(piece)
    if run:
        out.append(run[0] if len(run) == 1 else b"".join(run))
    return out
