"""The outgoing connection to one peer address, shared by every dialog routed there.

:class:`PeerLink` is opened on demand, dialled again with exponential backoff (at
once when the peer shows it is back), and carries the readable status ("connection
refused by 127.0.0.2:4022 ...") that waiting messages show. It also carries
forwarded messages (R-ROUTE-7) and principal queries (R-ROUTE-10), held until the
connection opens. The connection itself is a ``peer_connection.BrokerProtocol``;
what the link uses of the transport is :class:`LinkOwner`.

May import: ``protocol``, ``brokerd.config``, ``brokerd.routing``, ``brokerd.dialogs``
(the peer's identity; the engine's types only), ``brokerd.server.peer_connection``.
Never ``brokerd.server.transport``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from typing import TYPE_CHECKING, Protocol

from brokerd.config import EndpointConfig, parse_tcp_address
from brokerd.dialogs.endpoints.binding import peer_identity
from brokerd.routing.forwarding import CONNECT_GRACE, Forward
from brokerd.server.peer_connection import BrokerProtocol, ConnectionOwner
from protocol import dialog, events
from protocol.connection import Role

if TYPE_CHECKING:
    from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage

log = logging.getLogger("brokerd.server.transport")  # one log for every part of the transport


class LinkOwner(ConnectionOwner, Protocol):
    """What a link uses of the transport (``transport.Transport``): what its connections
    use, the endpoint's configuration, and whether the transport is stopping."""

    @property
    def config(self) -> EndpointConfig: ...

    @property
    def stopping(self) -> bool: ...


class PeerLink:
    """The outgoing connection to one peer address, shared by all dialogs routed there."""

    def __init__(self, owner: LinkOwner, address: str) -> None:
        self.owner = owner
        self.name = address
        self.host, self.port = parse_tcp_address(address)
        self.protocol: BrokerProtocol | None = None
        self.waiting: set[Endpoint] = set()
        self.pending: list[
            Forward | events.PrincipalQuery | events.PrincipalAnswer | events.Mirror
        ] = []
        """Forwarded messages and principal queries held until the connection opens."""
        self.waiting_bytes = 0
        """The forwarded messages' bytes among them (:meth:`may_hold`)."""
        self._waiting_since: float | None = None
        self.users: set[Endpoint] = set()
        self.pinned = False
        """Dialled by a mirror partner for its mirroring session (R-ROUTE-16): kept open."""
        self.attempts = 0
        self._status = "not connected yet"
        self._task: asyncio.Task[None] | None = None
        self._dial_now: asyncio.Event | None = None
        """Set when the peer has shown it is back: the wait before the next attempt ends."""

    @property
    def identity(self) -> str:
        """The identity of the open connection's peer (R-DLG-14)."""
        return self.protocol.identity if self.protocol is not None else peer_identity(None)

    @property
    def is_open(self) -> bool:
        return self.protocol is not None and self.protocol.is_open

    @property
    def status(self) -> str:
        return self._status

    def queue_fragment(self, ep: Endpoint, msg: OutMessage, index: int) -> bool:
        self.users.add(ep)
        if self.protocol is not None and self.protocol.is_open:
            return self.protocol.queue_fragment(ep, msg, index)
        self.want(ep)
        return True

    def queue_acks(self, headers: list[dialog.DialogHeader]) -> None:
        if self.protocol is not None and self.protocol.is_open:
            self.protocol.queue_acks(headers)

    def queue_header(self, header: dialog.DialogHeader, body: bytes) -> None:
        if self.protocol is not None and self.protocol.is_open:
            self.protocol.queue_header(header, body)

    def forward(self, item: Forward) -> None:
        """Relay a forwarded message (R-ROUTE-7), connecting first if needed."""
        if self.protocol is not None and self.protocol.is_open:
            self.protocol.forward(item)
        else:
            self.pending.append(item)
            if not self.waiting_bytes:
                self._waiting_since = time.monotonic()
            self.waiting_bytes += item.size
            self.connect()

    def may_hold(self, size: int, limit: int) -> bool:
        """Whether a forwarded item of ``size`` bytes may wait here, of a budget of
        ``limit``: always on an open connection or within the connection's grace
        (:data:`CONNECT_GRACE`), else up to a quarter of the budget (R-ROUTE-7)."""
        if self.is_open or self._waiting_since is None:
            return True
        if time.monotonic() - self._waiting_since < CONNECT_GRACE:
            return True
        return (self.waiting_bytes + size) * 4 <= limit

    def stale_bytes(self, now: float) -> int:
        """Forwarded bytes that have waited past the grace for a connection to open."""
        since = self._waiting_since
        if since is None or now - since < CONNECT_GRACE:
            return 0
        return self.waiting_bytes

    def _unwait(self) -> None:
        self.waiting_bytes = 0
        self._waiting_since = None

    def send_control(
        self, event: events.PrincipalQuery | events.PrincipalAnswer | events.Mirror
    ) -> None:
        if self.protocol is not None and self.protocol.is_open:
            self.protocol.send_control(event)
        else:
            self.pending.append(event)
            self.connect()

    def redial(self, reason: str) -> None:
        """Close the open connection and dial again (R-PROTO-5): it carries nothing back."""
        if self.protocol is not None and self.protocol.is_open:
            self.protocol.drop(reason)

    def want(self, ep: Endpoint) -> None:
        """``ep`` has messages for this peer: connect if needed, then send them."""
        self.waiting.add(ep)
        if self.is_open:
            waiting, self.waiting = self.waiting, set()
            self.owner.engine.link_up(self, waiting)
            return
        self.connect()

    def connect(self) -> None:
        """Open the connection unless it is open or being opened."""
        if self._task is None and not self.owner.stopping and not self.is_open:
            self._task = asyncio.get_running_loop().create_task(
                self._connect(), name=f"connect-{self.name}"
            )

    async def _connect(self) -> None:
        endpoint = self.owner.config
        delay = endpoint.reconnect_initial
        try:
            while not self.owner.stopping:
                self.attempts += 1
                if self.attempts == 1 or self._status.startswith("not connected"):
                    self._status = f"connecting to {self.host}:{self.port}"
                try:
                    await self._open_once(endpoint.connect_timeout)
                    if self.is_open or not self._wanted():
                        return
                    # Lost between its handshake and now: ``lost`` found this attempt
                    # still running, so its ``want`` dialled nothing. Dial again at once,
                    # as it would have.
                    continue
                except (OSError, TimeoutError, ConnectionError) as exc:
                    self._status = (
                        f"{_describe(exc, self.host, self.port)} (attempt {self.attempts}); "
                        f"next attempt in {delay:g} s"
                    )
                    log.info("link %s: %s", self.name, self._status)
                    self.owner.engine.trace.emit(
                        "connection_refused", peer=self.name, reason=self._status
                    )
                    for ep in self.waiting:
                        ep.waiting_status = self._status
                    self._fail_pending()
                    self.owner.engine.router.link_unreachable(self.name)
                    # The failed attempt's frames (this link, its connection) are held by
                    # a cycle through the exception asyncio kept: free them now, so that
                    # a link nothing holds goes at once (``Transport.links``).
                    traceback.clear_frames(exc.__traceback__)
                if not self._wanted():
                    return
                if await self._wait_before_dialling(delay):
                    delay = endpoint.reconnect_initial
                else:
                    delay = min(endpoint.reconnect_max, delay * 2)
                if not self._wanted():
                    return
        finally:
            self._task = None

    def _wanted(self) -> bool:
        """Whether anything still waits for this link to open: an endpoint with messages
        not acknowledged, a held item, or a mirroring session. A link nobody waits on
        stops dialling (R-DLG-6: an unreachable service is retried while messages wait,
        not for as long as the daemon runs); the next message dials it again."""
        self.waiting = {ep for ep in self.waiting if ep.has_unacknowledged}
        self.users = {ep for ep in self.users if ep.has_unacknowledged}
        if self.pinned or self.pending or self.waiting or self.users:
            return True
        self._status = f"{self._status.split('; next attempt')[0]}; nothing waits to be sent"
        return False

    async def _wait_before_dialling(self, delay: float) -> bool:
        """Sleep ``delay`` seconds, or less if the peer shows it is back (then True)."""
        event = self._dial_now = asyncio.Event()
        try:
            await asyncio.wait_for(event.wait(), delay)
            return True
        except TimeoutError:
            return False
        finally:
            self._dial_now = None

    def peer_is_back(self) -> None:
        """The peer connected to us: if this link is waiting to dial it again, dial now."""
        if self._dial_now is not None:
            log.info("link %s: the peer connected to us; dialling it now", self.name)
            self._dial_now.set()

    async def _open_once(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        protocol = BrokerProtocol(self.owner, Role.INITIATOR, self)
        self.protocol = protocol
        try:
            host = self.owner.config.host
            local = None if host in ("0.0.0.0", "::", "") else (host, 0)
            await asyncio.wait_for(
                loop.create_connection(lambda: protocol, self.host, self.port, local_addr=local),
                timeout,
            )
            await asyncio.wait_for(asyncio.shield(protocol.handshake_done), timeout)
        except BaseException as exc:
            if isinstance(exc, TimeoutError) and protocol.is_open:
                # The handshake completed while the wait was timing out (a turn of the
                # loop apart): the connection is open, and the link sent on it (``opened``).
                return
            if protocol.transport is not None:
                protocol.transport.abort()
            if self.protocol is protocol:
                self.protocol = None
            if not protocol.handshake_done.done():
                protocol.handshake_done.cancel()
            elif not protocol.handshake_done.cancelled():
                protocol.handshake_done.exception()
            if protocol.close_reason and "closed by" in protocol.close_reason:
                raise ConnectionError(protocol.close_reason) from None
            raise

    def _fail_pending(self) -> None:
        """Nothing is kept for a peer that cannot be reached: senders of forwarded messages
        retry, and principal queries are asked again (R-ROUTE-10)."""
        forwards = [item for item in self.pending if type(item) is Forward]
        self.pending = []
        self._unwait()
        if forwards:
            self.owner.engine.router.forward_lost(forwards)

    def opened(self, protocol: BrokerProtocol) -> None:
        self.attempts = 0
        self._status = f"connected to {protocol.name}"
        pending, self.pending = self.pending, []
        self._unwait()
        for item in pending:
            if isinstance(item, Forward):
                protocol.forward(item)
            else:
                protocol.send_control(item)
        waiting, self.waiting = self.waiting, set()
        self.owner.engine.link_up(self, waiting)

    def lost(self, protocol: BrokerProtocol, reason: str) -> None:
        if self.protocol is not protocol:
            return
        self.protocol = None
        if not protocol.opened:
            return  # a failed attempt: _connect reports it and retries
        self._status = reason
        users = [ep for ep in self.users if ep.has_unacknowledged]
        self.users = set(users)
        self.owner.engine.link_down(self, users)

    def stop_dialling(self) -> None:
        """Give up the connection attempts under way (the transport is stopping)."""
        if self._task is not None:
            self._task.cancel()

    def idle(self) -> bool:
        if self.pinned:
            return False
        return (
            not any(ep.has_unacknowledged for ep in self.users)
            and not self.waiting
            and not self.pending
        )


def _describe(exc: BaseException, host: str, port: int) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused by {host}:{port}"
    if isinstance(exc, TimeoutError):
        return f"no answer from {host}:{port} (timed out)"
    if isinstance(exc, ConnectionError) and str(exc):
        return str(exc)
    return f"cannot connect to {host}:{port}: {exc}"
