"""Dynamic routing (R-ROUTE-14): the router's MissingRoute requests.

Owns :class:`RouteRequests` and the requests it keeps (:class:`RouteRequest`): at most one
MissingRoute request per service name in flight, sent on a dialog from the system service
``brokerd/RouteRequester``; when the routing service ends that dialog the waiting
conversations are routed again. A request left unanswered is abandoned and made again; an
answered one still counts as pending for ``retry.delayed_retry`` seconds. At most
``limits.route_requests`` are pending for one database's route table (msdb's for
messages from outside, whose services a peer names): a conversation that would ask beyond
it stays DELAYED and asks when it is routed again (after ``retry.delayed_retry``, or at
once when a request is answered), a message from outside is dropped, not acknowledged
(its sender retries); each is counted in ``route_requests_deferred``, and logged at most
once a minute.

It is handed the engine as :class:`RequestServices` (the dialog verbs it sends the request
with), the router's shared state (the statistics, routing a database again) and the
configured limits.

May import: ``protocol``, ``brokerd.routing``, ``brokerd.storage``, the router's ``state``,
and for types only the models of ``brokerd.dialogs`` and ``brokerd.config``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from xml.sax.saxutils import escape

from brokerd.routing import rules as routing
from brokerd.storage.catalog import ROUTE_REQUESTER_SERVICE
from protocol.dialog import BROKER_CONFIGURATION_NOTICE, MISSING_ROUTE
from protocol.errors import BrokerError

if TYPE_CHECKING:
    from brokerd.config import LimitsConfig, RetryConfig
    from brokerd.dialogs.endpoints.database import Database
    from brokerd.dialogs.endpoints.endpoint import Endpoint
    from brokerd.dialogs.router.state import RouterState

log = logging.getLogger("brokerd.dialogs.router")  # one log for every part of the router


@dataclass
class RouteRequest:
    """A MissingRoute request to the dynamic routing service (R-ROUTE-14)."""

    database: str
    service: str
    started: float
    handle: uuid.UUID | None = None
    done_at: float | None = None


def missing_route_body(service: str, broker_instance: uuid.UUID | None, database: str) -> bytes:
    """The MissingRoute request (R-ROUTE-14): the service, the broker instance, the database."""
    instance = str(broker_instance) if broker_instance else ""
    return (
        f'<MissingRoute xmlns="{MISSING_ROUTE}">'
        f"<SERVICE_NAME>{escape(service)}</SERVICE_NAME>"
        f"<BROKER_INSTANCE>{instance}</BROKER_INSTANCE>"
        f"<DATABASE>{escape(database)}</DATABASE></MissingRoute>"
    ).encode()


class RequestServices(Protocol):
    """What dynamic routing needs of the dialog engine."""

    databases: dict[str, Database]
    retry: RetryConfig

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

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


class RouteRequests:
    """The MissingRoute requests of this instance (see the module docstring)."""

    def __init__(self, engine: RequestServices, state: RouterState, limits: LimitsConfig) -> None:
        self.engine = engine
        self.state = state
        self.limit = limits.route_requests
        """Requests pending at once for one database's route table, at most."""
        self.pending: dict[tuple[str, str], RouteRequest] = {}
        """The requests in flight or just answered, by (database, service)."""
        self._deferrals_logged_at = -math.inf

    def pending_services(self, database: str) -> set[str]:
        """Services of ``database`` with a MissingRoute request in flight or just answered."""
        now = time.monotonic()
        cooldown = self.engine.retry.delayed_retry
        timeout = max(60.0, 4 * cooldown)
        out: set[str] = set()
        for key, req in list(self.pending.items()):
            if key[0] != database:
                continue
            if req.done_at is None and now - req.started > timeout:
                log.warning("MissingRoute request for %r unanswered; asking again", req.service)
                self._abandon(req)
                del self.pending[key]
                continue
            if req.done_at is not None and now - req.done_at >= cooldown:
                del self.pending[key]
                continue
            out.add(req.service)
        return out

    def request_route(self, db: Database, service: str, broker_instance: uuid.UUID | None) -> None:
        """Ask the dynamic routing service for a route to ``service``, unless a request for
        it from ``db`` is already pending (R-ROUTE-14)."""
        key = (db.name, service)
        if key in self.pending:
            return
        if sum(1 for name, _ in self.pending if name == db.name) >= self.limit:
            self._deferred(db, service)
            return
        req = self.pending[key] = RouteRequest(db.name, service, time.monotonic())
        self.state.stats.route_requests += 1
        self.engine.loop.create_task(self._send_request(db, req, broker_instance))

    def _deferred(self, db: Database, service: str) -> None:
        """No request for ``service`` now: ``db``'s table has its limit pending. Counted,
        and logged at most once a minute (a peer naming new services defers one a
        message)."""
        self.state.stats.route_requests_deferred += 1
        now = time.monotonic()
        if now - self._deferrals_logged_at < 60.0:
            return
        self._deferrals_logged_at = now
        log.warning(
            "database %s: %d MissingRoute requests pending (limits.route_requests); the one "
            "for %r waits until one is answered (%d deferred so far) (R-ROUTE-14)",
            db.name,
            self.limit,
            service,
            self.state.stats.route_requests_deferred,
        )

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
        for req in self.pending.values():
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
            self.state.reroute(engine.databases[req.database], req.service)

    def _abandon(self, req: RouteRequest) -> None:
        if req.handle is not None:
            handle = req.handle
            self.engine.loop.create_task(self._cleanup(handle))

    async def _cleanup(self, handle: uuid.UUID) -> None:
        with contextlib.suppress(BrokerError):
            await self.engine.end_conversation(handle, cleanup=True)
