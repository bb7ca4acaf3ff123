"""The clean-up of closed endpoints, driven by the engine's tick (SPEC §5, Decision).

:class:`Cleanup` asks :class:`~brokerd.dialogs.endpoints.closing.ClosedEndpoints` which
closed endpoints may go, removes them from memory at once (nothing finds them any
more), and deletes their rows from their database's file in one store job per database
and pass (:func:`brokerd.storage.queries.forget_conversations`), which joins the next
group commit: never one commit per endpoint.

A kill -9 at any point loses nothing and leaves nothing for ever: the job is one
transaction, so an endpoint's rows are either all gone or all there; an endpoint still
in the file is recovered in ``CD`` at the next start and removed again (a target's keep
then counts from that start). A job that fails is tried again at the next pass.

An endpoint that comes due while its database's job has not committed yet waits for
that commit, then goes with the next job: its keep is over, it does not begin again
(SPEC §5: a target keeps its closed endpoint ``closed_endpoint_keep``, not twice that).
A job holds at most :data:`BATCH` endpoints, those of a failed job tried again included,
so a file that fails for a while does not make the next job ever larger.

May import: ``brokerd.dialogs.transmission``, ``brokerd.dialogs.endpoints`` and what they
may import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from brokerd.dialogs.endpoints.closing import ClosedEndpoints
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.directory import Directory
from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.endpoints.states import State
from brokerd.dialogs.endpoints.stats import EngineStats
from brokerd.dialogs.transmission.transmission import Transmission
from brokerd.errors import StoreError
from brokerd.storage import queries
from brokerd.storage.schema import Statement

log = logging.getLogger("brokerd.dialogs.cleanup")

CLEANUP_EVERY = 1.0
"""Seconds between two passes of the clean-up."""
SWEEP_EVERY = 60.0
"""Seconds between two sweeps that look at every endpoint for a closed one not yet
watched (closed by a path that did not tell :class:`ClosedEndpoints`, or recovered by a
promoted mirror): a backstop, so none is kept for ever."""
BATCH = 2000
"""Endpoints removed at most per pass (the rows of one store job per database)."""


class Cleanup:
    """Closed endpoints removed from memory and from their files, in batches."""

    def __init__(
        self,
        directory: Directory,
        closing: ClosedEndpoints,
        transmission: Transmission,
        stats: EngineStats,
        clock: Callable[[], float],
    ) -> None:
        self.directory = directory
        self.closing = closing
        self.transmission = transmission
        self.stats = stats
        self._clock = clock
        self._last_pass = 0.0
        self._last_sweep = clock()
        self._in_flight: set[str] = set()
        """Databases whose clean-up job has not committed yet: one at a time each."""
        self._retry: dict[str, list[str]] = {}
        """Handles, by database, whose deletion failed: their rows go with the next job."""
        self._held: dict[str, list[Endpoint]] = {}
        """Endpoints due, by database, that wait for its job in flight (or for room in a
        job): removed at the next pass that may, without their keep counting again."""

    def watch_all(self) -> None:
        """Every closed endpoint of every database is watched (at start, by a sweep)."""
        for db in self.directory.databases.values():
            for ep in db.endpoints.values():
                if ep.state is State.CLOSED:
                    self.closing.watch(ep)

    def tick(self, now: float) -> None:
        """The engine's tick: a pass every :data:`CLEANUP_EVERY` seconds."""
        if now - self._last_pass < CLEANUP_EVERY:
            return
        self._last_pass = now
        if now - self._last_sweep >= SWEEP_EVERY:
            self._last_sweep = now
            self.watch_all()
        by_db: dict[str, list[Endpoint]] = {}
        for ep in self.closing.due(BATCH):
            by_db.setdefault(ep.database, []).append(ep)
        for name in (*self._retry, *self._held):
            by_db.setdefault(name, [])
        for name, eps in by_db.items():
            db = self.directory.databases.get(name)
            if db is None:
                self._held.pop(name, None)
                continue
            self._remove(db, eps)

    def _remove(self, db: Database, eps: list[Endpoint]) -> None:
        held = self._held.pop(db.name, [])
        if db.sends_nothing:
            for ep in (*held, *eps):
                self.closing.watch(ep)  # a mirror's file changes only by what is shipped
            return
        held += eps
        if db.name in self._in_flight:
            self._held[db.name] = held  # due: they go once that job is done (SPEC §5)
            return
        gone: list[str] = self._retry.pop(db.name, [])
        room = max(0, BATCH - len(gone))
        if len(held) > room:
            self._held[db.name] = held[room:]
        for ep in held[:room]:
            if db.endpoints.get(ep.handle) is not ep or ep.state is not State.CLOSED:
                continue  # removed another way meanwhile (WITH CLEANUP, an image dropped)
            db.remove_endpoint(ep)
            self.transmission.discard(ep)
            gone.append(ep.handle_text)
        if not gone:
            return
        statements: list[Statement] = queries.forget_conversations(gone)
        statements += [(queries.ENDPOINT_DELETE, (h,)) for h in gone]
        self._in_flight.add(db.name)

        def committed() -> None:
            self._in_flight.discard(db.name)
            self.stats.closed_endpoints_removed += len(gone)

        def failed(exc: BaseException) -> None:
            self._in_flight.discard(db.name)
            log.error("removing %d closed endpoints from %s failed: %s", len(gone), db.name, exc)
            self._retry.setdefault(db.name, []).extend(gone)

        try:
            db.store.submit(statements, on_commit=committed, on_failure=failed)
        except StoreError as exc:  # shutting down: the next start removes them
            failed(exc)
