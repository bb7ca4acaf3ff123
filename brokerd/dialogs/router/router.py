"""Routing at run time: the engine's side of SPEC §2 (R-ROUTE-1 .. R-ROUTE-16), joined.

Owns :class:`Router`, which makes the router's parts, hands each its collaborators, and
offers the dialog engine and the server one object to call (its façade: each method is
one line that delegates to the part that owns it), and :class:`DialogServices`, what the
router needs of the dialog engine: every part's narrow protocol joined (the engine
satisfies it structurally). The parts are listed in the package's docstring.

May import: every other module of the router, ``brokerd.config`` for types.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.dialogs.router.admin import AdminServices, RouteAdmin
from brokerd.dialogs.router.decisions import DecisionServices, RouteDecisions
from brokerd.dialogs.router.inbound import Inbound, InboundServices
from brokerd.dialogs.router.mirror_roles import MirrorHooks, MirrorRoles, MirrorServices
from brokerd.dialogs.router.requests import RequestServices, RouteRequests
from brokerd.dialogs.router.state import RouterState, StateServices

if TYPE_CHECKING:
    from brokerd.config import BrokerConfig
    from brokerd.dialogs.endpoints.database import Database
    from brokerd.dialogs.endpoints.endpoint import Endpoint
    from brokerd.dialogs.router.inbound import Relayed
    from brokerd.dialogs.transmission.links import Link
    from brokerd.routing.forwarding import Forward, ForwardBudget
    from brokerd.storage.catalog import Route
    from protocol import events
    from protocol.dialog import DialogHeader


class DialogServices(
    StateServices,
    RequestServices,
    MirrorServices,
    DecisionServices,
    InboundServices,
    AdminServices,
    Protocol,
):
    """What the router needs of the dialog engine (which satisfies it structurally)."""

    config: BrokerConfig


class Router:
    """The router of one dialog engine: its parts, joined (see the module docstring)."""

    def __init__(self, engine: DialogServices) -> None:
        endpoint = engine.config.endpoint
        self.state = RouterState(engine)
        self.requests = RouteRequests(engine, self.state, engine.config.limits)
        self.mirror_roles = MirrorRoles(engine, self.state, engine.config.limits)
        self.decisions = RouteDecisions(
            engine, self.state, endpoint, self.requests, self.mirror_roles
        )
        self.from_outside = Inbound(
            engine, self.state, endpoint, self.decisions, self.requests, self.mirror_roles
        )
        self.admin = RouteAdmin(engine, self.state)

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self.state.start()

    def tick(self) -> None:
        self.mirror_roles.tick()

    # -- the shared state ---------------------------------------------------------------------

    def forget_decisions(self) -> None:
        self.state.forget_decisions()

    def stats_view(self) -> dict[str, Any]:
        return self.state.stats_view(self.from_outside.budget, len(self.requests.pending))

    # -- the route of each conversation -------------------------------------------------------

    @property
    def forwarding(self) -> bool:
        return self.decisions.forwarding

    def link_for(self, ep: Endpoint) -> Link | None:
        return self.decisions.link_for(ep)

    def waiting_status(self, ep: Endpoint) -> str:
        return self.decisions.waiting_status(ep)

    def bind_far_instance(self, ep: Endpoint, instance: uuid.UUID) -> bool:
        """R-ROUTE-3: the first broker instance that answers for ``ep``'s far side binds it;
        its messages are routed to that instance from now on. True if this bound it."""
        if ep.far_broker_instance is not None:
            return False
        ep.far_broker_instance = instance
        self.decisions.rebind(ep)
        return True

    def explain(
        self,
        database: str,
        service: str,
        broker_instance: uuid.UUID | None = None,
        from_outside: bool = False,
    ) -> dict[str, Any]:
        return self.decisions.explain(database, service, broker_instance, from_outside)

    # -- messages from outside, forwarding ----------------------------------------------------

    @property
    def budget(self) -> ForwardBudget:
        return self.from_outside.budget

    @property
    def last_forwarded(self) -> Relayed | None:
        return self.from_outside.last_forwarded

    def inbound(
        self, header: DialogHeader, body: bytes, payload: bytes | None = None
    ) -> Database | None:
        return self.from_outside.inbound(header, body, payload)

    def forward_next(
        self, header: DialogHeader, body: bytes, payload: bytes | None, address: str
    ) -> bool:
        return self.from_outside.forward_next(header, body, payload, address)

    def forward_acks(self, headers: list[DialogHeader]) -> None:
        self.from_outside.forward_acks(headers)

    def forward_sent(self, item: Forward) -> None:
        self.from_outside.forward_sent(item)

    def forward_lost(self, items: list[Forward]) -> None:
        self.from_outside.forward_lost(items)

    # -- route administration -----------------------------------------------------------------

    async def create_route(self, database: str, fields: dict[str, Any]) -> Route:
        return await self.admin.create_route(database, fields)

    async def alter_route(self, database: str, name: str, changes: dict[str, Any]) -> Route:
        return await self.admin.alter_route(database, name, changes)

    async def drop_route(self, database: str, name: str) -> None:
        await self.admin.drop_route(database, name)

    def routes_changed(self, db: Database) -> None:
        self.admin.routes_changed(db)

    # -- dynamic routing ----------------------------------------------------------------------

    def request_ended(self, ep: Endpoint) -> None:
        self.requests.request_ended(ep)

    # -- mirroring ----------------------------------------------------------------------------

    @property
    def mirroring(self) -> MirrorHooks | None:
        return self.mirror_roles.mirroring

    @mirroring.setter
    def mirroring(self, hooks: MirrorHooks | None) -> None:
        self.mirror_roles.mirroring = hooks

    async def set_mirror_role(self, database: str, role: str) -> None:
        await self.mirror_roles.set_mirror_role(database, role)

    def mirrors_view(self) -> list[dict[str, Any]]:
        return self.mirror_roles.mirrors_view()

    def on_principal_query(self, link: Link, query: events.PrincipalQuery) -> None:
        self.mirror_roles.on_principal_query(link, query)

    def on_principal_answer(self, address: str, answer: events.PrincipalAnswer) -> None:
        self.mirror_roles.on_principal_answer(address, answer)

    def link_unreachable(self, address: str) -> None:
        self.mirror_roles.link_unreachable(address)

    def tell_mirror(self, link: Link, db: Database, header: DialogHeader) -> None:
        self.mirror_roles.tell_mirror(link, db, header)
