"""A RECEIVE's reply: the rows in the meta (each body's length instead of the body), the
bodies after, cut to what one frame carries.

SPEC R-DLG-1: the engine removes only the rows the reply can carry, so it asks a
:class:`ReceiveReply` (its budget, called in the store's thread before anything is
removed) how many fit. The budget builds and encodes the reply's meta to answer, and
the reply sends those very bytes: the rows are turned into the meta once, not once to
be measured and again to be sent.

May import: ``protocol``.
"""

from __future__ import annotations

import operator
from typing import Any

from protocol.client_wire import DEFAULT_MAX_BODY, MAX_META_BYTES, encode_meta

Row = dict[str, Any]

RECEIVE_META_LIMIT = MAX_META_BYTES - 4096
"""What a RECEIVE reply's meta may take (the frame limit, less a margin for the two JSON
encoders' float spellings)."""
RECEIVE_BODY_LIMIT = DEFAULT_MAX_BODY
"""What a RECEIVE reply's body may take: the SDK reader's limit on a frame body."""

_EMPTY = len(b'{"messages":[]}')


def reply_row(row: Row) -> Row:
    """A RECEIVE row as the reply's meta lists it: the body's length instead of the body."""
    out = row.copy()  # a C-level copy; the keys keep their order, body_length comes last
    out["body_length"] = len(out.pop("message_body"))
    return out


class ReceiveReply:
    """One RECEIVE's budget, then its reply.

    Called with the rows the engine read (in the store's thread), it answers how many
    leading rows one reply carries and keeps their meta; :meth:`encode` then gives the
    reply for the rows the engine returns, from what it kept when they are those rows.
    """

    __slots__ = ("_meta_json", "_meta_rows", "_rows")

    def __init__(self) -> None:
        self._rows: list[Row] = []
        self._meta_rows: list[Row] = []
        self._meta_json: bytes | None = None

    def __call__(self, rows: list[Row]) -> int:
        meta_rows = [reply_row(row) for row in rows]
        self._rows, self._meta_rows, self._meta_json = rows, meta_rows, None
        # The usual case, in one serialisation: the whole reply's meta is what the loop
        # below adds up (each row and a separator), so everything fits if the last would.
        if sum(len(row["message_body"]) for row in rows) <= RECEIVE_BODY_LIMIT:
            meta_json = encode_meta({"messages": meta_rows})
            if len(meta_json) + 1 <= RECEIVE_META_LIMIT:
                self._meta_json = meta_json
                return len(rows)
        meta, body = _EMPTY, 0
        for n, (row, meta_row) in enumerate(zip(rows, meta_rows, strict=True)):
            meta += len(encode_meta(meta_row)) + 1
            body += len(row["message_body"])
            if meta > RECEIVE_META_LIMIT or body > RECEIVE_BODY_LIMIT:
                return n
        return len(rows)

    def encode(self, rows: list[Row]) -> tuple[bytes, list[bytes]]:
        """The reply's meta (encoded) and bodies for ``rows``, the rows RECEIVE returned."""
        kept, n = self._rows, len(rows)
        if n <= len(kept) and all(map(operator.is_, rows, kept)):
            if n == len(kept) and self._meta_json is not None:
                meta_json = self._meta_json
            else:
                meta_json = encode_meta({"messages": self._meta_rows[:n]})
        else:  # rows the budget did not see (a RECEIVE that read again, say)
            meta_json = encode_meta({"messages": [reply_row(row) for row in rows]})
        return meta_json, [row["message_body"] for row in rows]
