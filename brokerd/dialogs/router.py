"""Routing at run time: the engine's side of SPEC §2 (R-ROUTE-1 .. R-ROUTE-14).

:mod:`brokerd.routing.rules` decides; this module applies the decisions to live
conversations and holds the state routing needs between messages:

* the route of each conversation that begins here or is answered from here,
  cached on the endpoint until a route changes or expires (R-OBJ-5), and
  re-decided once the conversation is bound to the broker instance of the
  first acknowledgement (R-ROUTE-3);
* the route of each message arriving from outside, with msdb's routes
  (R-ROUTE-1), replies delivered by broker instance first (R-ROUTE-2),
  cached per conversation;
* forwarding (R-ROUTE-6, R-ROUTE-7): relayed fragments and acknowledgements,
  the hop count, the ``message_forward_size`` budget;
* route administration at run time (create, alter, drop; persisted in the
  database file) and the re-routing of DELAYED conversations when routes
  change (R-ROUTE-13);
* dynamic routing (R-ROUTE-14): at most one MissingRoute request per service
  name in flight, sent on a dialog from the system service
  ``brokerd/RouteRequester``; when the routing service ends that dialog the
  waiting conversations are routed again;
* mirroring (R-ROUTE-10): principal queries to both partners of a mirrored
  route, answers to other brokers' queries, the role of each local database;
  fencing by epoch (R-ROUTE-15): each role change carries an epoch, persisted;
  a partner that is not principal sends nothing for the mirrored database, and
  one that hears of a higher epoch while principal demotes itself;
* ``explain``: the step-by-step reasoning for a service, as ``brokerctl explain``
  prints it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import logging
import math
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol
from xml.sax.saxutils import escape

from brokerd.config import normal_tcp_address, parse_route
from brokerd.errors import ConfigError, DialogError, InvalidRequest, RouteInvalid
from brokerd.routing import rules as routing
from brokerd.routing.forwarding import Forward, ForwardBudget, acks_item, fragment_item, hop_refusal
from brokerd.routing.mirrors import MirrorKey, MirrorPair, MirrorTracker, Role
from brokerd.storage import queries
from brokerd.storage.catalog import ROUTE_REQUESTER_SERVICE, Route, route_row
from brokerd.storage.queries import AUTO_CREATED_LOCAL
from protocol import events
from protocol.dialog import (
    BROKER_CONFIGURATION_NOTICE,
    MISSING_ROUTE,
    NIL_UUID,
    DialogHeader,
)
from protocol.errors import BrokerError
from protocol.frames import MirrorRole

if TYPE_CHECKING:
    from brokerd.config import BrokerConfig, RetryConfig
    from brokerd.dialogs.database import Database
    from brokerd.dialogs.endpoint import Endpoint
    from brokerd.dialogs.links import Link, LinkProvider
    from brokerd.storage.queries import Statement
    from brokerd.traces.writer import TraceWriter

log = logging.getLogger("brokerd.dialogs.router")

INBOUND_CACHE_LIMIT = 100_000
DECISION_CACHE_LIMIT = 10_000
"""Shared decisions kept (one per database, service and broker instance; cleared past it)."""
_ROLE_NAMES: dict[MirrorRole, Role] = {
    MirrorRole.PRINCIPAL: "principal",
    MirrorRole.MIRROR: "mirror",
    MirrorRole.UNKNOWN: "unknown",
}


@dataclass
class RouterStats:
    forwarded_fragments: int = 0
    forwarded_acks: int = 0
    acks_dropped: int = 0
    """Acknowledgements for conversations not held here that no route could relay."""
    forward_lost: int = 0
    hop_limit_drops: int = 0
    forward_buffer_drops: int = 0
    route_requests: int = 0
    principal_queries_sent: int = 0
    principal_queries_answered: int = 0
    route_changes: int = 0
    route_decisions: int = 0
    """Decisions made in full (the others were shared, see :meth:`Router.decide`)."""


@dataclass
class RouteRequest:
    """A MissingRoute request to the dynamic routing service (R-ROUTE-14)."""

    database: str
    service: str
    started: float
    handle: uuid.UUID | None = None
    done_at: float | None = None


def own_addresses(host: str, port: int) -> frozenset[str]:
    """The ``tcp://`` addresses that reach this instance's endpoint (R-ROUTE-8)."""
    hosts = {host}
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None and ip.is_unspecified:
        hosts |= {"127.0.0.1", "localhost", "::1"}
    elif ip is not None and str(ip) == "127.0.0.1":
        hosts.add("localhost")
    out = set()
    for h in hosts:
        try:
            out.add(normal_tcp_address(f"tcp://[{h}]:{port}" if ":" in h else f"tcp://{h}:{port}"))
        except ValueError:
            continue
    return frozenset(out)


def missing_route_body(service: str, broker_instance: uuid.UUID | None, database: str) -> bytes:
    """The MissingRoute request (R-ROUTE-14): the service, the broker instance, the database."""
    instance = str(broker_instance) if broker_instance else ""
    return (
        f'<MissingRoute xmlns="{MISSING_ROUTE}">'
        f"<SERVICE_NAME>{escape(service)}</SERVICE_NAME>"
        f"<BROKER_INSTANCE>{instance}</BROKER_INSTANCE>"
        f"<DATABASE>{escape(database)}</DATABASE></MissingRoute>"
    ).encode()


class DialogServices(Protocol):
    """What the router needs of the dialog engine (which satisfies it structurally)."""

    config: BrokerConfig
    databases: dict[str, Database]
    msdb: Database
    by_instance: dict[uuid.UUID, Database]
    links: LinkProvider
    trace: TraceWriter
    retry: RetryConfig

    @property
    def local_link(self) -> Link: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def database(self, name: str) -> Database: ...

    def drop(self, header: DialogHeader, reason: str) -> None: ...

    def note_drop(self, text: str) -> None: ...

    def transmit(self, ep: Endpoint) -> None: ...

    async def submit_wait(self, db: Database, statements: list[Statement]) -> None: ...

    async def begin_dialog(
        self,
        from_service: str,
        to_service: str,
        contract: str,
        database: str | None = None,
        to_broker_instance: uuid.UUID | None = None,
        lifetime: int = 0,
        related_conversation: uuid.UUID | None = None,
    ) -> Endpoint: ...

    async def send(self, handle: uuid.UUID, message_type: str, body: bytes) -> int: ...

    async def end_conversation(
        self,
        handle: uuid.UUID,
        error_code: int | None = None,
        description: str = "",
        cleanup: bool = False,
    ) -> None: ...

    async def discard_received(self, ep: Endpoint) -> None: ...

    async def rebuild(self, db: Database) -> list[Endpoint]: ...

    def forget_image(self, db: Database) -> None: ...

    def resume(self, db: Database) -> None: ...


class MirrorHooks(Protocol):
    """What a role change tells the mirroring service (R-ROUTE-16; the server's
    ``Mirroring`` satisfies it): a promotion waits until every unit already shipped
    to this partner is applied and stops taking more; a demotion drops the mirror
    attached to this partner and what waited for it."""

    async def promoting(self, db: Database) -> None: ...

    def demoting(self, db: Database) -> None: ...

    def resolved(self, db: Database, reason: str) -> None: ...

    def partner_answered(self, address: str, answer: events.PrincipalAnswer) -> None: ...

    def unreachable(self, address: str) -> None: ...


class Router:
    def __init__(self, engine: DialogServices) -> None:
        self.engine = engine
        endpoint = engine.config.endpoint
        self.forwarding = endpoint.message_forwarding
        self.max_hop_count = endpoint.max_hop_count
        self.budget = ForwardBudget(endpoint.message_forward_size)
        self.own_addresses = own_addresses(endpoint.host, endpoint.port)
        self.mirrors = MirrorTracker()
        self.local_dbs: list[routing.LocalDatabase] = []
        self.requests: dict[tuple[str, str], RouteRequest] = {}
        self.stats = RouterStats()
        self._inbound: dict[tuple[Any, ...], routing.Decision] = {}
        self._inbound_expires = math.inf
        self._decisions: dict[tuple[str, bool, str, uuid.UUID | None], routing.Decision] = {}
        """Decisions that do not depend on the conversation, by (table, from outside,
        service, broker instance): see :meth:`decide`."""
        self._decisions_expire = math.inf
        self._query_ids = itertools.count(1)
        self._persisting: set[asyncio.Task[None]] = set()
        self.mirroring: MirrorHooks | None = None
        """Set by the daemon when a database is mirrored with a partner (R-ROUTE-16)."""

    def start(self) -> None:
        self.local_dbs = [
            routing.LocalDatabase(db.name, db.broker_instance, frozenset(db.catalog.services))
            for db in self.engine.databases.values()
        ]
        self.forget_decisions()

    # -- decisions ---------------------------------------------------------------------

    def decide(
        self,
        db: Database,
        service: str,
        broker_instance: uuid.UUID | None,
        conversation_id: uuid.UUID,
        from_outside: bool = False,
    ) -> routing.Decision:
        """Route one conversation (R-ROUTE-1, R-ROUTE-4, R-ROUTE-5).

        A decision made without a choice among equal routes or broker instances
        (``choices == 1``) is the same for every conversation to ``service`` and
        ``broker_instance`` from ``db``: it is kept and reused until a route or the
        mirroring role changes (:meth:`forget_decisions`) or a route it consulted
        expires. A decision that asks the dynamic routing service for a route, or made
        while such a request for ``service`` is pending (R-ROUTE-14), is not kept. With
        10,000 conversations this spares one full decision per conversation and side.
        """
        msdb = self.engine.msdb
        table = msdb if from_outside else db
        key = (table.name, from_outside, service, broker_instance)
        now = time.time()
        if now >= self._decisions_expire or len(self._decisions) > DECISION_CACHE_LIMIT:
            self.forget_decisions()
        known = self._decisions.get(key)
        if known is not None:
            return known
        pending = self.pending_services(table.name)
        self.stats.route_decisions += 1
        decision = routing.decide(
            table.catalog.routes.values(),
            routing.Conversation(
                service, conversation_id, broker_instance, None if from_outside else db.name
            ),
            self.local_dbs,
            datetime.now(UTC),
            msdb_routes=msdb.catalog.routes.values(),
            forwarding=self.forwarding,
            own_addresses=self.own_addresses,
            pending_route_requests=pending,
        )
        if decision.choices == 1 and not decision.request_route and service not in pending:
            self._decisions[key] = decision
            if decision.valid_until is not None:
                self._decisions_expire = min(
                    self._decisions_expire, decision.valid_until.timestamp()
                )
        return decision

    def forget_decisions(self) -> None:
        """Routes or roles changed: every decision is made again."""
        self._decisions.clear()
        self._decisions_expire = math.inf
        self._inbound.clear()
        self._inbound_expires = math.inf

    def link_for(self, ep: Endpoint) -> Link | None:
        """The link ``ep``'s messages go to now, or None (DELAYED, or no principal yet)."""
        db = self.engine.databases[ep.database]
        if db.sends_nothing:
            return None  # R-ROUTE-15/16: a mirror, or a principal in doubt, sends nothing
        if ep.route_link is not None and time.time() < ep.route_expires:
            link: Link = ep.route_link
            return link
        decision = self.decide(db, ep.far_service, ep.far_broker_instance, ep.conversation_id)
        self._trace_decision(ep, decision)
        ep.route = decision
        ep.route_link = None
        ep.route_expires = decision.valid_until.timestamp() if decision.valid_until else math.inf
        if decision.request_route:
            self._request_route(db, ep.far_service, ep.far_broker_instance)
        if decision.kind == "local":
            ep.route_link = self.engine.local_link
        elif decision.kind == "network" and decision.address:
            address = decision.address
            if decision.mirror_address:
                principal = self._principal(decision, ep.far_service)
                if principal is None:
                    return None
                address = principal
                ep.route_expires = 0.0  # asked again at every transmission: failover
            ep.route_link = self.engine.links.link_for(address)
        return ep.route_link  # type: ignore[no-any-return]

    def _trace_decision(self, ep: Endpoint, decision: routing.Decision) -> None:
        before = ep.route
        trace = self.engine.trace
        waiting = decision.kind in ("delayed", "drop")
        if waiting:
            if before is None or before.kind not in ("delayed", "drop"):
                trace.emit(
                    "delayed",
                    ep.conversation_id,
                    database=ep.database,
                    initiator=ep.initiator,
                    service=ep.far_service,
                    reason=decision.reason,
                )
            return
        if before is not None and before.kind in ("delayed", "drop"):
            trace.emit("released", ep.conversation_id, database=ep.database, initiator=ep.initiator)
        if before is None or (before.route, before.address, before.database) != (
            decision.route,
            decision.address,
            decision.database,
        ):
            trace.emit(
                "route_chosen",
                ep.conversation_id,
                database=ep.database,
                initiator=ep.initiator,
                service=ep.far_service,
                decision=decision.kind,
                route=decision.route,
                step=_matched_step(decision),
                address=decision.address,
                target_database=decision.database,
            )

    def waiting_status(self, ep: Endpoint) -> str:
        """Why ``ep``'s messages have no link: the routing reason, or the mirror state."""
        db = self.engine.databases[ep.database]
        if db.mirror_role == "mirror":
            return db.fenced_reason() + ": held until this partner is principal again"
        if db.mirror_in_doubt:
            return db.in_doubt_reason()
        decision = ep.route
        if decision is None:
            return "no route"
        if decision.kind == "network" and decision.mirror_address and decision.address:
            pair = self.mirrors.pair(self._mirror_key(decision, ep.far_service))
            return pair.status()
        return decision.reason

    def rebind(self, ep: Endpoint) -> None:
        """R-ROUTE-3: the conversation is now bound to a broker instance; route it again."""
        ep.route_link = None
        ep.route_expires = 0.0

    # -- messages from outside ---------------------------------------------------------------

    def inbound(self, header: DialogHeader, body: bytes) -> Database | None:
        """The database a message from outside is for, or None if forwarded or dropped."""
        engine = self.engine
        if not header.initiator and header.to_broker_instance is not None:
            db = engine.by_instance.get(header.to_broker_instance)
            if db is not None:
                return db  # R-ROUTE-2: a reply for a broker instance held here
        decision = self._inbound_decision(header)
        if decision.kind == "local" and decision.database is not None:
            return engine.databases[decision.database]
        if decision.kind == "network":
            self._forward_fragment(header, body, decision)
            return None
        engine.drop(header, decision.reason)
        return None

    def _inbound_decision(self, header: DialogHeader) -> routing.Decision:
        now = time.time()
        cache = self._inbound
        if now >= self._inbound_expires or len(cache) > INBOUND_CACHE_LIMIT:
            cache.clear()
            self._inbound_expires = math.inf
        key = (
            header.conversation_id,
            header.initiator,
            header.to_service,
            header.to_broker_instance,
        )
        decision = cache.get(key)
        if decision is None:
            decision = self.decide(
                self.engine.msdb,
                header.to_service,
                header.to_broker_instance,
                header.conversation_id,
                from_outside=True,
            )
            if not decision.request_route:
                cache[key] = decision
            if decision.valid_until is not None:
                self._inbound_expires = min(self._inbound_expires, decision.valid_until.timestamp())
        if decision.request_route:
            self._request_route(self.engine.msdb, header.to_service, header.to_broker_instance)
        return decision

    def _forward_fragment(
        self, header: DialogHeader, body: bytes, decision: routing.Decision
    ) -> None:
        refusal = hop_refusal(header, self.max_hop_count)
        if refusal is not None:
            self.stats.hop_limit_drops += 1
            self.engine.drop(header, refusal)
            return
        address = self._forward_address(header, decision)
        if address is None:
            return
        item = fragment_item(header, body)
        if not self.budget.take(item.size):
            self.stats.forward_buffer_drops += 1
            self.engine.drop(
                header,
                f"forwarding buffer full ({self.budget.held} of {self.budget.limit} bytes, "
                "message_forward_size); dropped, the sender retries (R-ROUTE-7)",
            )
            return
        self.stats.forwarded_fragments += 1
        self.engine.trace.emit(
            "forwarded",
            header.conversation_id,
            initiator=header.initiator,
            seq=header.sequence_number,
            fragment=header.fragment_index,
            size=len(body),
            hop=header.hop_count + 1,
            address=address,
            route=decision.route,
        )
        log.debug(
            "forwarding message %s of %s to %s (hop %d)",
            header.sequence_number,
            header.conversation_id,
            address,
            header.hop_count + 1,
        )
        self.engine.links.link_for(address).forward(item)

    def _forward_address(self, header: DialogHeader, decision: routing.Decision) -> str | None:
        if not decision.mirror_address:
            return decision.address
        principal = self._principal(decision, header.to_service)
        if principal is None:
            self.engine.drop(header, "no principal known yet for the mirrored route (R-ROUTE-10)")
        return principal

    def forward_acks(self, headers: list[DialogHeader]) -> None:
        """Dedicated acknowledgements for conversations not held here: relay them (R-ROUTE-7)."""
        per_address: dict[str, list[DialogHeader]] = defaultdict(list)
        for h in headers:
            if not h.initiator and h.to_broker_instance in self.engine.by_instance:
                continue  # for an endpoint of ours that no longer exists
            decision = self._inbound_decision(h)
            if decision.kind != "network":
                self.stats.acks_dropped += 1
                self.engine.note_drop(
                    f"dropped an acknowledgement of conversation {h.conversation_id} for "
                    f"{h.to_service!r}: {decision.reason}"
                )
                continue
            if hop_refusal(h, self.max_hop_count) is not None:
                self.stats.hop_limit_drops += 1
                self.stats.acks_dropped += 1
                continue
            address = self._forward_address(h, decision)
            if address is not None:
                per_address[address].append(h)
        for address, group in per_address.items():
            item = acks_item(group)
            if self.budget.take(item.size):
                self.stats.forwarded_acks += len(group)
                self.engine.links.link_for(address).forward(item)
            else:
                self.stats.forward_buffer_drops += 1

    def forward_sent(self, item: Forward) -> None:
        self.budget.release(item.size)

    def forward_lost(self, items: list[Forward]) -> None:
        for item in items:
            self.budget.release(item.size)
        self.stats.forward_lost += len(items)

    # -- route administration ---------------------------------------------------------------

    async def create_route(self, database: str, fields: dict[str, Any]) -> Route:
        db = self.engine.database(database)
        name = str(fields.get("name") or "")
        existing = db.catalog.find_route(name) if name else None
        if existing is not None:
            raise RouteInvalid(f"route {existing.name!r} already exists in database {db.name!r}")
        route = self._parse(fields)
        await self._store_route(db, route)
        return route

    async def alter_route(self, database: str, name: str, changes: dict[str, Any]) -> Route:
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

    async def drop_route(self, database: str, name: str) -> None:
        db = self.engine.database(database)
        route = self._admin_route(db, name, "drop")
        await self.engine.submit_wait(db, [queries.drop_route(route.name)])
        del db.catalog.routes[route.name]
        self.routes_changed(db)

    def _admin_route(self, db: Database, name: str, verb: str) -> Route:
        route = db.catalog.find_route(name)
        if route is None:
            raise RouteInvalid(f"route {name!r} does not exist in database {db.name!r}")
        if route.source == "system":
            raise RouteInvalid(
                f"cannot {verb} {AUTO_CREATED_LOCAL}: the store creates it in every database "
                "(R-OBJ-6)"
            )
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
            source="admin",
        )

    async def _store_route(self, db: Database, route: Route) -> None:
        await self.engine.submit_wait(db, [route_row(route)])
        db.catalog.routes[route.name] = route
        self.routes_changed(db)

    def routes_changed(self, db: Database) -> None:
        """Routes of ``db`` changed: decisions are made again (DELAYED ones at once)."""
        self.stats.route_changes += 1
        engine = self.engine
        affected = list(engine.databases.values()) if db is engine.msdb else [db]
        self.forget_decisions()
        for d in affected:
            self.reroute(d)

    def reroute(self, db: Database, service: str | None = None) -> None:
        """Route ``db``'s conversations again (only those for ``service`` if given)."""
        self.forget_decisions()
        for ep in list(db.endpoints.values()):
            if service is not None and ep.far_service != service:
                continue
            was_waiting = ep.route is None or ep.route.kind in ("delayed", "drop")
            ep.route_link = None
            ep.route_expires = 0.0
            if ep.has_unacknowledged:
                if was_waiting:
                    for msg in ep.outbox.values():
                        msg.due = 0.0
                self.engine.transmit(ep)

    # -- dynamic routing (R-ROUTE-14) ---------------------------------------------------------

    def pending_services(self, database: str) -> set[str]:
        """Services of ``database`` with a MissingRoute request in flight or just answered."""
        now = time.monotonic()
        cooldown = self.engine.retry.delayed_retry
        timeout = max(60.0, 4 * cooldown)
        out: set[str] = set()
        for key, req in list(self.requests.items()):
            if key[0] != database:
                continue
            if req.done_at is None and now - req.started > timeout:
                log.warning("MissingRoute request for %r unanswered; asking again", req.service)
                self._abandon(req)
                del self.requests[key]
                continue
            if req.done_at is not None and now - req.done_at >= cooldown:
                del self.requests[key]
                continue
            out.add(req.service)
        return out

    def _request_route(self, db: Database, service: str, broker_instance: uuid.UUID | None) -> None:
        key = (db.name, service)
        if key in self.requests:
            return
        req = self.requests[key] = RouteRequest(db.name, service, time.monotonic())
        self.stats.route_requests += 1
        self.engine.loop.create_task(self._send_request(db, req, broker_instance))

    async def _send_request(
        self, db: Database, req: RouteRequest, broker_instance: uuid.UUID | None
    ) -> None:
        engine = self.engine
        try:
            ep = await engine.begin_dialog(
                ROUTE_REQUESTER_SERVICE,
                routing.BROKER_CONFIGURATION_SERVICE,
                BROKER_CONFIGURATION_NOTICE,
                database=db.name,
            )
            req.handle = ep.handle
            await engine.send(
                ep.handle, MISSING_ROUTE, missing_route_body(req.service, broker_instance, db.name)
            )
            log.info("asked the dynamic routing service for a route to %r", req.service)
        except BrokerError as exc:
            log.error("cannot send the MissingRoute request for %r: %s", req.service, exc)
            req.done_at = time.monotonic()

    def request_ended(self, ep: Endpoint) -> None:
        """The routing service ended (or refused) a request dialog: route again (R-ROUTE-14)."""
        for req in self.requests.values():
            if req.handle == ep.handle:
                break
        else:
            req = None
        if req is not None:
            req.done_at = time.monotonic()
        self.engine.loop.create_task(self._finish_request(ep, req))

    async def _finish_request(self, ep: Endpoint, req: RouteRequest | None) -> None:
        engine = self.engine
        try:
            await engine.end_conversation(ep.handle, cleanup=ep.broker_error)
            await engine.discard_received(ep)
        except BrokerError as exc:
            log.warning("ending the MissingRoute dialog %s: %s", ep.handle, exc)
        if req is not None:
            self.reroute(engine.databases[req.database], req.service)

    def _abandon(self, req: RouteRequest) -> None:
        if req.handle is not None:
            handle = req.handle
            self.engine.loop.create_task(self._cleanup(handle))

    async def _cleanup(self, handle: uuid.UUID) -> None:
        with contextlib.suppress(BrokerError):
            await self.engine.end_conversation(handle, cleanup=True)

    # -- mirroring (R-ROUTE-10) -------------------------------------------------------------------

    def _mirror_key(self, decision: routing.Decision, service: str) -> MirrorKey:
        assert decision.address is not None and decision.mirror_address is not None
        return MirrorKey(
            decision.address, decision.mirror_address, decision.broker_instance, service
        )

    def _principal(self, decision: routing.Decision, service: str) -> str | None:
        key = self._mirror_key(decision, service)
        pair = self.mirrors.pair(key)
        now = time.monotonic()
        pair.last_used = now
        if pair.needs_asking(now, self._ask_interval(), self._recheck_interval()):
            self._ask(pair)
        return pair.principal

    def _ask_interval(self) -> float:
        return max(0.05, self.engine.retry.initial)

    def _recheck_interval(self) -> float:
        """How often both partners are asked again while one is principal (R-ROUTE-15)."""
        return max(0.5, self.engine.retry.maximum)

    def _ask(self, pair: MirrorPair) -> None:
        pair.asked_at = time.monotonic()
        key = pair.key
        for address in pair.addresses:
            self.stats.principal_queries_sent += 1
            self.engine.links.link_for(address).send_control(
                events.PrincipalQuery(
                    next(self._query_ids), key.broker_instance or NIL_UUID, key.service, pair.epoch
                )
            )

    def tick(self) -> None:
        """Keep asking both partners of a mirrored route in use: often while it has no
        principal, every ``retry.maximum`` seconds while it has one (R-ROUTE-15)."""
        now = time.monotonic()
        interval, recheck = self._ask_interval(), self._recheck_interval()
        for pair in self.mirrors.pairs.values():
            if now - pair.last_used < 600 and pair.needs_asking(now, interval, recheck):
                self._ask(pair)

    def _queried_database(self, broker_instance: uuid.UUID, service: str) -> Database | None:
        if broker_instance != NIL_UUID:
            return self.engine.by_instance.get(broker_instance)
        found = routing.locate_local(service, None, self.local_dbs, None)
        return self.engine.databases[found.name] if found else None

    def role_of(self, broker_instance: uuid.UUID, service: str) -> tuple[MirrorRole, int]:
        """What this instance answers to a principal query: its role and epoch."""
        db = self._queried_database(broker_instance, service)
        if db is None:
            return MirrorRole.UNKNOWN, 0
        role = MirrorRole.MIRROR if db.mirror_role == "mirror" else MirrorRole.PRINCIPAL
        return role, db.mirror_epoch

    def on_principal_query(self, link: Link, query: events.PrincipalQuery) -> None:
        self.stats.principal_queries_answered += 1
        db = self._queried_database(query.broker_instance, query.service)
        if db is not None and db.mirror_role is not None and query.epoch > db.mirror_epoch:
            self._superseded(db, query.epoch)
        role, epoch = self.role_of(query.broker_instance, query.service)
        link.send_control(
            events.PrincipalAnswer(
                query.query_id, role, query.broker_instance, query.service, epoch
            )
        )

    def _superseded(self, db: Database, epoch: int) -> None:
        """R-ROUTE-15: a sender has seen the pair at a higher epoch than this partner's. If
        this partner is principal, its partner was promoted behind its back: it demotes
        itself (fencing); either way it adopts the epoch, so that its own next promotion is
        numbered above it. Committed in the background: if the daemon stops first, the
        next query carrying the epoch demotes it again."""
        if db.mirror_role == "principal":
            log.warning(
                "database %s: a partner is principal at epoch %d, above this partner's %d; "
                "this partner is now the mirror (fenced)",
                db.name,
                epoch,
                db.mirror_epoch,
            )
            db.mirror_role = "mirror"
            self.forget_decisions()
            if self.mirroring is not None:
                self.mirroring.demoting(db)
            self.engine.forget_image(db)
        db.mirror_epoch = epoch
        self._persist_role(db)

    def _persist_role(self, db: Database) -> None:
        assert db.mirror_role is not None
        task = asyncio.get_running_loop().create_task(
            self.engine.submit_wait(
                db,
                [
                    queries.meta("mirror_role", db.mirror_role),
                    queries.meta("mirror_epoch", str(db.mirror_epoch)),
                ],
            )
        )
        self._persisting.add(task)
        task.add_done_callback(self._persisting.discard)

    def on_principal_answer(self, address: str, answer: events.PrincipalAnswer) -> None:
        if self.mirroring is not None:
            self.mirroring.partner_answered(address, answer)
        instance = None if answer.broker_instance == NIL_UUID else answer.broker_instance
        changed = False
        for pair in self.mirrors.matching(address, instance, answer.service):
            before = pair.principal
            if pair.answer(address, _ROLE_NAMES[answer.role], answer.epoch):
                changed = True
                log.info(
                    "mirrored route %s/%s: principal %s -> %s",
                    pair.key.address,
                    pair.key.mirror_address,
                    before,
                    pair.principal,
                )
        if changed:
            self._resend_mirrored()

    def link_unreachable(self, address: str) -> None:
        if self.mirroring is not None:
            self.mirroring.unreachable(address)
        changed = False
        for pair in self.mirrors.with_address(address):
            changed |= pair.unreachable(address)
        if changed:
            self._resend_mirrored()

    def tell_mirror(self, link: Link, db: Database, header: DialogHeader) -> None:
        """A message reached the mirror partner: tell the sender it is not principal."""
        link.send_control(
            events.PrincipalAnswer(
                0, MirrorRole.MIRROR, db.broker_instance, header.to_service, db.mirror_epoch
            )
        )

    def _resend_mirrored(self) -> None:
        for db in self.engine.databases.values():
            for ep in db.endpoints.values():
                if ep.has_unacknowledged and ep.route is not None and ep.route.mirror_address:
                    ep.route_link = None
                    for msg in ep.outbox.values():
                        msg.due = 0.0
                    self.engine.transmit(ep)

    async def set_mirror_role(self, database: str, role: str) -> None:
        """Failover: this partner becomes ``principal`` or ``mirror`` (persisted).

        R-ROUTE-15: a promotion opens a new epoch, one above the highest this partner
        knows of (its own and any it heard in principal queries); a demotion keeps the
        epoch. Both are stored before the role is used."""
        db = self.engine.database(database)
        if db.mirror_role is None:
            raise DialogError(
                f"database {db.name!r} is not mirrored (set mirror_role in the configuration)"
            )
        if role not in ("principal", "mirror"):
            raise InvalidRequest(f"mirror role must be principal or mirror, not {role!r}")
        promotion = role == "principal" and db.mirror_role != "principal"
        if self.mirroring is not None:
            if promotion:
                await self.mirroring.promoting(db)
            elif role == "mirror" and db.mirror_role == "principal":
                db.mirror_role = role  # fenced at once: nothing more is committed as principal
                self.mirroring.demoting(db)
                self.engine.forget_image(db)
        epoch = db.mirror_epoch
        if promotion:
            # R-ROUTE-15: above every epoch this partner knows of, also the one its
            # principal wrote the units it holds at (a demoted partner keeps its own,
            # older epoch; promoted again, it opened the epoch its partner already had).
            replica = db.store.replica
            if replica is not None:
                epoch = max(epoch, replica.lsn_epoch)
            epoch += 1
        await self.engine.submit_wait(
            db,
            [queries.meta("mirror_role", role), queries.meta("mirror_epoch", str(epoch))],
        )
        if promotion and self.mirroring is not None:
            # R-ROUTE-16: resume every conversation where the old principal stood.
            await self.engine.rebuild(db)
        db.mirror_role = role
        db.mirror_epoch = max(db.mirror_epoch, epoch)
        log.info("database %s is now the %s partner at epoch %d", db.name, role, epoch)
        if role == "principal":
            if db.mirror_in_doubt and self.mirroring is not None:
                # the administrator vouches for this partner (a forced service); resumes it
                self.mirroring.resolved(db, "the administrator confirmed it as principal")
            else:
                self.engine.resume(db)
        else:
            self.forget_decisions()

    # -- explain -----------------------------------------------------------------------------------

    def explain(
        self,
        database: str,
        service: str,
        broker_instance: uuid.UUID | None = None,
        from_outside: bool = False,
    ) -> dict[str, Any]:
        """Which route a new conversation to ``service`` would take now, and why."""
        engine = self.engine
        db = engine.msdb if from_outside else engine.database(database)
        conversation = uuid.uuid4()
        decision = self.decide(db, service, broker_instance, conversation, from_outside)
        steps = list(decision.steps)
        if decision.request_route:
            steps.append("(explain does not send the MissingRoute request)")
        principal = ""
        if decision.kind == "network" and decision.address:
            address = decision.address
            if decision.mirror_address:
                pair = self.mirrors.pairs.get(self._mirror_key(decision, service))
                steps.append(
                    "R-ROUTE-10: "
                    + (pair.status() if pair else "not used yet: both partners will be asked")
                )
                principal = (pair.principal or "") if pair else ""
                address = principal or address
            link = engine.links.link_for(address)
            steps.append(f"connection to {address}: {link.status}")
        note = ""
        if decision.choices > 1:
            note = (
                f"load balanced over {decision.choices} equal routes: the choice depends on the "
                "conversation id, and a conversation keeps it"
            )
        return {
            "database": db.name,
            "service": service,
            "broker_instance": str(broker_instance or ""),
            "from_outside": from_outside,
            "conversation_id": str(conversation),
            "decision": decision.kind,
            "route": decision.route or "",
            "address": decision.address or "",
            "mirror_address": decision.mirror_address or "",
            "principal": principal,
            "target_database": decision.database or "",
            "reason": decision.reason,
            "note": note,
            "steps": steps,
        }

    def stats_view(self) -> dict[str, Any]:
        out = dict(vars(self.stats))
        out["forward_buffer_bytes"] = self.budget.held
        out["forward_buffer_peak"] = self.budget.peak
        out["forward_buffer_limit"] = self.budget.limit
        out["pending_route_requests"] = len(self.requests)
        return out

    def mirrors_view(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = [
            {
                "kind": "local database",
                "name": db.name,
                "broker_instance": str(db.broker_instance),
                "role": db.mirror_role,
                "epoch": db.mirror_epoch,
                "principal": "",
            }
            for db in self.engine.databases.values()
            if db.mirror_role is not None
        ]
        rows += [
            {
                "kind": "mirrored route",
                "name": f"{p.key.address} / {p.key.mirror_address}",
                "broker_instance": str(p.key.broker_instance or ""),
                "role": p.status(),
                "epoch": p.epoch,
                "principal": p.principal or "",
            }
            for p in self.mirrors.pairs.values()
        ]
        return rows


def _matched_step(decision: routing.Decision) -> str | None:
    """``R-ROUTE-4 step N, R-ROUTE-5 step M`` from a decision's reason, for traces."""
    head = decision.reason.split(":", 1)[0]
    return head if head.startswith("R-ROUTE-4") else None
