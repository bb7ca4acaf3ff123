"""What a store of a mirrored database records and numbers (R-ROUTE-16; docs/design.md
"Mirroring: units of work shipped to the partner").

A :class:`Replica` is attached to the :class:`~brokerd.storage.store.Store` of a
mirrored database only; a store without one records nothing (the hot path of
every other database pays one ``is None`` test per transaction).

* As **principal** the committer records every write its transaction makes (the
  statements of the jobs and the writes of their functions, in execution order),
  numbers the transaction with the next log sequence number (LSN), stores that
  number and the epoch in the file in the same transaction (``meta`` keys
  ``mirror_lsn``, ``mirror_lsn_epoch``) and hands the recorded :class:`Unit` to
  the event loop with the batch. The writes are encoded for the mirror as they are
  recorded (:class:`~protocol.mirroring.StatementsEncoder`), within the bounds a mirror
  decodes: a transaction beyond one is not committed (:class:`Unshippable`), so no
  committed unit is one its mirror would refuse. The mirroring service ships it and, while a mirror
  is attached (or always, in ``stall`` mode), holds the batch's callbacks until
  the mirror confirms the LSN: nothing that reveals the commit (an acknowledgement,
  a client reply, an outgoing message) leaves before that.
* As **mirror** the file changes only by what the principal ships: a group-commit
  transaction that would write anything but the partner's own role and epoch fails
  with :class:`~brokerd.errors.StoreError` (the fence of R-ROUTE-15, applied to the
  file itself); the shipped units are applied by :meth:`Store.apply_unit`.
* At **start** the configuration's catalog is written outside the group commit
  (``Store.execute_now``): on a principal as a unit like the others, kept in
  :attr:`Replica.opened_units` for the partner to ship; on a mirror not at all
  (``Database.open``: its promotion writes it).

The role and epoch are read, in the committer thread, from the database's
in-memory image through ``role`` and ``epoch`` (plain attribute reads).
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from brokerd.storage.schema import WRITE_META
from protocol.errors import LocalProtocolError
from protocol.mirroring import StatementsEncoder

OWN_META_KEYS = frozenset({"mirror_role", "mirror_epoch", "mirror_lsn", "mirror_lsn_epoch"})
"""``meta`` keys each partner keeps for itself: never shipped, never fenced."""
_META_PREFIX = WRITE_META.partition(" VALUES")[0]


@dataclass(frozen=True, slots=True)
class Unit:
    """One committed transaction of a mirrored database: its writes, encoded as the mirror
    replays them (:func:`protocol.mirroring.encode_statements`)."""

    lsn: int
    epoch: int
    data: bytes


Sink = Callable[[list[Unit], int, Callable[[], None], Callable[[BaseException], None]], None]


class FencedWrite(Exception):
    """A write attempted in a mirror's group commit (turned into a StoreError per job)."""


class Unshippable(Exception):
    """A principal's transaction whose unit of work a mirror would refuse (beyond a bound of
    :func:`protocol.mirroring.decode_statements`): rolled back, and turned into a
    StoreError per job (a group commit is tried again one job at a time)."""


@dataclass
class Replica:
    role: Callable[[], str | None]
    epoch: Callable[[], int]
    lsn: int = 0
    """The last LSN committed in this file (read at open; then owned by the committer)."""
    lsn_epoch: int = 0
    """The epoch at which that unit was written."""
    opened_at: tuple[int, int] = (0, 0)
    """(LSN, epoch) of the file's last unit when the store opened it."""
    opened_units: list[Unit] = field(default_factory=list)
    """Units committed as the database opened (the configuration's catalog,
    ``Store.execute_now``), outside the group commit: the partner keeps them for its
    mirror (``Partner.opened``)."""
    sink: Sink | None = field(default=None)
    """Told on the event loop, for every committed batch: its units, the LSN whose
    confirmation releases it, and how to release it (run its callbacks) or fail it. None:
    the batch is released at once."""

    def own(self, sql: str, params: Sequence[Any]) -> bool:
        """A write of this partner's own ``meta`` keys only (one row or a multi-row insert)."""
        return (
            sql.startswith(_META_PREFIX)
            and bool(params)
            and all(key in OWN_META_KEYS for key in params[0::2])
        )


_WRITTEN_TABLE = re.compile(
    r"\s*(?:DELETE\s+FROM|INSERT(?:\s+OR\s+\w+)?\s+INTO|UPDATE)\s+(\w+)", re.IGNORECASE
)


def written_tables(statements: Iterable[tuple[str, Sequence[Any]]]) -> list[str]:
    """The tables ``statements`` write, in the order first written."""
    tables: dict[str, None] = {}
    for sql, _ in statements:
        found = _WRITTEN_TABLE.match(sql)
        if found is not None:
            tables.setdefault(found.group(1), None)
    return list(tables)


def contents(conn: sqlite3.Connection, tables: Sequence[str]) -> list[Counter[tuple[Any, ...]]]:
    """The rows of ``tables`` (small ones: the catalog), each table's as a multiset."""
    return [
        Counter(tuple(row) for row in conn.execute(f"SELECT * FROM {table}")) for table in tables
    ]


class Recorder:
    """A stand-in for the connection during one transaction of a mirrored database.

    Records each write (not SELECT) in execution order, encoded for the mirror, before it
    runs: :class:`Unshippable` once the unit would be beyond what a mirror takes. On a
    mirror it refuses every write (:class:`FencedWrite`)."""

    __slots__ = ("_conn", "_fenced", "_replica", "encoder")

    def __init__(self, conn: sqlite3.Connection, replica: Replica, fenced: bool) -> None:
        self._conn = conn
        self._replica = replica
        self._fenced = fenced
        self.encoder = StatementsEncoder()

    def _note(self, sql: str, params: Sequence[Any]) -> None:
        if sql.lstrip()[:6].upper() == "SELECT" or self._replica.own(sql, params):
            return
        if self._fenced:
            raise FencedWrite(sql)
        try:
            self.encoder.add(sql, params)
        except LocalProtocolError as exc:
            raise Unshippable(str(exc)) from None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        self._note(sql, params)
        return self._conn.execute(sql, params)

    def executemany(self, sql: str, seq: Any) -> sqlite3.Cursor:
        rows = [tuple(row) for row in seq]
        for row in rows:
            self._note(sql, row)
        return self._conn.executemany(sql, rows)
