"""The client listener: applications reach the dialog engine through it (SPEC §6).

Binds to loopback by default, speaks TLS when ``[client] tls_certificate`` is set
(``brokerd.server.client_tls``; required off loopback) and requires credentials:
on connect it sends a CHALLENGE nonce, and the first request must be ``login``
with an HMAC proof of the token its user name selects (``protocol.client_wire``,
``brokerd.server.client_access``). Anything else before a good login gets an
``AuthenticationFailed`` error and the connection is closed; before the login,
frame bodies over 4 KiB are refused from the header alone. After it, an
application token's requests are checked against its services and queues, and
admin operations are refused it (``PermissionDenied``).

Owns a connection (:class:`ClientSession`): its login, reading its frames, the
replies and their writes, flow control (reading held while too many request bytes
await replies, or while the link its SENDs go to is congested), and the fast paths
that run without a task: pipelined SENDs outside a transaction, handed to the engine
a run per conversation, and a RECEIVE whose messages are ready now. Every other
request runs the handler of its op (``brokerd.server.client_requests``, which lists
the operations) as its own task, so a RECEIVE waiting for messages does not hold up
the client's other calls. A closed connection rolls back its open transactions. A
refusal is an ERROR frame with the error's class name and code (``protocol.errors``,
docs/errors.md).

May import: ``protocol``, ``brokerd.errors``, ``brokerd.dialogs``,
``brokerd.server.client_requests``, ``brokerd.server.client_meta``,
``brokerd.server.client_in_flight``, ``brokerd.server.client_errors``,
``brokerd.server.client_access``, ``brokerd.server.receive_reply``; ``brokerd.config``
for its types only.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, cast

from brokerd.dialogs.verbs.receive import Withdrawal
from brokerd.dialogs.verbs.transactions import Transaction
from brokerd.server.client_access import Access, Credentials
from brokerd.server.client_errors import error_meta
from brokerd.server.client_in_flight import InFlight
from brokerd.server.client_meta import meta_key, meta_str, meta_uuid
from brokerd.server.client_requests import FEATURES, OPERATIONS, ReplyBody, ReplyMeta, receive_args
from brokerd.server.client_requests import Broker as RequestsBroker
from brokerd.server.receive_reply import ReceiveReply
from protocol.buffers import Body, Buffer, coalesce
from protocol.client_wire import (
    MAX_META_BYTES,
    ClientFrame,
    ClientFrameKind,
    ClientFrameReader,
    check_proof,
    encode_frame,
    encode_frame_parts,
    encode_response_parts,
    encode_sequence_reply,
    new_nonce,
    read_buffer_in,
)
from protocol.errors import (
    AuthenticationFailed,
    BrokerError,
    BrokerStopping,
    InternalError,
    InvalidRequest,
    LocalProtocolError,
    RemoteProtocolError,
)

if TYPE_CHECKING:
    from brokerd.config import BrokerConfig
    from brokerd.dialogs.endpoints.database import Database
    from brokerd.dialogs.endpoints.endpoint import Endpoint


class Broker(RequestsBroker, Protocol):
    """What the listener needs of the daemon (``brokerd.server.daemon.Broker``): what its
    requests need, and the configuration and the set of client sessions."""

    config: BrokerConfig
    client_sessions: set[ClientSession]


log = logging.getLogger("brokerd.server.client_listener")

CONGESTION_POLL = 0.005
"""Seconds between looks at a congested link while an application's SENDs wait for it."""
CONGESTION_HOLD_MOST = 1.0
"""Seconds an application's requests wait for a congested link, at most at a time."""

ANSWERED_KEPT = 64
"""Answered RECEIVEs a connection remembers for a withdraw that comes after the answer."""

WRITE_HIGH = 4 * 1024 * 1024
"""Reply bytes a connection may have waiting to leave (written and not yet taken by the
kernel, or queued for this turn's write) before it holds: past it, the client's requests
are not read, and those read wait before they run, until its replies drain. A client that
pipelines requests and never reads their replies holds this much of the daemon, not a
page of a view per request."""

CLOSE_GRACE = 5.0
"""Seconds a connection the daemon closes has for its last replies to leave: a client
that does not read them is then cut off (what it left unread is dropped), so that a
closed connection, logged in or not, holds nothing of the daemon for longer."""

MAX_PENDING_LOGINS = 128
"""Connections not yet logged in, at most: a newer one closes the oldest of them (as port
4022 does with connections in their handshake, ``endpoint.max_pending_handshakes``), so
that a flood of connections that never log in churns among itself, never holding every
file descriptor of the daemon, while an application's login, done in milliseconds, goes
through."""

PRE_LOGIN_MAX_BODY = 4096
PRE_LOGIN_MAX_META = 4096
"""Until the login succeeds a peer may send only small frames (a login is about 200 bytes)."""


_THREAD = threading.local()
"""Where this thread's connections keep their read buffer (:func:`read_buffer_in`)."""


class ClientSession(asyncio.BufferedProtocol):
    """One application connection: its login, its requests and its open transactions.

    Reads go where the frame reader says: a large SEND body straight into its own
    buffer (``ClientFrameReader.get_buffer``)."""

    def __init__(self, broker: Broker, credentials: Credentials) -> None:
        self.broker = broker
        self.credentials = credentials
        # Until the login succeeds a peer may send only small frames.
        self.reader = ClientFrameReader(max_body=PRE_LOGIN_MAX_BODY, max_meta=PRE_LOGIN_MAX_META)
        self.nonce = new_nonce(os.urandom)
        self.access: Access | None = None
        self.transport: asyncio.Transport | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.transactions: dict[int, Transaction] = {}
        self.tx_ids = itertools.count(1)
        self._login_deadline: asyncio.TimerHandle | None = None
        self._in_flight = InFlight(broker.config.limits.client_pending_mb * 1024 * 1024)
        """Requests read (after the login) and not yet answered, and their body bytes."""
        self._reading_held = False
        """Not reading: the requests awaiting replies hold too many body bytes."""
        self._congested: Endpoint | None = None
        """Not reading: the link this application's last SENDs go to is congested."""
        self._congested_since = 0.0
        self._paused = False
        self._out: list[Buffer] | None = None
        """Replies not yet written: one write per turn of the event loop, not per reply."""
        self._out_bytes = 0
        """Bytes of :attr:`_out`."""
        self._write_paused = False
        """The transport's buffer of replies is past :data:`WRITE_HIGH`: reading held."""
        self._writable = asyncio.Event()
        """Set while replies may be made: requests read wait for it before they run."""
        self._writable.set()
        self._waits: dict[int, Withdrawal] = {}
        """RECEIVEs and GET CONVERSATION GROUPs running as tasks, by request id: what a
        ``withdraw`` request takes back (:meth:`_withdraw`)."""
        self._answered: OrderedDict[int, Withdrawal] = OrderedDict()
        """The latest of them (:data:`ANSWERED_KEPT`) that took something and answered:
        a withdraw that comes after the answer still marks what they took as not to be
        counted by a rollback (their client had stopped waiting for it)."""
        self._last_read = 0
        """The id of the last request read: a stopping daemon tells the client."""
        self._stopping = False
        """The daemon is stopping: nothing more is read (:meth:`stop_reading`)."""
        self._behind: collections.deque[ClientFrame] | None = None
        """Requests read after one run as a task that has not started yet: handled once it
        has (:meth:`_handle`), in order."""
        self._holding_for: int | None = None
        """The request whose task :attr:`_behind` waits for (None once it started)."""
        self._views = asyncio.Lock()
        """Held by the ``view`` request being answered: views are answered one at a time."""
        self.created = 0.0
        """When the connection came (the event loop's clock)."""
        self.evicted = False
        """Closed before its login to admit a newer connection (:data:`MAX_PENDING_LOGINS`)."""
        self._abort: Callable[[], None] | None = None
        """Closes the TCP connection at once (:meth:`accepted`)."""

    def accepted(self, abort: Callable[[], None]) -> None:
        """The TCP connection is accepted (on a TLS port, before its handshake,
        ``brokerd.server.client_tls``): from now it counts among those not logged in,
        and its login deadline runs. ``abort`` closes it at once."""
        self._abort = abort
        self.created = asyncio.get_running_loop().time()
        self._admit()
        self.broker.client_sessions.add(self)
        self._login_deadline = asyncio.get_running_loop().call_later(
            self.broker.config.client.login_timeout, self._login_expired
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """The connection is ready to carry frames (on a TLS port, its handshake done)."""
        self.transport = cast(asyncio.Transport, transport)
        if self._abort is None:
            self.accepted(self.transport.abort)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH)
        self.transport.write(
            encode_frame(
                ClientFrame(
                    ClientFrameKind.CHALLENGE, 0, {"nonce": self.nonce.hex(), "server": "brokerd"}
                )
            )
        )

    def _admit(self) -> None:
        """Make room for this connection among those not logged in: past
        :data:`MAX_PENDING_LOGINS`, the oldest of them is closed at once."""
        pending = [s for s in self.broker.client_sessions if s.access is None and not s.evicted]
        if len(pending) < MAX_PENDING_LOGINS:
            return
        oldest = min(pending, key=lambda s: s.created)
        oldest.evicted = True
        log.debug("client connection closed before its login to admit a newer one")
        oldest.abort()

    def abort(self) -> None:
        """Close the connection at once (in its TLS handshake too), dropping what is unsent."""
        if self.transport is not None:
            self.transport.abort()
        elif self._abort is not None:
            self._abort()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer(read_buffer_in(_THREAD))

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self.reader.buffer_updated(nbytes)
        except RemoteProtocolError as exc:
            self._reply_error(0, exc)
            self._close()
            return
        metas = iter(self.reader.meta_lengths)
        if self._behind is not None:  # a task read before these has not started yet
            for frame in frames:
                if not self._take(frame, next(metas)):
                    return
                self._behind.append(frame)
            return
        self._handle(frames, metas)

    def _handle(
        self,
        frames: list[ClientFrame] | collections.deque[ClientFrame],
        metas: Iterator[int] | None = None,
    ) -> None:
        """Handle the frames read, in order. A request run as a task starts (runs up to
        its first wait) before any request read after it is handled: those wait in
        :attr:`_behind` until it has (SPEC §6: a connection's requests take effect in the
        order written, so a SEND written after an END CONVERSATION or a send_many of its
        conversation comes after it). ``metas``: the meta bytes of each frame, in order,
        to count them (:meth:`_take`); None: they were counted already.

        The frames are taken one by one from the front of one deque, which is what waits
        in :attr:`_behind` when a task stops the handling: never copied again, so
        requests pipelined by the thousand cost the daemon their number, not its square."""
        pending = frames if isinstance(frames, collections.deque) else collections.deque(frames)
        sends: list[ClientFrame] = []
        """Pipelined SENDs, handed on together when another request comes or at the end."""
        while pending:
            frame = pending.popleft()
            if metas is not None and not self._take(frame, next(metas)):
                return
            op = frame.meta.get("op")
            request = frame.kind is ClientFrameKind.REQUEST and self.access is not None
            if request and op == "send" and frame.meta.get("transaction") is None:
                self._last_read = frame.request_id
                sends.append(frame)
                continue
            if sends:
                self._send_now(sends)
                sends = []
            if frame.kind is not ClientFrameKind.REQUEST:
                # not a request in flight (:meth:`_take`): none of theirs is released
                self._refuse(frame.request_id, InvalidRequest("only REQUEST frames are accepted"))
                continue
            if self.access is None:
                self._login(frame)
                continue
            self._last_read = frame.request_id
            if op == "withdraw":
                self._withdraw(frame)
                continue
            if (
                op == "receive"
                and frame.meta.get("transaction") is None
                and self._writable.is_set()
                and self._receive_now(frame)
            ):
                continue
            waits = op == "receive" or op == "get_conversation_group"
            if waits:  # may wait: withdrawable, and bounded (in number and bytes)
                refusal = self._in_flight.wait(frame.request_id)
                if refusal is not None:
                    self._reply_error(frame.request_id, InvalidRequest(refusal))
                    continue
                self._waits[frame.request_id] = Withdrawal()
            task = asyncio.get_running_loop().create_task(self._run(frame))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            if pending:
                if metas is not None and not all(
                    self._take(later, next(metas)) for later in pending
                ):
                    return  # refused: the connection closes
                self._behind = pending
                self._holding_for = frame.request_id
                return
        if sends:
            self._send_now(sends)

    def _take(self, frame: ClientFrame, meta_length: int) -> bool:
        """A frame read after the login: a request is in flight until its reply, its meta
        (``meta_length`` bytes) and body counted until then (:attr:`_in_flight`; reading
        is held past the limit). A frame
        with the id of a request in flight is refused (``InvalidRequest``, in an ERROR
        of id 0) and the connection closed: its reply could not be told from the
        other's. False then: nothing more of the connection is handled."""
        if self.access is None:
            return True
        request_id = frame.request_id
        if request_id in self._in_flight:
            log.warning("client connection closed: it reused request id %d in flight", request_id)
            self._refuse(
                0,
                InvalidRequest(
                    f"request id {request_id} is that of a request in flight: an id may be "
                    "used again only once its request is answered"
                ),
            )
            self._close()
            return False
        if (
            frame.kind is ClientFrameKind.REQUEST
            and self._in_flight.add(request_id, meta_length + len(frame.body))
            and not self._reading_held
        ):
            self._reading_held = True
            self.broker.client_reads_held += 1
            self._read_or_not()
        return True

    def _started(self, request_id: int) -> None:
        """The task of request ``request_id`` runs its handler now: the requests read after
        it are handled once this step of it is over (:meth:`_handle`)."""
        if self._behind is not None and self._holding_for == request_id:
            self._holding_for = None
            asyncio.get_running_loop().call_soon(self._resume)

    def _resume(self) -> None:
        behind, self._behind = self._behind, None
        if not behind or self.transport is None:
            return
        if self._stopping or self.transport.is_closing():
            # not handled: the client was told the last request handled (stop_reading),
            # so it knows these were never executed (BrokerStopping); or the connection
            # closes (a request refused), and none of their replies could leave
            for frame in behind:
                self._release(frame.request_id)
            return
        self._handle(behind)

    def connection_lost(self, exc: Exception | None) -> None:
        self.broker.client_sessions.discard(self)
        self.reader.close()  # a large body half read goes now, not with the last reply
        if self._login_deadline is not None:
            self._login_deadline.cancel()
        for task in list(self.tasks):
            task.cancel()
        self._behind = None
        self._in_flight.clear()  # none of them will be answered: a stop waits for none
        transactions, self.transactions = self.transactions, {}
        for tx in transactions.values():
            # A client that goes away mid-transaction leaves nothing behind; its messages
            # count one rollback each (SPEC §6), written without anyone waiting.
            tx.rollback("the client's connection was lost")
        self.transport = None

    def pause_writing(self) -> None:
        """The client is not taking its replies as fast as they come: read none of its
        requests, and run none of those read, until they drain."""
        self._write_paused = True
        self._writable.clear()
        self._read_or_not()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._out_bytes <= WRITE_HIGH:
            self._writable.set()
        self._read_or_not()

    def _close(self) -> None:
        transport = self.transport
        if transport is None:  # in its TLS handshake: nothing was written to it
            self.abort()
        else:
            self._write_out()
            transport.close()  # once the replies written have left, which a client that
            # reads nothing never lets happen: it is cut off after CLOSE_GRACE
            asyncio.get_running_loop().call_later(CLOSE_GRACE, self._cut_off, transport)

    def _cut_off(self, transport: asyncio.Transport) -> None:
        """The connection closed :data:`CLOSE_GRACE` s ago is still open (its client reads
        none of the replies left): drop them and close it now."""
        if self.transport is transport:
            log.warning("client connection cut off: its last replies were not read")
            transport.abort()

    # -- a graceful stop --------------------------------------------------------------

    @property
    def unanswered(self) -> int:
        """Requests read and not yet answered."""
        return len(self._in_flight)

    def stop_reading(self) -> None:
        """The daemon is stopping (SIGTERM): read nothing more, and tell the client the
        last request read. Every request read is still answered (:meth:`unanswered` says
        how many wait); the ones after it were never read, so never executed, and the
        client fails them with ``BrokerStopping`` (safe to send again)."""
        if self._stopping:
            return
        self._stopping = True
        if self.access is None:
            self._close()  # not logged in: nothing of it is in flight
            return
        self._read_or_not()
        goodbye = BrokerStopping(
            "the daemon is stopping: requests after the last one it read were not executed"
        )
        meta = {**error_meta(goodbye), "last_request": self._last_read}
        self._write(encode_frame(ClientFrame(ClientFrameKind.ERROR, 0, meta)))

    def close(self) -> None:
        """Close the connection once the replies written so far have gone out."""
        self._close()

    def _write(self, *frame: Buffer) -> None:
        """Queue a reply frame (its pieces); the replies of one turn of the event loop (a
        group commit's callbacks answer many SENDs at once) go to the socket in one write,
        in order."""
        if self._out is None:
            self._out = list(frame)
            asyncio.get_running_loop().call_soon(self._write_out)
        else:
            self._out.extend(frame)
        for piece in frame:
            self._out_bytes += len(piece)
        if self._out_bytes > WRITE_HIGH:
            self._writable.clear()

    def _write_out(self) -> None:
        out, self._out = self._out, None
        self._out_bytes = 0
        if not self._write_paused:
            self._writable.set()
        if not out or self.transport is None or self.transport.is_closing():
            return
        if len(out) == 1:
            self.transport.write(out[0])
        else:  # large bodies go as they are (one writev), never joined into a copy
            pieces = coalesce(out)
            if len(pieces) == 1:
                self.transport.write(pieces[0])
            else:
                self.transport.writelines(pieces)

    def _login_expired(self) -> None:
        """No login within ``client.login_timeout``: the connection is closed."""
        if self.access is None:
            timeout = self.broker.config.client.login_timeout
            log.warning("client connection closed: no login within %g s", timeout)
            self._reply_error(0, AuthenticationFailed(f"no login within {timeout:g} s"))
            self._close()

    def _login(self, frame: ClientFrame) -> None:
        meta = frame.meta
        user = meta.get("user")
        token, access = self.credentials.select(user) if isinstance(user, str) else (b"", None)
        if (
            meta.get("op") != "login"
            or access is None
            or not check_proof(token, self.nonce, str(user), meta.get("proof"))
        ):
            log.warning("client login refused (user %r)", user)
            self._reply_error(
                frame.request_id,
                AuthenticationFailed(
                    "credentials refused: log in first with the token your user name selects "
                    "(a [[client.token]] name, or any other name with [client] token_file)"
                ),
            )
            self._close()
            return
        self.access = access
        if self._login_deadline is not None:
            self._login_deadline.cancel()
            self._login_deadline = None
        self.reader.max_body = self.broker.config.limits.max_message_size
        self.reader.max_meta = MAX_META_BYTES
        self._reply(
            frame.request_id,
            {
                "user": user,
                "role": access.role,
                "instance": self.broker.instance_name,
                # a request body over it ends the connection (a frame over the reader's
                # limit): the SDK refuses such a body before it is written
                "max_message_size": self.broker.config.limits.max_message_size,
                "features": list(FEATURES),
            },
        )

    @property
    def allowed(self) -> Access:
        """What the logged-in client may do."""
        assert self.access is not None, "requests are handled only after the login"
        return self.access

    def check_own(self, handle: uuid.UUID) -> None:
        """Refuse an application a conversation of a service that is not its own."""
        if not self.allowed.admin:
            self.allowed.check_conversation(self.broker.engine.endpoint(handle)[1])

    def _release(self, request_id: int) -> None:
        """A request answered: its body no longer counts; reading resumes under half the
        limit."""
        if self._in_flight.answered(request_id) and self._reading_held:
            self._reading_held = False
            self._read_or_not()

    def _wait_for_link(self, ep: Endpoint) -> None:
        """Flow control: SENDs to ``ep``'s link wait for its send window, the peer taking
        them more slowly than they commit. Stop reading this application's requests until
        the link drains (polled every :data:`CONGESTION_POLL` s) or for
        :data:`CONGESTION_HOLD_MOST` s at most, so the backlog, and each message's time
        in it, stays bounded by the link's speed, not by the application's. Its SENDs
        already read go on; a link that goes down ends the wait (store and forward)."""
        self._congested = ep
        self._congested_since = asyncio.get_running_loop().time()
        self.broker.client_sends_held += 1
        self._read_or_not()
        asyncio.get_running_loop().call_later(CONGESTION_POLL, self._congestion_over)

    def _congestion_over(self) -> None:
        ep = self._congested
        if ep is None or self.transport is None:
            return
        loop = asyncio.get_running_loop()
        if (
            self.broker.engine.transmission.congested(ep)
            and loop.time() - self._congested_since < CONGESTION_HOLD_MOST
        ):
            loop.call_later(CONGESTION_POLL, self._congestion_over)
            return
        self._congested = None
        self._read_or_not()

    def _read_or_not(self) -> None:
        """Pause or resume reading as the reasons to hold it say."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        hold = (
            self._reading_held
            or self._congested is not None
            or self._stopping
            or self._write_paused
        )
        if hold and not self._paused:
            self._paused = True
            transport.pause_reading()
        elif not hold and self._paused:
            self._paused = False
            transport.resume_reading()

    def _reply(self, request_id: int, meta: ReplyMeta, body: ReplyBody = b"") -> None:
        self._release(request_id)
        if self.transport is None or self.transport.is_closing():
            return
        pieces = body if isinstance(body, list) else (body,)
        try:
            if isinstance(meta, bytes):
                parts = encode_response_parts(request_id, meta, pieces)
            else:
                parts = encode_frame_parts(ClientFrameKind.RESPONSE, request_id, meta, pieces)
        except LocalProtocolError as exc:  # the client must not wait for a reply forever
            log.error("reply to request %d cannot be sent: %s", request_id, exc)
            self._reply_error(request_id, InternalError(f"the reply cannot be sent: {exc}"))
            return
        self._write(*parts)

    def _reply_sequence(self, request_id: int, seq: int) -> None:
        """A SEND's reply (``_reply(request_id, {"sequence_number": seq})``, same bytes)."""
        self._release(request_id)
        if self.transport is None or self.transport.is_closing():
            return
        self._write(encode_sequence_reply(request_id, seq))

    def _reply_error(self, request_id: int, exc: BaseException) -> None:
        self._release(request_id)
        self._refuse(request_id, exc)

    def _refuse(self, request_id: int, exc: BaseException) -> None:
        """An ERROR frame that answers no request in flight (a frame that is not a
        request, or id 0: the connection closes)."""
        if self.transport is None or self.transport.is_closing():
            return
        self._write(encode_frame(ClientFrame(ClientFrameKind.ERROR, request_id, error_meta(exc))))

    def _send_now(self, frames: list[ClientFrame]) -> None:
        """SENDs outside a transaction, without a task, in the order they came: each run of
        them on one conversation goes to the engine at once (``SendVerbs.send_now``),
        and each reply goes once its message has committed and its events are on disk."""
        engine = self.broker.engine
        run: list[ClientFrame] = []
        messages: list[tuple[str, Body]] = []
        keys: list[str | None] = []
        db: Database | None = None
        ep: Endpoint | None = None
        for frame in frames:
            try:
                m = frame.meta
                handle = meta_uuid(m, "conversation_handle")
                assert handle is not None
                message_type = meta_str(m, "message_type", "DEFAULT")
                key = meta_key(m)
                if ep is None or handle != ep.handle:
                    if run:
                        self._send_run(db, ep, run, messages, keys)
                        run, messages, keys = [], [], []
                    db, ep = engine.endpoint(handle)
                    self.allowed.check_conversation(ep)
            except Exception as exc:
                self._send_refused(frame.request_id, exc)
                if run:  # the next SEND looks its conversation up again
                    self._send_run(db, ep, run, messages, keys)
                    run, messages, keys = [], [], []
                db = ep = None
                continue
            run.append(frame)
            messages.append((message_type, frame.body))
            keys.append(key)
        if run:
            self._send_run(db, ep, run, messages, keys)

    def _send_run(
        self,
        db: Database | None,
        ep: Endpoint | None,
        frames: list[ClientFrame],
        messages: list[tuple[str, Body]],
        keys: list[str | None],
    ) -> None:
        assert db is not None and ep is not None
        ids = [frame.request_id for frame in frames]
        answered = [False] * len(ids)
        gate = db.store.after_gate

        def then(i: int, seq: int) -> None:
            answered[i] = True
            request_id = ids[i]
            # R-TRACE-1: answered from the commit's callback, once its events are on disk
            gate(lambda: self._reply_sequence(request_id, seq))

        def failed(i: int, exc: BaseException) -> None:
            answered[i] = True
            self._reply_error(ids[i], exc)

        engine = self.broker.engine
        try:
            engine.send_verbs.send_now(db, ep, messages, then, failed, keys if any(keys) else None)
        except Exception as exc:  # no SEND may wait for a reply for ever
            for i, request_id in enumerate(ids):
                if not answered[i]:
                    self._send_refused(request_id, exc)
        if self._congested is None and engine.transmission.congested(ep):
            self._wait_for_link(ep)

    def _send_refused(self, request_id: int, exc: BaseException) -> None:
        if not isinstance(exc, BrokerError):
            log.exception("client operation send failed", exc_info=exc)
        self._reply_error(request_id, exc)

    def _receive_now(self, frame: ClientFrame) -> bool:
        """RECEIVE outside a transaction, without a task, when messages are ready now: the
        reply is written from the callback of the commit that removed them. False when
        nothing is ready or a check fails: the request then runs as a task (which waits,
        or repeats the checks and replies with the error)."""
        request_id = frame.request_id
        try:
            self.allowed.check_operation("receive")
            (queue, database, top, _), handle, group, groups = receive_args(self, frame.meta)
            reply = ReceiveReply()

            def then(rows: list[dict[str, Any]]) -> None:
                self._reply(request_id, *reply.encode(rows))
                self._write_out()  # now, not after another turn of a busy event loop

            return self.broker.engine.receive_verbs.receive_now(
                queue,
                database,
                top,
                handle,
                reply,
                then,
                lambda exc: self._reply_error(request_id, exc),
                group,
                groups,
            )
        except Exception:
            return False

    def withdrawal(self, request_id: int) -> Withdrawal | None:
        return self._waits.get(request_id)

    def _withdraw(self, frame: ClientFrame) -> None:
        """``withdraw``: the client stopped waiting for its request ``request`` (a RECEIVE
        or GET CONVERSATION GROUP): if that one has taken nothing yet it ends now, empty
        (its own reply says so), and the answer is ``{"withdrawn": true}``; otherwise it
        goes on and its reply carries what it took (``false``; also for a request that
        was answered already or is not one of this connection's)."""
        target = frame.meta.get("request")
        if type(target) is not int:
            self._reply_error(frame.request_id, InvalidRequest("request must be a request id"))
            return
        waiting = self._waits.get(target) or self._answered.get(target)
        withdrawn = waiting is not None and waiting.withdraw()
        self._reply(frame.request_id, {"withdrawn": withdrawn})

    def _waited(self, request_id: int) -> None:
        """A request run as a task has ended: a RECEIVE or GET CONVERSATION GROUP that took
        something is remembered (:attr:`_answered`) for a withdraw after its answer."""
        waited = self._waits.pop(request_id, None)
        if waited is not None and waited.taken:
            self._answered[request_id] = waited
            if len(self._answered) > ANSWERED_KEPT:
                self._answered.popitem(last=False)

    async def _run(self, frame: ClientFrame) -> None:
        op = frame.meta.get("op")
        handler = OPERATIONS.get(op) if isinstance(op, str) else None
        try:
            while not self._writable.is_set():  # the client's replies wait to leave
                await self._writable.wait()
            self._started(frame.request_id)
            if handler is None:
                raise InvalidRequest(f"unknown operation {op!r}")
            self.allowed.check_operation(str(op))
            if op == "view":
                async with self._views:
                    # one page at a time, each once the replies before it drained: a
                    # client that never reads holds WRITE_HIGH and a page, not a page a
                    # request (a view's rows are read whole, then cut to its page)
                    while not self._writable.is_set():
                        await self._writable.wait()
                    meta, body = await handler(self, frame)
                    self._reply(frame.request_id, meta, body)
                    return
            meta, body = await handler(self, frame)
        except asyncio.CancelledError:
            raise
        except BrokerError as exc:
            self._reply_error(frame.request_id, exc)
            return
        except Exception as exc:
            log.exception("client operation %s failed", op)
            self._reply_error(frame.request_id, exc)
            return
        finally:
            self._waited(frame.request_id)
        self._reply(frame.request_id, meta, body)
