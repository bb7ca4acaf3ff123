"""The router's shared state: what several of its parts read and write (SPEC §2).

Owns :class:`RouterState`, the one part every other part is handed: the statistics
(:class:`RouterStats`), the databases of this instance as routing sees them
(``local_dbs``), the decisions shared between conversations (:class:`DecisionCache`: one
for conversations that begin or are answered here, one for messages from outside),
forgetting them when routes or roles change (:meth:`RouterState.forget_decisions`), and
routing a database's conversations again (:meth:`RouterState.reroute`, R-ROUTE-13).

It is handed the engine as :class:`StateServices`: the databases and ``transmit``.

May import: ``brokerd.routing``, and for types only the models of ``brokerd.dialogs``.
Never another module of the router.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from brokerd.routing import rules as routing

if TYPE_CHECKING:
    from brokerd.dialogs.endpoints.database import Database
    from brokerd.dialogs.endpoints.endpoint import Endpoint
    from brokerd.routing.forwarding import ForwardBudget

DECISION_CACHE_LIMIT = 10_000
"""Shared decisions kept (one per database, service and broker instance; cleared past it)."""

INBOUND_CACHE_LIMIT = 100_000
"""Decisions kept for messages from outside (one per conversation and direction)."""

SharedKey = tuple[str, bool, str, uuid.UUID | None]
"""A shared decision's key: route table (database), from outside, service, broker instance."""

InboundKey = tuple[uuid.UUID, bool, str, uuid.UUID | None]
"""A message from outside's key: conversation, initiator, target service, broker instance."""

K = TypeVar("K", bound=Hashable)


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
    route_requests_deferred: int = 0
    """MissingRoute requests not sent: ``limits.route_requests`` were pending (R-ROUTE-14)."""
    principal_queries_sent: int = 0
    principal_queries_answered: int = 0
    mirror_pairs_evicted: int = 0
    """Mirrored pairs forgotten to stay within ``limits.mirror_pairs`` (R-ROUTE-10)."""
    route_changes: int = 0
    route_decisions: int = 0
    """Decisions made in full (the others were shared, see ``RouteDecisions.decide``)."""


class DecisionCache(Generic[K]):
    """Routing decisions by key, kept until the first of the routes they consulted expires
    (then every one is forgotten) or until more than ``limit`` are held."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._decisions: dict[K, routing.Decision] = {}
        self._expires = math.inf

    def stale(self, now: float) -> bool:
        """A route consulted has expired by ``now`` (a POSIX time), or the cache is full."""
        return now >= self._expires or len(self._decisions) > self.limit

    def get(self, key: K) -> routing.Decision | None:
        return self._decisions.get(key)

    def keep(self, key: K, decision: routing.Decision) -> None:
        self._decisions[key] = decision

    def expire_with(self, decision: routing.Decision) -> None:
        """Forget every decision when ``decision`` may change (its ``valid_until``)."""
        if decision.valid_until is not None:
            self._expires = min(self._expires, decision.valid_until.timestamp())

    def clear(self) -> None:
        self._decisions.clear()
        self._expires = math.inf


class StateServices(Protocol):
    """What the shared state needs of the dialog engine."""

    databases: dict[str, Database]

    def transmit(self, ep: Endpoint) -> None: ...


class RouterState:
    """The state several parts of the router share (see the module docstring)."""

    def __init__(self, engine: StateServices) -> None:
        self.engine = engine
        self.stats = RouterStats()
        self.local_dbs: list[routing.LocalDatabase] = []
        """The databases of this instance and their services (R-ROUTE-4 step 1)."""
        self.shared_decisions: DecisionCache[SharedKey] = DecisionCache(DECISION_CACHE_LIMIT)
        """Decisions that do not depend on the conversation: see ``RouteDecisions.decide``."""
        self.inbound_decisions: DecisionCache[InboundKey] = DecisionCache(INBOUND_CACHE_LIMIT)
        """The route of each conversation's messages from outside (R-ROUTE-1)."""

    def start(self) -> None:
        """The databases are open: learn their services, decide everything anew."""
        self.local_dbs = [
            routing.LocalDatabase(db.name, db.broker_instance, frozenset(db.catalog.services))
            for db in self.engine.databases.values()
        ]
        self.forget_decisions()

    def forget_decisions(self) -> None:
        """Routes or roles changed: every decision is made again."""
        self.shared_decisions.clear()
        self.inbound_decisions.clear()

    def reroute(self, db: Database, service: str | None = None) -> None:
        """Route ``db``'s conversations again (only those for ``service`` if given):
        DELAYED ones are transmitted at once (R-ROUTE-13)."""
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

    def stats_view(self, budget: ForwardBudget, pending_route_requests: int) -> dict[str, Any]:
        """The statistics, with the forwarding budget's and the dynamic routing requests'."""
        out = dict(vars(self.stats))
        out["forward_buffer_bytes"] = budget.held
        out["forward_buffer_peak"] = budget.peak
        out["forward_buffer_limit"] = budget.limit
        out["pending_route_requests"] = pending_route_requests
        return out
