"""A fault-injecting TCP proxy between two brokers (there is no kernel netem here).

This module owns :class:`FaultProxy`, :class:`FaultPlan` and :class:`ProxyStats`,
:class:`TerminatingRelay` (a relay that ends both connections with its own
certificate, as a forwarder, and alters dialog bodies, acknowledgements and errors
per :class:`RelayPlan`: a compromised forwarder, R-DLG-14), and the little
command line ``python -m brokerd.tools.faultproxy``. The proxy sits
between an initiating broker (the client, "up" direction: client to server) and
an accepting broker (the server, "down" direction) and does, per :class:`FaultPlan`:

* corrupt or drop chosen FRAGMENT (or FRAGMENTS, as a whole) frames of the up
  direction, counted 1, 2, 3, ... over the proxy's lifetime across all its
  connections, and drop chosen ACK frames of the down direction, counted the same
  way (a lost acknowledgement: the sender retransmits and the receiver sees a
  duplicate). Both directions are cut into
  frames with :func:`protocol.frames.decode_header`; if a header does not parse,
  the rest of that direction is passed through unchanged;
* delay every chunk forwarded, both directions;
* stall the up direction: stop reading from the client while the connection
  stays open, so the sending broker's socket buffers fill as with a peer that
  hangs without reading (and resume reading when the plan says so); a chunk read
  or delayed when the stall begins waits for its end too;
* refuse new connections (accept, then close at once) or blackhole connections
  (read and discard everything: the peer seems hung). Nothing crosses a blackhole,
  neither bytes nor a peer's close or reset: the other peer finds the silence by its
  own heartbeats (R-PROTO-5);
* :meth:`FaultProxy.cut` every open connection at once (TCP reset on both sides).

The plan is read again for every chunk and frame, so tests may change it while the
proxy runs. Everything runs on the event loop (asyncio streams, no threads).

    python -m brokerd.tools.faultproxy --listen 127.0.0.3:4022 --target 127.0.0.2:4022 \\
        [--corrupt 3,7] [--drop 5] [--drop-ack 2] [--delay 0.1] [--refuse] [--blackhole]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType

from protocol import dialog, events
from protocol.connection import BrokerConnection, ConnectionSettings, Role
from protocol.connection import State as ConnectionState
from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.frames import HEADER_SIZE, FrameType, decode_header
from protocol.security import Identity

MAX_FRAME_SIZE = 64 * 1024 * 1024
"""Largest frame body the proxy parses; a bigger announced length counts as unparseable."""
READ_SIZE = 64 * 1024

_LINGER_RESET = struct.pack("ii", 1, 0)
"""SO_LINGER on, timeout 0: closing the socket sends a TCP reset."""


_FRAGMENT_FRAMES = (FrameType.FRAGMENT, FrameType.FRAGMENTS)
"""Frames the plan's fragment ordinals count: a FRAGMENTS frame is one, whatever it carries
(brokers with ``fragments_per_frame = 1`` send one fragment per frame)."""


@dataclass
class FaultPlan:
    """What to break. Mutable while the proxy runs; it is read for every chunk and frame."""

    corrupt_fragments: set[int] = field(default_factory=set)
    """Ordinals (1-based, up direction, proxy lifetime) of FRAGMENT frames whose body gets
    the middle byte flipped (XOR 0xFF). An empty body cannot be corrupted (logged)."""
    drop_fragments: set[int] = field(default_factory=set)
    """Ordinals of FRAGMENT frames removed from the stream entirely (the receiver then
    sees a counter gap). Dropping wins over corrupting."""
    drop_acks: set[int] = field(default_factory=set)
    """Ordinals (1-based, down direction, proxy lifetime) of dedicated ACK frames removed
    from the stream: the acknowledgement is lost, so the sender retransmits."""
    delay: float = 0.0
    """Seconds slept before forwarding each chunk, both directions. While it sleeps the
    proxy does not read that direction, so it also bounds the throughput."""
    stall: bool = False
    """Stop reading the up direction (client to server) until this is false again; a chunk
    already read or being delayed is held back until then too."""
    refuse: bool = False
    """Accept new connections, then close them at once (the target is never dialled)."""
    blackhole: bool = False
    """New connections are accepted and everything they send is read and discarded (the
    target is never dialled). Live connections go silent in both directions too, and
    stay silent even if the flag is cleared again (their byte streams are broken): a chunk
    being delayed is discarded, and a peer's close (FIN) or reset is not passed on to the
    other peer; the proxy closes them once both peers have, or at :meth:`FaultProxy.cut`
    and :meth:`FaultProxy.stop`."""


@dataclass
class ProxyStats:
    connections: int = 0
    """Connections accepted (refused and blackholed ones included)."""
    fragments_seen: int = 0
    """FRAGMENT frames parsed in the up direction (dropped ones included)."""
    fragments_corrupted: int = 0
    fragments_dropped: int = 0
    acks_seen: int = 0
    """ACK frames parsed in the down direction (dropped ones included)."""
    acks_dropped: int = 0
    bytes_up: int = 0
    """Bytes written to the server (after drops; discarded bytes not counted)."""
    bytes_down: int = 0
    """Bytes written to the client."""


class _Connection:
    """One accepted client connection and, once dialled, its server connection."""

    def __init__(self, ident: int, client: asyncio.StreamWriter) -> None:
        self.ident = ident
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.aborted = False
        self.blackholed = False

    def abort(self) -> None:
        """Close both sockets with a TCP reset (idempotent)."""
        self.aborted = True
        for writer in (self.client, self.server):
            if writer is not None:
                _reset(writer)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    writer.transport.abort()


class _FrameFilter:
    """Sans-I/O frame cutter of one direction: bytes in, bytes to forward out.

    Buffers until a whole frame is there, then applies the plan's faults: FRAGMENT
    faults going up, ACK drops going down. After a header fails to parse it passes
    everything through unchanged.
    """

    def __init__(self, proxy: FaultProxy, ident: int, *, up: bool) -> None:
        self._proxy = proxy
        self._ident = ident
        self._up = up
        self._buffer = bytearray()
        self.raw = False

    def feed(self, data: bytes) -> bytes:
        if self.raw:
            return data
        buf = self._buffer
        buf += data
        out = bytearray()
        pos = 0
        while len(buf) - pos >= HEADER_SIZE:
            try:
                header = decode_header(bytes(buf[pos : pos + HEADER_SIZE]), MAX_FRAME_SIZE)
            except RemoteProtocolError as exc:
                self._proxy._event(
                    f"connection {self._ident}: unparseable frame header ({exc}); "
                    "passing the rest through unchanged"
                )
                self.raw = True
                out += buf[pos:]
                buf.clear()
                return bytes(out)
            end = pos + HEADER_SIZE + header.length
            if end > len(buf):
                break
            frame = buf[pos:end]
            pos = end
            if self._keep(frame, header.frame_type, header.counter, header.length):
                out += frame
        del buf[:pos]
        return bytes(out)

    def flush(self) -> bytes:
        """The incomplete frame left at end of stream (forwarded unchanged)."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest

    def _keep(self, frame: bytearray, kind: int, counter: int, length: int) -> bool:
        """Apply the plan to one frame (in place); False means drop it."""
        if self._up and kind in _FRAGMENT_FRAMES:
            return self._fragment(frame, counter, length)
        if not self._up and kind == FrameType.ACK:
            return self._ack(counter)
        return True

    def _fragment(self, frame: bytearray, counter: int, length: int) -> bool:
        """Apply the plan to one FRAGMENT or FRAGMENTS frame in place (a FRAGMENTS frame,
        several fragments under one seal, is dropped or corrupted as a whole); False means
        drop it."""
        proxy = self._proxy
        proxy.stats.fragments_seen += 1
        ordinal = proxy.stats.fragments_seen
        prefix = f"connection {self._ident}: "
        what = f"FRAGMENT #{ordinal} (counter {counter})"
        if ordinal in proxy.plan.drop_fragments:
            proxy.stats.fragments_dropped += 1
            proxy._event(f"{prefix}dropped {what}")
            return False
        if ordinal in proxy.plan.corrupt_fragments:
            if length == 0:
                proxy._event(f"{prefix}{what} has an empty body, forwarded unchanged")
                return True
            at = length // 2
            frame[HEADER_SIZE + at] ^= 0xFF
            proxy.stats.fragments_corrupted += 1
            proxy._event(f"{prefix}corrupted {what} at body byte {at}")
        return True

    def _ack(self, counter: int) -> bool:
        """Apply the plan to one ACK frame; False means drop it."""
        proxy = self._proxy
        proxy.stats.acks_seen += 1
        ordinal = proxy.stats.acks_seen
        if ordinal in proxy.plan.drop_acks:
            proxy.stats.acks_dropped += 1
            proxy._event(f"connection {self._ident}: dropped ACK #{ordinal} (counter {counter})")
            return False
        return True


class FaultProxy:
    """An asyncio TCP proxy that injects the faults of its :class:`FaultPlan`.

    ``on_event`` (optional) is called with every line appended to :attr:`events`.
    """

    def __init__(
        self,
        listen_host: str,
        listen_port: int,
        target_host: str,
        target_port: int,
        plan: FaultPlan | None = None,
        *,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.target_host = target_host
        self.target_port = target_port
        self.plan = plan if plan is not None else FaultPlan()
        self.stats = ProxyStats()
        self.events: list[str] = []
        self._on_event = on_event
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("fault proxy already started")
        self._server = await asyncio.start_server(self._handle, self.listen_host, self.listen_port)

    async def stop(self) -> None:
        """Stop listening and reset every open connection. Idempotent."""
        if self._server is None or self._stopped:
            return
        self._stopped = True
        self._server.close()
        for conn in list(self._connections):
            conn.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        """The bound port (useful when ``listen_port`` was 0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("fault proxy is not listening")
        return int(self._server.sockets[0].getsockname()[1])

    def cut(self) -> None:
        """Abort every open proxied connection at once: both sides see a TCP reset."""
        conns = list(self._connections)
        for conn in conns:
            conn.abort()
        self._event(f"cut {len(conns)} connection(s)")

    # -- connections -------------------------------------------------------------

    def _event(self, text: str) -> None:
        self.events.append(text)
        if self._on_event is not None:
            self._on_event(text)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.stats.connections += 1
        conn = _Connection(self.stats.connections, writer)
        self._connections.add(conn)
        try:
            await self._serve(conn, reader)
        except asyncio.CancelledError:
            pass  # stop(): the sockets are already reset
        except Exception as exc:  # a proxy bug must not kill the event loop's other tasks
            self._event(f"connection {conn.ident}: internal error {exc!r}")
        finally:
            if not conn.aborted:
                _close(conn)
            self._connections.discard(conn)
            self._tasks.discard(task)

    async def _serve(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        peer = _endpoint(conn.client.get_extra_info("peername"))
        if self.plan.refuse:
            self._event(f"connection {conn.ident} from {peer}: refused")
            return
        if self.plan.blackhole:
            conn.blackholed = True
            self._event(f"connection {conn.ident} from {peer}: blackholed")
            await _discard(reader)
            return
        try:
            server_reader, conn.server = await asyncio.open_connection(
                self.target_host, self.target_port
            )
        except OSError as exc:
            self._event(f"connection {conn.ident} from {peer}: target unreachable ({exc})")
            conn.abort()
            return
        if conn.aborted:  # cut() while dialling
            conn.abort()
            return
        self._event(
            f"connection {conn.ident} from {peer}: open to {self.target_host}:{self.target_port}"
        )
        await asyncio.gather(
            self._pump(conn, reader, conn.server, up=True),
            self._pump(conn, server_reader, conn.client, up=False),
        )
        self._event(f"connection {conn.ident}: {'reset' if conn.aborted else 'closed'}")

    async def _pump(
        self,
        conn: _Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        up: bool,
    ) -> None:
        """Forward one direction until EOF; an error resets the whole connection. Once the
        connection is blackholed, neither its EOF nor its error crosses to the other peer
        (R-PROTO-5: that peer must find the silence by its own heartbeats)."""
        frames = _FrameFilter(self, conn.ident, up=up)
        direction = "client->server" if up else "server->client"
        try:
            while True:
                await self._unstalled(conn, up)
                data = await reader.read(READ_SIZE)
                if not data:
                    break
                if self._swallowed(conn):
                    continue
                data = frames.feed(data)
                await self._forward(conn, writer, data, up)
            if conn.aborted:
                return
            if self._swallowed(conn):
                self._event(f"connection {conn.ident}: {direction} ended inside the blackhole")
                return
            rest = frames.flush()
            if rest:
                self._event(
                    f"connection {conn.ident}: {'client' if up else 'server'} closed "
                    "inside a frame, "
                    f"{len(rest)} trailing bytes forwarded unchanged"
                )
                await self._forward(conn, writer, rest, up)
            if not (conn.aborted or conn.blackholed) and writer.can_write_eof():
                writer.write_eof()
        except OSError as exc:
            if conn.aborted:
                return
            if self._swallowed(conn):
                self._event(f"connection {conn.ident}: {direction} failed inside the blackhole")
                return
            self._event(f"connection {conn.ident}: {direction} failed ({exc}), resetting")
            conn.abort()

    async def _unstalled(self, conn: _Connection, up: bool) -> None:
        """Return once the plan does not stall this direction (only the up one stalls)."""
        while up and self.plan.stall and not conn.aborted:
            await asyncio.sleep(0.02)

    def _swallowed(self, conn: _Connection) -> bool:
        """Whether ``conn`` is blackholed, marking it so when the plan says (for good)."""
        if not conn.blackholed and self.plan.blackhole:
            conn.blackholed = True
            self._event(f"connection {conn.ident}: blackholed")
        return conn.blackholed

    async def _forward(
        self, conn: _Connection, writer: asyncio.StreamWriter, data: bytes, up: bool
    ) -> None:
        """Write ``data`` after the plan's delay, unless the connection was blackholed
        meanwhile; a stall set meanwhile holds it (the chunk in hand waits with the rest)."""
        if not data:
            return
        delay = self.plan.delay
        if delay > 0:
            await asyncio.sleep(delay)
        await self._unstalled(conn, up)
        if conn.aborted or self._swallowed(conn):
            return
        writer.write(data)
        await writer.drain()
        if up:
            self.stats.bytes_up += len(data)
        else:
            self.stats.bytes_down += len(data)


@dataclass
class RelayPlan:
    """What a :class:`TerminatingRelay` alters in the dialog layer (ordinals 1-based over the
    relay's lifetime, like :class:`FaultPlan`'s). Read for every frame."""

    alter_fragments: set[int] = field(default_factory=set)
    """FRAGMENT frames (client to server) whose dialog body gets its middle byte flipped;
    one with an empty body gets its piggybacked acknowledgement raised instead."""
    alter_errors: set[int] = field(default_factory=set)
    """FRAGMENT frames carrying an Error (client to server, counted among those only) whose
    body gets its middle byte flipped."""
    alter_acks: set[int] = field(default_factory=set)
    """ACK frames (server to client) whose every acknowledgement is raised by 1,000: a
    forged acknowledgement that would delete unsent messages at the sender."""


@dataclass
class RelayStats:
    connections: int = 0
    fragments_relayed: int = 0
    acks_relayed: int = 0
    altered: int = 0


class TerminatingRelay:
    """A relay that ends both connections, as a forwarder does (R-ROUTE-7), and can alter
    what it relays (:class:`RelayPlan`): a compromised forwarder.

    Unlike :class:`FaultProxy`, which sees only frames protected by the two brokers'
    session keys, it completes the adjacent-broker handshake on each side with its own
    certificate from the deployment ``identity``, so it reads and rewrites dialog
    headers and bodies in clear, increments their hop count like a forwarder, and
    re-seals them for the next hop. What it alters is caught only end to end, by
    dialog security (R-DLG-14).
    """

    def __init__(
        self,
        listen_host: str,
        listen_port: int,
        target_host: str,
        target_port: int,
        identity: Identity,
        plan: RelayPlan | None = None,
    ) -> None:
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.target_host = target_host
        self.target_port = target_port
        self.identity = identity
        self.plan = plan if plan is not None else RelayPlan()
        self.stats = RelayStats()
        self.events: list[str] = []
        self.bodies: list[bytes] = []
        """Every dialog body the relay saw in the clear (what a forwarder could read)."""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._fragments = 0
        self._errors = 0
        self._acks = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.listen_host, self.listen_port)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._writers):
            _reset(writer)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.stats.connections += 1
        server_writer: asyncio.StreamWriter | None = None
        try:
            settings = ConnectionSettings(self.identity)
            now = datetime.now(UTC)
            client = BrokerConnection(Role.ACCEPTOR, settings, now)
            server = BrokerConnection(Role.INITIATOR, settings, now)
            server_reader, server_writer = await asyncio.open_connection(
                self.target_host, self.target_port
            )
            self._writers.add(server_writer)
            server_writer.write(server.start())
            await asyncio.gather(
                self._pump(reader, client, writer, server, server_writer, up=True),
                self._pump(server_reader, server, server_writer, client, writer, up=False),
            )
        except (OSError, RemoteProtocolError, LocalProtocolError) as exc:
            self.events.append(f"relay connection ended: {exc!r}")
        except asyncio.CancelledError:
            pass
        finally:
            for w in (writer, server_writer):
                if w is not None:
                    self._writers.discard(w)
                    w.close()
            self._tasks.discard(task)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        source: BrokerConnection,
        source_writer: asyncio.StreamWriter,
        sink: BrokerConnection,
        sink_writer: asyncio.StreamWriter,
        *,
        up: bool,
    ) -> None:
        while True:
            data = await reader.read(READ_SIZE)
            if not data:
                sink_writer.close()
                return
            received = source.receive_data(data)
            reply = source.data_to_send()
            if reply:
                source_writer.write(reply)
            for ev in received:
                out = self._relayed(ev, up)
                if out is None:
                    continue
                while sink.state is not ConnectionState.OPEN:  # the other side's handshake
                    if sink.closed:
                        return
                    await asyncio.sleep(0.01)
                sink_writer.write(sink.send(out))
            await sink_writer.drain()

    def _relayed(
        self, ev: events.Event, up: bool
    ) -> events.Fragment | events.Ack | events.Keepalive | None:
        if isinstance(ev, events.Fragment):
            header, body = dialog.decode_fragment(ev.payload)
            self.stats.fragments_relayed += 1
            self.bodies.append(body)
            header, body = self._alter_fragment(header, body) if up else (header, body)
            header = header._replace(hop_count=header.hop_count + 1)
            return events.Fragment(dialog.encode_fragment(header, body))
        if isinstance(ev, events.Ack):
            headers = dialog.decode_acks(ev.payload)
            self.stats.acks_relayed += 1
            if not up:
                self._acks += 1
                if self._acks in self.plan.alter_acks:
                    self.stats.altered += 1
                    self.events.append(f"altered ACK frame {self._acks}")
                    headers = [_raised(h) for h in headers]
            bumped = [h._replace(hop_count=h.hop_count + 1) for h in headers]
            return events.Ack(dialog.encode_acks(bumped))
        if isinstance(ev, events.Keepalive):
            return ev
        return None

    def _alter_fragment(
        self, header: dialog.DialogHeader, body: bytes
    ) -> tuple[dialog.DialogHeader, bytes]:
        self._fragments += 1
        alter = self._fragments in self.plan.alter_fragments
        if header.flags & dialog.FLAG_ERROR:
            self._errors += 1
            alter = alter or self._errors in self.plan.alter_errors
        if not alter:
            return header, body
        self.stats.altered += 1
        self.events.append(f"altered FRAGMENT frame {self._fragments}")
        if not body:
            return _raised(header), body
        middle = len(body) // 2
        return header, body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1 :]


def _raised(h: dialog.DialogHeader) -> dialog.DialogHeader:
    """``h`` acknowledging 1,000 messages more than it does."""
    return h._replace(ack=dialog.Acknowledgement(h.ack.through + 1000))


def _close(conn: _Connection) -> None:
    for writer in (conn.client, conn.server):
        if writer is not None:
            writer.close()


async def _discard(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(OSError):
        while await reader.read(READ_SIZE):
            pass


def _endpoint(address: object) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(address)


# -- command line ----------------------------------------------------------------


def parse_endpoint(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6-host]:port`` into (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _ordinals(text: str) -> set[int]:
    try:
        values = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N[,N...], got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("frame ordinals start at 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m brokerd.tools.faultproxy",
        description="Fault-injecting TCP proxy between two brokers; runs until Ctrl-C.",
    )
    parser.add_argument("--listen", type=parse_endpoint, required=True, metavar="HOST:PORT")
    parser.add_argument("--target", type=parse_endpoint, required=True, metavar="HOST:PORT")
    parser.add_argument(
        "--corrupt",
        type=_ordinals,
        default=set(),
        metavar="N,...",
        help="corrupt these FRAGMENT frames (1-based, client to server)",
    )
    parser.add_argument(
        "--drop",
        type=_ordinals,
        default=set(),
        metavar="N,...",
        help="drop these FRAGMENT frames (1-based, client to server)",
    )
    parser.add_argument(
        "--drop-ack",
        type=_ordinals,
        default=set(),
        metavar="N,...",
        help="drop these ACK frames (1-based, server to client)",
    )
    parser.add_argument("--delay", type=float, default=0.0, help="seconds added to each chunk")
    parser.add_argument("--refuse", action="store_true", help="close new connections at once")
    parser.add_argument("--blackhole", action="store_true", help="swallow everything")
    return parser


async def _run(args: argparse.Namespace) -> None:
    plan = FaultPlan(
        corrupt_fragments=args.corrupt,
        drop_fragments=args.drop,
        drop_acks=args.drop_ack,
        delay=args.delay,
        refuse=args.refuse,
        blackhole=args.blackhole,
    )
    (listen_host, listen_port), (target_host, target_port) = args.listen, args.target
    proxy = FaultProxy(
        listen_host,
        listen_port,
        target_host,
        target_port,
        plan,
        on_event=lambda text: print(text, flush=True),
    )
    async with proxy:
        print(
            f"fault proxy {listen_host}:{proxy.port} -> {target_host}:{target_port} "
            f"(Ctrl-C to stop)",
            flush=True,
        )
        await asyncio.Event().wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        asyncio.run(_run(args))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"faultproxy: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
