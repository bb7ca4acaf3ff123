"""A database file as a witness of what it committed, for the trace audit (R-TRACE-2).

Owns :func:`endpoint_sequences`: read-only, it lists each conversation endpoint of a
database file with the last sequence number it sent (``send_sequence``: its SENDs
committed through it) and the last one it received in order (``receive_sequence``:
every message through it is delivered). ``brokerd analyze --database FILE`` hands
these rows to the audit (:mod:`brokerd.analytics.audit`), which takes them as proof of
a SEND or a delivery whose trace event a crash took. Read the file of a stopped
daemon, or a copy: a running one may have moved on.

May import: nothing of brokerd.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

READ_ENDPOINT_SEQUENCES = (
    "SELECT conversation_id, is_initiator, send_sequence, receive_sequence "
    "FROM conversation_endpoints"
)

EndpointSequences = tuple[str, bool, int, int]
"""(conversation id, the endpoint is the initiator, sent through, received through)."""


def endpoint_sequences(path: Path) -> list[EndpointSequences]:
    """Every endpoint of the database file ``path``, opened read-only."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute(READ_ENDPOINT_SEQUENCES).fetchall()
    finally:
        conn.close()
    return [(str(c), bool(i), int(s), int(r)) for c, i, s, r in rows]
