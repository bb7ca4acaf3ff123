"""How the server hands many buffers to a socket: large ones as they are, small ones
joined.

A reply or a pump round can be many buffers: the bodies of a RECEIVE, the frames
of a round. Joining them all copies every byte once more (for 1 MiB bodies, a
reply-sized copy whose pages fault in); writing them all as separate pieces makes a
``writev`` of thousands of tiny pieces for small messages. :func:`coalesce` does
both: consecutive small pieces are joined, large ones kept, so the socket gets a
few pieces and no large body is copied.

May import: ``protocol`` (the buffer type).
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol.client_wire import Buffer

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
