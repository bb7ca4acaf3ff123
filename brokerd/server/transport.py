"""Broker-to-broker TCP: the listener on port 4022 and the links of one instance (R-PROTO-1..3).

:class:`Transport` accepts connections on 4022 (admitting them under the caps on
connections and handshakes), makes one outgoing :class:`~brokerd.server.peer_link.PeerLink`
per peer address, stops reading connections while the inbound backlog is high, gives
the ``broker_connections`` view, and runs the watch that sends heartbeats and closes
connections that have received nothing for the heartbeat deadline (R-PROTO-5; an
outgoing one is then dialled again), that never completed their handshake, or that
are idle (R-PROTO-3; heartbeats do not count as activity).

One connection, its receiving side and its send pump, is
``peer_connection.BrokerProtocol``; the dialling of one address with its backoff and
held items is ``peer_link.PeerLink``.

May import: ``protocol``, ``brokerd.config``, ``brokerd.dialogs`` (the engine's type
only), ``brokerd.server.peer_connection``, ``brokerd.server.peer_link``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import weakref
from typing import TYPE_CHECKING, Any

from brokerd.config import EndpointConfig
from brokerd.config.addresses import is_ip_address
from brokerd.server.peer_connection import BrokerProtocol, MirroringHandler
from brokerd.server.peer_link import PeerLink
from protocol.connection import ConnectionSettings, Role
from protocol.errors import CloseCode
from protocol.frames import EncryptionMode
from protocol.liveness import LivenessAction, LivenessSettings
from protocol.security import Identity

if TYPE_CHECKING:
    from brokerd.dialogs.engine import DialogEngine

log = logging.getLogger("brokerd.server.transport")  # one log for every part of the transport

REFUSAL_LOG_INTERVAL = 10.0
"""Seconds between two warnings that incoming connections were refused."""


class Transport:
    """The listener and the links of one instance."""

    def __init__(self, config: EndpointConfig, identity: Identity) -> None:
        self.config = config
        self.settings = ConnectionSettings(
            identity=identity,
            encryption=EncryptionMode[config.encryption.upper()],
            max_frame_size=config.max_frame_size,
            fragments_per_frame=config.fragments_per_frame,
        )
        self.liveness = LivenessSettings(config.heartbeat_interval, config.heartbeat_deadline)
        self.engine: DialogEngine  # set by the daemon before start()
        self.mirroring: MirroringHandler | None = None
        """Set by the daemon when a database is mirrored with a partner (R-ROUTE-16)."""
        self.links: weakref.WeakValueDictionary[str, PeerLink] = weakref.WeakValueDictionary()
        """The outgoing link of each address, while something holds it: a conversation
        routed there, a connection or an attempt under way, held items. One nobody holds
        any more goes (a TRANSPORT route makes an address of every service name a peer
        sends for, R-ROUTE-9), and the next message for its address makes it again."""
        self.connections: set[BrokerProtocol] = set()
        self.server: asyncio.Server | None = None
        self.stopping = False
        self._watch_task: asyncio.Task[None] | None = None
        self._lookups: set[asyncio.Task[None]] = set()
        """Host-name lookups of :meth:`peer_connected` under way."""
        self.evicted_handshakes = 0
        self.inbound_high_water = config.inbound_backlog_mb * 1024 * 1024
        """Bytes received and not yet committed above which broker connections are not
        read (the peers' writes then block, and their retry clocks do not start) ..."""
        self.inbound_low_water = self.inbound_high_water // 4
        """... until this much is left."""
        self._held: set[BrokerProtocol] = set()
        """Connections not read while the inbound backlog is high."""
        self._release: asyncio.TimerHandle | None = None
        self.holds = 0
        """Times a connection was held (``hold_reading``)."""
        self._refusals_unlogged = 0
        """Connections refused since the last warning that said so (``refused``)."""
        self._refusal_logged_at = -REFUSAL_LOG_INTERVAL

    def link_for(self, address: str) -> PeerLink:
        link = self.links.get(address)
        if link is None:
            link = PeerLink(self, address)
            self.links[address] = link
        return link

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: BrokerProtocol(self, Role.ACCEPTOR, None),
            self.config.host,
            self.config.port,
            reuse_address=True,
        )
        self._watch_task = loop.create_task(self._watch(), name="transport-watch")

    async def stop(self) -> None:
        self.stopping = True
        if self._watch_task is not None:
            self._watch_task.cancel()
        for lookup in list(self._lookups):
            lookup.cancel()
        if self.server is not None:
            self.server.close()
        for protocol in list(self.connections):
            protocol.close(CloseCode.SHUTDOWN, "broker shutting down")
        for link in self.links.values():
            link.stop_dialling()
        if self.server is not None:
            await self.server.wait_closed()
            self.server = None
        await asyncio.sleep(0)

    async def _watch(self) -> None:
        """Abort connections that have not completed their handshake within
        ``handshake_timeout``; on open ones, send heartbeats and drop those silent for
        ``heartbeat_deadline`` (R-PROTO-5); close those idle for ``idle_timeout``."""
        timeout = self.config.idle_timeout
        handshake = self.config.handshake_timeout
        interval = self.liveness.heartbeat_interval
        deadline = self.liveness.deadline
        while True:
            await asyncio.sleep(max(0.05, min(1.0, timeout / 4, handshake / 4, interval / 4)))
            now = time.time()
            mono = time.monotonic()
            self._log_refusals()
            for protocol in list(self.connections):
                if not protocol.opened and not protocol.closed:
                    if now - protocol.created >= handshake:
                        protocol.abort(f"no handshake within {handshake:g} s")
                    continue
                if not protocol.is_open:
                    continue
                if protocol in self._held:
                    protocol.liveness.heard(mono)  # we stopped reading it, it is not silent
                action = protocol.liveness.poll(mono)
                if action is LivenessAction.DEAD:
                    protocol.drop(
                        f"nothing received from {protocol.name} for {deadline:g} s "
                        "(endpoint.heartbeat_deadline)"
                    )
                    continue
                if action is LivenessAction.HEARTBEAT:
                    protocol.heartbeat()
                if now - protocol.last_activity < timeout:
                    continue
                if protocol.pinned or (protocol.link is not None and not protocol.link.idle()):
                    continue
                if protocol in self._held:
                    continue  # not idle: this side stopped reading what the peer sent
                protocol.close(CloseCode.IDLE, f"idle for {timeout:g} s")

    def admission(self, host: str) -> str | None:
        """Why a new incoming connection from ``host`` is refused, or None (the caps).

        Beyond ``max_pending_handshakes`` connections in their handshake, or at
        ``max_connections``, the oldest connection still in its handshake is closed to
        make room (as SSH's MaxStartups drops unauthenticated ones): a flood of
        connections that never authenticate churns among themselves, while a broker's
        handshake, done in milliseconds, completes. Only authenticated connections
        filling ``max_connections`` refuse a newcomer.
        """
        config = self.config
        incoming = [p for p in self.connections if p.link is None and not p.closed]
        same = sum(1 for p in incoming if p.peer_host == host)
        if same >= config.max_connections_per_address:
            return (
                f"{same} incoming connections from {host} already "
                "(endpoint.max_connections_per_address)"
            )
        pending = [p for p in incoming if not p.opened]
        if len(incoming) >= config.max_connections or len(pending) >= config.max_pending_handshakes:
            if not pending:
                return f"{len(incoming)} incoming connections already (endpoint.max_connections)"
            oldest = min(pending, key=lambda p: p.created)
            self.evicted_handshakes += 1
            oldest.evict(
                f"closed to admit a newer connection: {len(pending)} connections were in "
                "their handshake (endpoint.max_pending_handshakes)"
            )
        return None

    def refused(self, address: str, reason: str) -> None:
        """Log that a connection from ``address`` was refused by the caps, at most
        once per :data:`REFUSAL_LOG_INTERVAL` with how many more were refused meanwhile,
        so that a flood of connections over a cap does not flood the log."""
        now = time.monotonic()
        if now - self._refusal_logged_at < REFUSAL_LOG_INTERVAL:
            self._refusals_unlogged += 1
            return
        self._refusal_logged_at = now
        more, self._refusals_unlogged = self._refusals_unlogged, 0
        also = f" ({more} more refused before it)" if more else ""
        log.warning("connection from %s refused: %s%s", address, reason, also)

    def _log_refusals(self) -> None:
        """Say how many connections were refused since the last warning, once it is old."""
        if self._refusals_unlogged and (
            time.monotonic() - self._refusal_logged_at >= REFUSAL_LOG_INTERVAL
        ):
            self._refusal_logged_at = time.monotonic()
            more, self._refusals_unlogged = self._refusals_unlogged, 0
            log.warning("%d more incoming connections refused (endpoint caps)", more)

    def hold_reading(self, protocol: BrokerProtocol) -> None:
        """Stop reading ``protocol`` until what peers sent has been committed down to the
        low water mark, and the messages held to forward are down to a quarter of their
        budget: a receiver that cannot commit as fast as peers write, or a forwarder
        whose next hop is slower than the sender, makes them wait, instead of buffering
        without bound and acknowledging so late that they resend, or dropping what it
        cannot hold (R-ROUTE-7)."""
        if protocol in self._held or protocol.transport is None or protocol.closed:
            return
        protocol.transport.pause_reading()
        self._held.add(protocol)
        self.holds += 1
        if self._release is None:
            self._release = asyncio.get_running_loop().call_later(0.01, self._release_held)

    def backlog_high(self) -> bool:
        """Whether connections that bring messages are to be held: more received from
        peers than committed beyond the high water mark, or over half the forwarding
        budget waiting to be relayed (``ForwardBudget.high``)."""
        budget = self.engine.router.budget
        return self.engine.inbound_backlog() > self.inbound_high_water or (
            budget.held > 0 and budget.high(self._stale_forwards())
        )

    def _stale_forwards(self) -> int:
        """Forwarded bytes waiting past the grace for a next hop that does not connect:
        not counted toward holding the readers (``ForwardBudget``)."""
        now = time.monotonic()
        return sum(link.stale_bytes(now) for link in self.links.values() if link.waiting_bytes)

    def _backlog_low(self) -> bool:
        """Whether held connections may be read again: both down to a quarter."""
        return (
            self.engine.inbound_backlog() <= self.inbound_low_water
            and self.engine.router.budget.low(self._stale_forwards())
        )

    def _release_held(self) -> None:
        self._release = None
        if self._held and not self._backlog_low():
            self._release = asyncio.get_running_loop().call_later(0.01, self._release_held)
            return
        held, self._held = self._held, set()
        for protocol in held:
            if protocol.transport is not None and not protocol.closed:
                protocol.transport.resume_reading()

    def view(self) -> dict[str, Any]:
        """Counters of the ``stats`` view."""
        return {"handshakes_evicted": self.evicted_handshakes, "inbound_holds": self.holds}

    def peer_connected(self, host: str) -> None:
        """A broker at ``host`` (the address it connected from) completed a handshake with
        us: it is up, so links to it that wait before dialling again dial now (a returning
        peer is reached at once, whatever the reconnect back-off has grown to). A link that
        names its peer by a host name (a compose deployment's) is matched by what that
        name resolves to, looked up without blocking."""
        named: list[PeerLink] = []
        for link in list(self.links.values()):
            if link.is_open:
                continue
            if link.host == host:
                link.peer_is_back()
            elif not is_ip_address(link.host):
                named.append(link)
        if named:
            task = asyncio.get_running_loop().create_task(
                _back_by_name(host, named), name="peer-back-by-name"
            )
            self._lookups.add(task)
            task.add_done_callback(self._lookups.discard)

    def broker_connections(self) -> list[dict[str, Any]]:
        return [p.view() for p in sorted(self.connections, key=lambda p: p.peer_address)]


async def _back_by_name(host: str, links: list[PeerLink]) -> None:
    """Links among ``links`` whose host name resolves to ``host`` dial now."""
    loop = asyncio.get_running_loop()
    for link in links:
        try:
            infos = await loop.getaddrinfo(link.host, link.port, type=socket.SOCK_STREAM)
        except OSError:
            continue
        if any(info[4][0] == host for info in infos) and not link.is_open:
            link.peer_is_back()
