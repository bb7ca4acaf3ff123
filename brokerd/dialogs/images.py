"""A database's in-memory image, dropped, rebuilt and resumed as its mirror role changes
(R-ROUTE-15, R-ROUTE-16).

Owns what happens to the image of one database when this partner stops or starts being
its principal: the image dropped (its endpoints, outboxes, ready index and locks), the
image rebuilt from the file as recovery does at start, and its traffic resumed.

May import: ``brokerd.dialogs.router``, ``brokerd.dialogs.transmission``,
``brokerd.dialogs.endpoints`` and what they may import.
"""

from __future__ import annotations

from brokerd.dialogs.endpoints.begin_keys import BeginKeys
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.deadlines import Deadlines
from brokerd.dialogs.endpoints.poison import PoisonLedger
from brokerd.dialogs.router.router import Router
from brokerd.dialogs.transmission.transmission import Transmission
from brokerd.storage import queries
from brokerd.storage.catalog import Catalog, route_from_row
from brokerd.storage.schema import Statement


class DatabaseImages:
    """The in-memory images of mirrored databases, as roles change."""

    def __init__(self, transmission: Transmission, router: Router, deadlines: Deadlines) -> None:
        self.transmission = transmission
        self.router = router
        self.deadlines = deadlines

    def forget(self, db: Database) -> None:
        """A partner that is no longer principal drops its in-memory image of the database
        (R-ROUTE-15/16): its file now changes only by what the principal ships, so the
        image would only go stale (views listing messages long delivered, deadlines firing).
        Its endpoints lose their outbox (a connection still holding one of their fragments
        skips it), and their deadlines no longer match (``Delivery.fire_due`` checks the
        endpoint is the database's)."""
        db.image += 1
        for ep in list(db.endpoints.values()):
            self.transmission.forget(ep)
            db.remove_endpoint(ep)
        for index in db.ready.values():
            index.clear()
            index.locked.clear()
            index.leased.clear()
            index.aside.clear()
        db.poison = PoisonLedger()
        db.begin_keys = BeginKeys()
        db.next_local_seq = -1

    def resume(self, db: Database) -> None:
        """The database's traffic may flow again (a promotion, or a principal out of doubt,
        R-ROUTE-16): every routing decision is made again, every waiting message is
        transmitted and every acknowledgement owed is sent."""
        self.router.forget_decisions()
        for ep in db.endpoints.values():
            if ep.ack_version > ep.ack_sent_version:
                self.transmission.ack_needed(ep)
            if ep.has_unacknowledged:
                ep.route_link = None
                self.transmission.transmit(ep)

    async def rebuild(self, db: Database) -> list[Statement]:
        """R-ROUTE-16: a promoted mirror's in-memory image, rebuilt from its file as recovery
        does at start: its endpoints, unacknowledged messages, ready index, timers and
        lifetimes, routes created by the administrator and queue states are the ones the
        principal's shipped units wrote. Any image held before is dropped first
        (:meth:`forget`). Its timers and lifetimes are watched once it is the principal
        (:meth:`watch_deadlines`).

        Returns the writes that bring the file in line with the image (the configuration's
        catalog, a run-time route the configuration replaces, recovery's repairs), for the
        caller to submit once the database is the principal: until then its file changes
        only by what the principal ships, and a write is refused."""
        self.forget(db)
        self._reset_routes(db)
        for queue in db.catalog.queues.values():  # as a start finds them, before the file's
            queue.status = bool(queue.configured_status)
        for name, status, configured in await db.store.read(
            lambda conn: conn.execute(queries.READ_QUEUE_STATES).fetchall()
        ):
            info = db.catalog.queues.get(str(name))
            if info is not None:
                info.keep_altered(bool(status), None if configured is None else bool(configured))
        # the configuration's catalog, as a start writes it (a mirror's start wrote
        # nothing), if the file's differs
        catalog = db.catalog.persist()
        writes: list[Statement] = catalog if await db.store.changes(catalog) else []
        for row in await db.store.read(
            lambda conn: conn.execute(queries.READ_KEPT_ROUTES).fetchall()
        ):
            writes += db.keep_route(route_from_row(row))
        _, repairs = await db.read_image()
        writes += repairs
        for ep in db.endpoints.values():
            if ep.ack_version > ep.ack_sent_version:
                self.transmission.ack_needed(ep)
        for index in db.ready.values():
            index.changed.set()
        self.router.routes_changed(db)
        return writes

    def watch_deadlines(self, db: Database) -> None:
        """The timers and lifetimes of a promoted partner's rebuilt image (R-DLG-9,
        R-DLG-11), watched once the database is the principal: one due while it was still
        the mirror would write into a file that takes only what the principal ships, be
        refused, and come only when the failed write is tried again."""
        for ep in db.endpoints.values():
            self.deadlines.watch(ep)

    @staticmethod
    def _reset_routes(db: Database) -> None:
        """Before the routes that live in the file are read again: only the configuration's
        routes stay. A route created at run time and since dropped by the principal (its
        row deleted by a shipped unit) must not outlive the rebuild, nor a configuration
        route stay replaced by a run-time route of its name that is gone."""
        routes = db.catalog.routes
        for name in [name for name, route in routes.items() if route.source != "config"]:
            del routes[name]
        for name, route in Catalog.from_config(db.config).routes.items():
            routes.setdefault(name, route)
