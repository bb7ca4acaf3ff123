"""Broker-to-broker TCP: the listener on port 4022 and one outgoing link per peer (R-PROTO-1..3).

* :class:`BrokerProtocol` runs one ``protocol.BrokerConnection`` over an asyncio
  transport (uvloop when installed). It hands dialog fragments and ACKs to the
  engine and pumps outgoing frames with backpressure: single-fragment messages
  and acknowledgements go first and one fragment of a large message after each
  round, so small messages are not held up behind a large one (R-DLG-7).
* :class:`PeerLink` is the outgoing connection to one address, shared by every
  dialog routed there: opened on demand, reconnected with exponential backoff,
  and carrying the readable status ("connection refused by 127.0.0.2:4022 ...")
  that waiting messages show. It also carries forwarded messages (R-ROUTE-7) and
  principal queries (R-ROUTE-10), held until the connection opens.
* :class:`Transport` owns the listener, the links, the ``broker_connections``
  view and the watch that sends heartbeats and closes connections that have
  received nothing for the heartbeat deadline (R-PROTO-5; an outgoing one is then
  dialled again), that never completed their handshake, or that are idle
  (R-PROTO-3; heartbeats do not count as activity).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, cast

from brokerd.config import EndpointConfig, parse_tcp_address
from brokerd.dialogs.endpoints.binding import peer_identity
from brokerd.dialogs.transmission.links import SendAcks, SendFragment, SendHeader
from brokerd.routing.forwarding import Forward
from brokerd.server.outbox import Outbox
from protocol import dialog, events
from protocol.buffers import Buffer, coalesce
from protocol.connection import BrokerConnection, ConnectionSettings, Role
from protocol.errors import CloseCode, LocalProtocolError, RemoteProtocolError
from protocol.frames import EncryptionMode, SizedPayload
from protocol.liveness import Liveness, LivenessAction, LivenessSettings
from protocol.security import Identity

if TYPE_CHECKING:
    from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage
    from brokerd.dialogs.engine import DialogEngine

log = logging.getLogger("brokerd.server.transport")


class MirroringHandler(Protocol):
    """What the transport hands to the mirroring service (``brokerd.server.mirroring``)."""

    def on_message(self, protocol: BrokerProtocol, payload: bytes) -> None: ...

    def connection_lost(self, protocol: BrokerProtocol) -> None: ...


HIGH_WATER = 512 * 1024
"""Stop feeding the socket while this much is already buffered for it."""


class BrokerProtocol(asyncio.Protocol):
    """One TCP connection between two brokers, either direction."""

    def __init__(self, transport_owner: Transport, role: Role, link: PeerLink | None) -> None:
        self.owner = transport_owner
        self.engine = transport_owner.engine
        self.link = link
        self.role = role
        self.conn = BrokerConnection(role, transport_owner.settings, datetime.now(UTC))
        self.transport: asyncio.Transport | None = None
        self.peer_address = ""
        self.peer_host = ""
        self.opened = False
        self.closed = False
        self.close_reason = ""
        self.login_time: float | None = None
        self.last_activity = time.time()
        """Wall-clock time of the last frame other than a heartbeat, either way (idle close)."""
        self.created = time.time()
        self.liveness = Liveness(transport_owner.liveness, time.monotonic())
        self.outbox = Outbox()
        self._paused = False
        self._pump_scheduled = False
        self.pinned = False
        """Carries a mirroring session (R-ROUTE-16): never closed as idle."""
        self.handshake_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- Link interface (used by the engine for acknowledgements and errors) -------

    @property
    def name(self) -> str:
        who = self.conn.peer_instance or "?"
        return f"{who}@{self.peer_address}"

    @property
    def identity(self) -> str:
        """Who the handshake authenticated (``peer:`` + certificate name, R-DLG-14)."""
        return peer_identity(self.conn.peer_instance)

    @property
    def is_open(self) -> bool:
        return self.opened and not self.closed

    @property
    def status(self) -> str:
        return "open" if self.is_open else (self.close_reason or "closed")

    def queue_fragment(self, ep: Endpoint, msg: OutMessage, index: int) -> None:
        self.outbox.add(SendFragment(ep, msg, index))
        self._schedule_pump()

    def queue_acks(self, headers: list[dialog.DialogHeader]) -> None:
        self.outbox.add_acks(headers)
        self._schedule_pump()

    def queue_header(self, header: dialog.DialogHeader, body: bytes) -> None:
        self.outbox.add(SendHeader(header, body))
        self._schedule_pump()

    def want(self, ep: Endpoint) -> None:
        if self.link is not None:
            self.link.want(ep)

    def forward(self, item: Forward) -> None:
        """Relay a forwarded fragment or acknowledgements (R-ROUTE-7)."""
        self.outbox.add(item)
        self._schedule_pump()

    def send_control(
        self, event: events.PrincipalQuery | events.PrincipalAnswer | events.Mirror
    ) -> None:
        self.outbox.add(event)
        self._schedule_pump()

    @property
    def direction(self) -> str:
        return "outbound" if self.role is Role.INITIATOR else "inbound"

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer_address = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.peer_host = str(peer[0]) if peer else "?"
        if self.link is None:
            refusal = self.owner.admission(self.peer_host)
            if refusal:
                log.warning("connection from %s refused: %s", self.peer_address, refusal)
                self.closed = True
                self.close_reason = refusal
                self.transport.abort()
                return
        self.owner.connections.add(self)
        hello = self.conn.start()
        if hello:
            self.transport.write(hello)

    def data_received(self, data: bytes) -> None:
        self.liveness.heard(time.monotonic())
        try:
            received = self.conn.receive_data(data)
        except RemoteProtocolError as exc:
            self._handle(exc.events)
            self.abort(f"protocol error from {self.peer_address}: {exc}")
            return
        if not _only_heartbeats(received) or self.conn.buffered_bytes:
            self.last_activity = time.time()
        out = self.conn.data_to_send()
        if out and self.transport is not None:
            self.transport.write(out)
        self._handle(received)
        if self.conn.closed and not self.closed:
            self.abort(self.close_reason or f"closed by {self.peer_address}")
        elif _carries_messages(received) and self.owner.backlog_high():
            self.owner.hold_reading(self)

    def _handle(self, received: list[events.Event]) -> None:
        engine = self.engine
        fragments: list[tuple[dialog.DialogHeader, bytes, bytes]] = []
        """Consecutive fragments, handed over together (runs of one dialog, in order)."""
        for ev in received:
            if isinstance(ev, events.Fragment):
                try:
                    header, body = dialog.decode_fragment(ev.payload)
                except RemoteProtocolError as exc:
                    if fragments:
                        engine.on_fragments(self, fragments)
                        fragments = []
                    engine.on_corrupted_message(self, f"undecodable dialog message: {exc}")
                    continue
                fragments.append((header, body, ev.payload))
                continue
            if fragments:
                engine.on_fragments(self, fragments)
                fragments = []
            if isinstance(ev, events.Ack):
                try:
                    headers = dialog.decode_acks(ev.payload)
                except RemoteProtocolError as exc:
                    engine.on_corrupted_message(self, f"undecodable acknowledgement: {exc}")
                    continue
                engine.on_acks(self, headers)
            elif isinstance(ev, events.IntegrityFailure):
                engine.on_corrupted_message(
                    self, f"frame type {ev.frame_type} counter {ev.counter}: {ev.reason}"
                )
            elif isinstance(ev, events.HandshakeComplete):
                self.opened = True
                self.login_time = time.time()
                self.liveness = Liveness(self.owner.liveness, time.monotonic())
                log.info("connection %s open (%s)", self.name, self.role.name.lower())
                engine.trace.emit(
                    "connection_opened",
                    peer=self.name,
                    direction=self.direction,
                    encrypted=bool(self.conn.encrypted),
                )
                if not self.handshake_done.done():
                    self.handshake_done.set_result(None)
                if self.link is not None:
                    self.link.opened(self)
                else:
                    self.owner.peer_connected(self.peer_host)
            elif isinstance(ev, events.Close):
                self.close_reason = f"closed by {self.name}: {ev.code.name} {ev.reason}".strip()
            elif isinstance(ev, events.PrincipalQuery):
                engine.router.on_principal_query(self, ev)
            elif isinstance(ev, events.PrincipalAnswer) and self.link is not None:
                engine.router.on_principal_answer(self.link.name, ev)
            elif isinstance(ev, events.Mirror):
                mirroring = self.owner.mirroring
                if mirroring is None:
                    self.abort(
                        f"{self.name} sent a mirroring message; no database here is mirrored"
                    )
                    return
                mirroring.on_message(self, ev.payload)
        if fragments:
            engine.on_fragments(self, fragments)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.owner.connections.discard(self)
        if not self.close_reason:
            self.close_reason = (
                f"connection to {self.peer_address} lost: {exc}"
                if exc
                else f"connection to {self.peer_address} closed"
            )
        if self.opened:
            self.engine.trace.emit(
                "connection_closed",
                peer=self.name,
                direction=self.direction,
                reason=self.close_reason,
            )
        if not self.handshake_done.done():
            if self.link is None:
                self.handshake_done.cancel()  # an accepted connection: nobody waits on it
            else:
                self.handshake_done.set_exception(ConnectionError(self.close_reason))
        if self.pinned and self.owner.mirroring is not None:
            self.owner.mirroring.connection_lost(self)
        unsent = self.outbox.forwards()
        self.outbox.clear()
        if unsent:
            self.engine.router.forward_lost(unsent)
        if self.link is not None:
            self.link.lost(self, self.close_reason)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._schedule_pump()

    # -- sending ------------------------------------------------------------------------

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        self._pump_scheduled = False
        transport = self.transport
        if transport is None or not self.is_open:
            return
        out: list[Buffer] = []
        size = transport.get_write_buffer_size()
        outbox = self.outbox
        build = self.engine.transmission.build_fragment
        conn = self.conn
        send = conn.send
        fragments: list[SizedPayload] = []
        """FRAGMENT payloads of this round not framed yet, each as its pieces: consecutive
        ones share frames (``send_fragments``: FRAGMENTS frames on a version 2
        connection), and a fragment's bytes are copied once, into its frame."""
        try:
            while outbox and not self._paused and size < HIGH_WATER:
                item = outbox.pop()
                kind = type(item)
                payload: SizedPayload | None = None
                if kind is SendFragment:
                    ep, msg, index = cast(SendFragment, item)
                    if msg.seq not in ep.outbox or index in msg.acked_fragments:
                        continue  # acknowledged meanwhile
                    if msg.body is None:
                        # A second copy queued (a retransmission due while the first
                        # waited to be written) after the first was written and its body
                        # dropped: its retry clock runs, the next copy reads the body back.
                        continue
                    payload = dialog.fragment_pieces(*build(ep, msg, index))
                elif kind is SendHeader:
                    payload = dialog.fragment_pieces(*cast(SendHeader, item))
                elif kind is Forward:
                    forward = cast(Forward, item)
                    self.engine.router.forward_sent(forward)
                    if forward.payload is not None:
                        payload = (forward.payload,), forward.size
                if payload is not None:
                    fragments.append(payload)
                    size += payload[1]
                    continue
                if fragments:  # in order: what was queued before this item goes first
                    out.extend(conn.send_fragments(fragments))
                    fragments = []
                if kind is SendAcks:
                    headers = outbox.take_acks(cast(SendAcks, item))
                    frame = send(events.Ack(dialog.encode_acks(headers)))
                elif kind is Forward:
                    frame = send(events.Ack(dialog.encode_acks(cast(Forward, item).acks or [])))
                else:
                    frame = send(
                        cast(events.PrincipalQuery | events.PrincipalAnswer | events.Mirror, item)
                    )
                out.append(frame)
                size += len(frame)
            if fragments:
                out.extend(conn.send_fragments(fragments))
        except LocalProtocolError as exc:
            log.error("cannot send on %s: %s", self.name, exc)
            self.abort(f"local protocol error: {exc}")
            return
        if out:
            self.last_activity = time.time()
            self.liveness.sent(time.monotonic())
            # Large fragments go as they are (one writev), small frames joined.
            pieces = coalesce(out)
            if len(pieces) == 1:
                transport.write(pieces[0])
            else:
                transport.writelines(pieces)
        if outbox and not self._paused:
            self._schedule_pump()

    def close(self, code: CloseCode, reason: str) -> None:
        if self.transport is None or self.closed or self.transport.is_closing():
            return
        self.close_reason = reason
        with contextlib.suppress(LocalProtocolError):
            self.transport.write(self.conn.close(code, reason))
        self.transport.close()

    def heartbeat(self) -> None:
        """Send a KEEPALIVE: nothing else went out for the heartbeat interval (R-PROTO-5)."""
        if self.transport is None or not self.is_open or self.transport.is_closing():
            return
        try:
            frame = self.conn.send(events.Keepalive())
        except LocalProtocolError:
            return
        self.liveness.sent(time.monotonic())
        self.transport.write(frame)

    def drop(self, reason: str) -> None:
        """Close at once, without waiting for unsent bytes to drain: the peer is not
        reading them (a silent connection). An outgoing link then dials again."""
        if self.transport is None or self.closed:
            return
        self.close_reason = reason
        log.warning("%s", reason)
        self.transport.abort()

    def redial(self, reason: str) -> None:
        self.drop(reason)

    def abort(self, reason: str) -> None:
        self.close_reason = reason
        log.warning("%s", reason)
        if self.transport is not None and not self.transport.is_closing():
            out = self.conn.data_to_send()
            if out:
                self.transport.write(out)
            self.transport.close()

    def evict(self, reason: str) -> None:
        """Close a connection still in its handshake at once (a reset: an unauthenticated
        peer that does not read must not keep buffers), logging at debug level only, so a
        flood of such connections does not flood the log."""
        self.close_reason = reason
        log.debug("%s: %s", self.peer_address, reason)
        if self.transport is not None:
            self.transport.abort()

    def view(self) -> dict[str, Any]:
        stats = self.conn.stats
        return {
            "peer": self.conn.peer_instance or "",
            "address": self.peer_address,
            "direction": self.direction,
            "state": "open" if self.is_open else ("closed" if self.closed else "handshake"),
            "encrypted": bool(self.conn.encrypted),
            "login_time": _iso(self.login_time),
            "last_activity": _iso(self.last_activity),
            "frames_sent": stats.frames_sent,
            "frames_received": stats.frames_received,
            "bytes_sent": stats.bytes_sent,
            "bytes_received": stats.bytes_received,
            "corrupted_messages": stats.integrity_failures,
            "retransmit_timeout": (
                self.engine.transmission.timeout_of(self.link.name)
                if self.link is not None
                else None
            ),
        }


def _carries_messages(received: list[events.Event]) -> bool:
    """Whether ``received`` holds dialog traffic, what a held connection waits to send.
    A connection that carries none (a handshake, heartbeats, a mirror's attach and
    confirmations) is never held: a principal whose commits wait for its mirror
    (``mirror_when_lost = "stall"``) must still read the mirror that comes back, or the
    commits that fill its backlog wait for ever (R-ROUTE-16)."""
    return any(type(ev) is events.Fragment for ev in received)


def _only_heartbeats(received: list[events.Event]) -> bool:
    return bool(received) and all(type(ev) is events.Keepalive for ev in received)


def _iso(t: float | None) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds") if t else ""


class PeerLink:
    """The outgoing connection to one peer address, shared by all dialogs routed there."""

    def __init__(self, owner: Transport, address: str) -> None:
        self.owner = owner
        self.name = address
        self.host, self.port = parse_tcp_address(address)
        self.protocol: BrokerProtocol | None = None
        self.waiting: set[Endpoint] = set()
        self.pending: list[
            Forward | events.PrincipalQuery | events.PrincipalAnswer | events.Mirror
        ] = []
        """Forwarded messages and principal queries held until the connection opens."""
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

    def queue_fragment(self, ep: Endpoint, msg: OutMessage, index: int) -> None:
        self.users.add(ep)
        if self.protocol is not None and self.protocol.is_open:
            self.protocol.queue_fragment(ep, msg, index)
        else:
            self.want(ep)

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
            self.connect()

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
                    return
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
                if await self._wait_before_dialling(delay):
                    delay = endpoint.reconnect_initial
                else:
                    delay = min(endpoint.reconnect_max, delay * 2)
        finally:
            self._task = None

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
        except BaseException:
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
        if forwards:
            self.owner.engine.router.forward_lost(forwards)

    def opened(self, protocol: BrokerProtocol) -> None:
        self.attempts = 0
        self._status = f"connected to {protocol.name}"
        pending, self.pending = self.pending, []
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
        self.links: dict[str, PeerLink] = {}
        self.connections: set[BrokerProtocol] = set()
        self.server: asyncio.Server | None = None
        self.stopping = False
        self._watch_task: asyncio.Task[None] | None = None
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
        """Connections closed in their handshake to admit newer ones (``admission``)."""

    def link_for(self, address: str) -> PeerLink:
        link = self.links.get(address)
        if link is None:
            link = self.links[address] = PeerLink(self, address)
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
        if self.server is not None:
            self.server.close()
        for protocol in list(self.connections):
            protocol.close(CloseCode.SHUTDOWN, "broker shutting down")
        for link in self.links.values():
            if link._task is not None:
                link._task.cancel()
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
        return (
            self.engine.inbound_backlog() > self.inbound_high_water
            or self.engine.router.budget.high
        )

    def _backlog_low(self) -> bool:
        """Whether held connections may be read again: both down to a quarter."""
        return (
            self.engine.inbound_backlog() <= self.inbound_low_water
            and self.engine.router.budget.low
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
        """A broker at ``host`` completed a handshake with us: it is up, so links to it that
        wait before dialling again dial now (a returning peer is reached at once, whatever
        the reconnect back-off has grown to)."""
        for link in self.links.values():
            if link.host == host and not link.is_open:
                link.peer_is_back()

    def broker_connections(self) -> list[dict[str, Any]]:
        return [p.view() for p in sorted(self.connections, key=lambda p: p.peer_address)]
