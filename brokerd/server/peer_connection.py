"""One TCP connection between two brokers on port 4022, either direction (R-PROTO-1..3).

:class:`BrokerProtocol` runs one ``protocol.BrokerConnection`` over an asyncio
transport (uvloop when installed). It hands dialog fragments and ACKs to the engine
(it is the engine's ``Link`` for acknowledgements and errors) and pumps outgoing
frames with backpressure: single-fragment messages and acknowledgements go first and
one fragment of a large message after each round, so small messages are not held up
behind a large one (R-DLG-7). It closes itself on request (idle, shutdown), drops a
silent connection, sends heartbeats, and gives its row of the ``broker_connections``
view.

What it uses of the transport that made it and of the outgoing link it serves is
named here (:class:`ConnectionOwner`, :class:`ConnectionLink`); ``transport.Transport``
and ``peer_link.PeerLink`` provide them.

May import: ``protocol``, ``brokerd.routing``, ``brokerd.dialogs``
(the link items, the peer's identity; the engine for its type only),
``brokerd.server.outbox``. Never ``brokerd.server.transport`` or
``brokerd.server.peer_link``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, cast

from brokerd.dialogs.endpoints.binding import peer_identity
from brokerd.dialogs.transmission.links import SendAcks, SendFragment, SendHeader
from brokerd.routing.forwarding import Forward
from brokerd.server.outbox import MirrorAnswer, Outbox
from protocol import dialog, events
from protocol.buffers import Buffer, coalesce
from protocol.connection import BrokerConnection, ConnectionSettings, Role
from protocol.errors import CloseCode, LocalProtocolError, RemoteProtocolError
from protocol.frames import SizedPayload
from protocol.liveness import Liveness, LivenessSettings

if TYPE_CHECKING:
    from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage
    from brokerd.dialogs.engine import DialogEngine

log = logging.getLogger("brokerd.server.transport")  # one log for every part of the transport


class MirroringHandler(Protocol):
    """What the transport hands to the mirroring service (``brokerd.server.mirroring``)."""

    def on_message(self, protocol: BrokerProtocol, payload: bytes) -> None: ...

    def connection_lost(self, protocol: BrokerProtocol) -> None: ...


class ConnectionOwner(Protocol):
    """What a connection uses of the transport that made it (``transport.Transport``)."""

    @property
    def engine(self) -> DialogEngine: ...

    @property
    def settings(self) -> ConnectionSettings: ...

    @property
    def liveness(self) -> LivenessSettings: ...

    @property
    def mirroring(self) -> MirroringHandler | None: ...

    @property
    def connections(self) -> set[BrokerProtocol]: ...

    def admission(self, host: str) -> str | None: ...

    def refused(self, address: str, reason: str) -> None: ...

    def backlog_high(self) -> bool: ...

    def hold_reading(self, protocol: BrokerProtocol) -> None: ...

    def peer_connected(self, host: str) -> None: ...


class ConnectionLink(Protocol):
    """What an outgoing connection uses of the link it serves (``peer_link.PeerLink``)."""

    @property
    def name(self) -> str: ...

    def want(self, ep: Endpoint) -> None: ...

    def opened(self, protocol: BrokerProtocol) -> None: ...

    def lost(self, protocol: BrokerProtocol, reason: str) -> None: ...

    def idle(self) -> bool: ...


HIGH_WATER = 512 * 1024
"""Stop feeding the socket while this much is already buffered for it."""


READ_SIZE = 1024 * 1024
"""Bytes one read from an open connection may take. A large message's frames then
arrive several to a read, and their MD5 signatures are checked together
(``protocol.digests``: up to 16 at once); uvloop's own reads are 256 KiB."""
HANDSHAKE_READ_SIZE = 64 * 1024
"""Bytes one read may take before the handshake completes (its frames are small)."""


class BrokerProtocol(asyncio.BufferedProtocol):
    """One TCP connection between two brokers, either direction.

    Reads go into a buffer of the connection's own (``get_buffer``), copied once into
    the bytes the sans-I/O connection parses, as the event loop's reads are."""

    def __init__(
        self, transport_owner: ConnectionOwner, role: Role, link: ConnectionLink | None
    ) -> None:
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
        self._read_buffer: memoryview | None = None
        self._drained: list[asyncio.Future[None]] = []
        """Told once the outbox is written out, or the connection closed (:meth:`drained`)."""

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

    def queue_fragment(self, ep: Endpoint, msg: OutMessage, index: int) -> bool:
        if not self.outbox.add(SendFragment(ep, msg, index)):
            return False
        self._schedule_pump()
        return True

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

    def may_hold(self, size: int, limit: int) -> bool:
        return True  # an open connection: the budget alone bounds what waits on it

    def send_control(
        self,
        event: events.PrincipalQuery | events.PrincipalAnswer | events.Mirror | MirrorAnswer,
    ) -> None:
        self.outbox.add(event)
        self._schedule_pump()

    async def drained(self) -> None:
        """Until everything queued on the connection has gone to the socket (whose own
        buffer holds at most about :data:`HIGH_WATER` more) or the connection is closed:
        a sender of much, a copy of a file for a mirror, queues it a part at a time."""
        if self.closed or not self.outbox:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drained.append(waiter)
        await waiter

    def _tell_drained(self) -> None:
        waiters, self._drained = self._drained, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

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
                self.owner.refused(self.peer_address, refusal)
                self.closed = True
                self.close_reason = refusal
                self.transport.abort()
                return
        self.owner.connections.add(self)
        hello = self.conn.start()
        if hello:
            self.transport.write(hello)

    def get_buffer(self, sizehint: int) -> memoryview:
        buffer = self._read_buffer
        if buffer is None or (self.opened and len(buffer) < READ_SIZE):
            size = READ_SIZE if self.opened else HANDSHAKE_READ_SIZE
            buffer = self._read_buffer = memoryview(bytearray(size))
        return buffer

    def buffer_updated(self, nbytes: int) -> None:
        assert self._read_buffer is not None
        self.data_received(bytes(self._read_buffer[:nbytes]))

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
        self._tell_drained()
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
                elif kind is MirrorAnswer:
                    frame = send(events.Mirror(cast(MirrorAnswer, item).payload))
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
        elif not outbox and self._drained:
            self._tell_drained()

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
            "fragments_sent": stats.fragments_sent,
            "fragments_received": stats.fragments_received,
            "corrupted_messages": stats.integrity_failures,
            "acknowledgements_waiting": self.outbox.queued_acks,
            "broker_errors_dropped": self.outbox.errors_dropped,
            "answers_dropped": self.outbox.answers_dropped,
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
