"""What the admin port reads of the daemon, once per scrape or console refresh: the rows
of the daemon's own views (``brokerd.server.client_views``, the ones ``brokerctl``
prints), the client connections and each database's commit latencies.

May import: ``brokerd.server.client_views``, ``brokerd.dialogs.verbs.paging`` and
``brokerd.dialogs.verbs.views``, ``brokerd.storage.latency`` and the standard library.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.dialogs.verbs.paging import MAX_PAGE, PageRequest
from brokerd.dialogs.verbs.views import TransmissionBacklog
from brokerd.server.client_views import VIEWS, Rows, ViewedBroker
from brokerd.storage.latency import CommitLatency

if TYPE_CHECKING:
    from brokerd.config import BrokerConfig


class AdminBroker(ViewedBroker, Protocol):
    """What the admin port reads of the daemon (``brokerd.server.daemon.Broker``)."""

    config: BrokerConfig
    instance_name: str
    started_at: float
    ready: bool
    client_sessions: set[Any]


READ_VIEWS = (
    "stats",
    "queues",
    "broker_connections",
    "endpoint_ages",
    "routes",
)
"""The views a snapshot holds (the transmission queue is summed up instead:
:class:`~brokerd.dialogs.verbs.views.TransmissionBacklog`)."""
OLDEST_LISTED = 50
"""Messages of the transmission queue a snapshot lists (the oldest)."""


@dataclass(frozen=True)
class PeerWait:
    """A far peer's share of the transmission queue as the admin port shows it: a
    :class:`~brokerd.dialogs.verbs.views.PeerBacklog` with its oldest message's age at
    the snapshot's time instead of its enqueue time."""

    peer: str
    messages: int
    oldest_age: float
    status: str


@dataclass
class Snapshot:
    instance: str
    taken_at: float
    uptime: float
    ready: bool
    views: dict[str, Rows]
    backlog: TransmissionBacklog
    client_connections: int
    commit_latency: dict[str, CommitLatency] = field(default_factory=dict)

    @property
    def stats(self) -> dict[str, Any]:
        rows = self.views["stats"]
        return rows[0] if rows else {}

    def peers(self) -> list[PeerWait]:
        """The transmission queue by far broker instance (or far service while no broker
        has answered), oldest first."""
        return [
            PeerWait(p.peer, p.messages, max(0.0, self.taken_at - p.oldest_enqueued_at), p.status)
            for p in self.backlog.peers
        ]

    def endpoints_by_state(self) -> dict[tuple[str, str], int]:
        """Endpoints per (database, state)."""
        out: dict[tuple[str, str], int] = {}
        for row in self.views["endpoint_ages"]:
            key = (str(row["database"]), str(row["state"]))
            out[key] = out.get(key, 0) + int(row["endpoints"])
        return out

    def connections_by_state(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.views["broker_connections"]:
            out[str(row["state"])] = out.get(str(row["state"]), 0) + 1
        return out


async def take(broker: AdminBroker) -> Snapshot:
    """Read the views of :data:`READ_VIEWS` now."""
    views: dict[str, Rows] = {}
    page = PageRequest("", MAX_PAGE)
    meta: Mapping[str, Any] = {}
    for name in READ_VIEWS:
        rows = VIEWS[name].rows(broker, page, meta)
        if isinstance(rows, Awaitable):
            rows = await rows
        views[name] = rows
    backlog = await broker.engine.conversation_verbs.transmission_backlog(OLDEST_LISTED)
    now = time.time()
    return Snapshot(
        instance=broker.instance_name,
        taken_at=now,
        uptime=now - broker.started_at,
        ready=broker.ready,
        views=views,
        backlog=backlog,
        client_connections=len(broker.client_sessions),
        commit_latency={
            name: db.store.commit_latency for name, db in broker.engine.databases.items()
        },
    )
