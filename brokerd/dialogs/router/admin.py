"""Route administration at run time: create, alter, drop (R-ROUTE-13).

Owns :class:`RouteAdmin`: the routes an administrator creates, alters and drops, checked
(a route of the configuration file is changed there), persisted in the database file,
then applied: decisions are made again and DELAYED
conversations re-routed at once (:meth:`RouteAdmin.routes_changed`). ``AutoCreatedLocal``
is an ordinary route here, as in SQL Server: dropped, R-ROUTE-4's later steps apply to
what it matched (in msdb: messages from outside reach only the services routed
explicitly); created again, it is (NULL, NULL, LOCAL) as the store made it (R-OBJ-6).
It keeps no state of its own: the routes are the databases' catalogs.

It is handed the engine as :class:`AdminServices` and the router's shared state
(the statistics, forgetting decisions, routing a database again).

May import: ``brokerd.config``, ``brokerd.errors``, ``brokerd.storage``, the router's
``state``, and for types only the models of ``brokerd.dialogs``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.config import parse_route
from brokerd.errors import ConfigError, RouteInvalid
from brokerd.storage import queries
from brokerd.storage.catalog import Route, route_row
from brokerd.storage.schema import AUTO_CREATED_LOCAL

if TYPE_CHECKING:
    from brokerd.config import BrokerConfig
    from brokerd.dialogs.endpoints.database import Database
    from brokerd.dialogs.router.state import RouterState
    from brokerd.storage.schema import Statement


class AdminServices(Protocol):
    """What route administration needs of the dialog engine."""

    config: BrokerConfig
    databases: dict[str, Database]
    msdb: Database

    def database(self, name: str) -> Database: ...

    async def submit_wait(self, db: Database, statements: list[Statement]) -> None: ...


class RouteAdmin:
    """Route administration (see the module docstring)."""

    def __init__(self, engine: AdminServices, state: RouterState) -> None:
        self.engine = engine
        self.state = state
        self._changing = asyncio.Lock()
        """One change at a time: each is checked against the routes as the ones before it
        left them (a route name is unique, without regard to case), not against routes
        that another change, still waiting for its commit, is about to replace."""

    async def create_route(self, database: str, fields: dict[str, Any]) -> Route:
        async with self._changing:
            return await self._create_route(database, fields)

    async def alter_route(self, database: str, name: str, changes: dict[str, Any]) -> Route:
        async with self._changing:
            return await self._alter_route(database, name, changes)

    async def drop_route(self, database: str, name: str) -> None:
        async with self._changing:
            await self._drop_route(database, name)

    async def _create_route(self, database: str, fields: dict[str, Any]) -> Route:
        db = self.engine.database(database)
        name = str(fields.get("name") or "")
        existing = db.catalog.find_route(name) if name else None
        if existing is not None:
            raise RouteInvalid(f"route {existing.name!r} already exists in database {db.name!r}")
        route = self._parse(fields)
        await self._store_route(db, route)
        return route

    async def _alter_route(self, database: str, name: str, changes: dict[str, Any]) -> Route:
        db = self.engine.database(database)
        current = self._admin_route(db, name, "alter")
        fields: dict[str, Any] = {
            "name": current.name,
            "address": current.address,
            "remote_service_name": current.remote_service_name,
            "broker_instance": str(current.broker_instance) if current.broker_instance else None,
            "mirror_address": current.mirror_address,
            "lifetime": current.lifetime,
        }
        unknown = set(changes) - set(fields) - {"name"}
        if unknown:
            raise RouteInvalid(f"ALTER ROUTE cannot change {', '.join(sorted(unknown))}")
        if "name" in changes and changes["name"] != current.name:
            raise RouteInvalid("ALTER ROUTE cannot rename a route; drop it and create another")
        fields.update(changes)
        route = self._parse(fields)
        await self._store_route(db, route)
        return route

    async def _drop_route(self, database: str, name: str) -> None:
        db = self.engine.database(database)
        route = self._admin_route(db, name, "drop")
        await self.engine.submit_wait(db, [queries.drop_route(route.name)])
        del db.catalog.routes[route.name]
        self.routes_changed(db)

    def _admin_route(self, db: Database, name: str, verb: str) -> Route:
        route = db.catalog.find_route(name)
        if route is None:
            raise RouteInvalid(f"route {name!r} does not exist in database {db.name!r}")
        if route.source == "config":
            raise RouteInvalid(
                f"route {route.name!r} comes from the configuration file "
                f"{self.engine.config.path}; {verb} it there"
            )
        return route

    def _parse(self, fields: dict[str, Any]) -> Route:
        data = {k: v for k, v in fields.items() if v is not None and v != ""}
        try:
            config = parse_route(data, datetime.now(UTC))
        except ConfigError as exc:
            raise RouteInvalid(f"route: {exc.key.lstrip('.')}: {exc.problem}") from None
        return Route(
            config.name,
            config.address,
            config.remote_service_name,
            config.broker_instance,
            config.mirror_address,
            config.lifetime,
            # Made again as the store makes it (parse_route allows no other definition).
            source="system" if config.name == AUTO_CREATED_LOCAL else "admin",
        )

    async def _store_route(self, db: Database, route: Route) -> None:
        await self.engine.submit_wait(db, [route_row(route)])
        db.catalog.routes[route.name] = route
        self.routes_changed(db)

    def routes_changed(self, db: Database) -> None:
        """Routes of ``db`` changed: decisions are made again (DELAYED ones at once)."""
        self.state.stats.route_changes += 1
        engine = self.engine
        affected = list(engine.databases.values()) if db is engine.msdb else [db]
        self.state.forget_decisions()
        for d in affected:
            self.state.reroute(d)
