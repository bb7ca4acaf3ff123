"""The router's shared core: its state, statistics and what it is given (SPEC §2).

Owns what every part of the router uses: the protocols through which it reaches the
dialog engine (:class:`DialogServices`) and the mirroring service (:class:`MirrorHooks`),
the state routing keeps between messages (shared decisions, mirrored pairs, dynamic
route requests, the forwarding budget), forgetting the shared decisions when routes or
roles change, and routing a database's conversations again
(:meth:`RouterCore.reroute`). The parts built on it: ``route_requests`` (dynamic
routing), ``mirror_roles`` (mirroring), ``route_admin`` (route administration),
``route_decisions`` (the route of each conversation) and ``inbound`` (messages from
outside, forwarding); ``router`` joins them.

May import: ``protocol``, ``brokerd.routing``, ``brokerd.config``, and for types only
``brokerd.storage``, ``brokerd.traces`` and the models of ``brokerd.dialogs``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import math
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.config import normal_tcp_address
from brokerd.routing import rules as routing
from brokerd.routing.forwarding import ForwardBudget
from brokerd.routing.mirrors import MirrorTracker
from protocol import events
from protocol.dialog import DialogHeader

if TYPE_CHECKING:
    from brokerd.config import BrokerConfig, RetryConfig
    from brokerd.dialogs.endpoints.database import Database
    from brokerd.dialogs.endpoints.endpoint import Endpoint
    from brokerd.dialogs.transmission.links import Link, LinkProvider
    from brokerd.storage.queries import Statement
    from brokerd.traces.writer import TraceWriter


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


class RouterCore:
    """The state every part of the router uses (see the module docstring)."""

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
        service, broker instance): see :meth:`RouteDecisions.decide`."""
        self._decisions_expire = math.inf
        self._query_ids = itertools.count(1)
        self.mirroring: MirrorHooks | None = None
        """Set by the daemon when a database is mirrored with a partner (R-ROUTE-16)."""

    def start(self) -> None:
        self.local_dbs = [
            routing.LocalDatabase(db.name, db.broker_instance, frozenset(db.catalog.services))
            for db in self.engine.databases.values()
        ]
        self.forget_decisions()

    def forget_decisions(self) -> None:
        """Routes or roles changed: every decision is made again."""
        self._decisions.clear()
        self._decisions_expire = math.inf
        self._inbound.clear()
        self._inbound_expires = math.inf

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

    def stats_view(self) -> dict[str, Any]:
        out = dict(vars(self.stats))
        out["forward_buffer_bytes"] = self.budget.held
        out["forward_buffer_peak"] = self.budget.peak
        out["forward_buffer_limit"] = self.budget.limit
        out["pending_route_requests"] = len(self.requests)
        return out
