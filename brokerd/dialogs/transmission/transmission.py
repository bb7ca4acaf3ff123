"""The sending half of every endpoint: transmission, retransmission and acknowledgements.

Owns (SPEC R-DLG-4..7, R-PROTO-4):

* :meth:`Transmission.transmit`: every message of an endpoint's outbox that is
  due goes to the link its route chose, or the endpoint records why it waits
  (DELAYED, the connection's status); retransmission with exponential backoff
  from the link's timeout (:mod:`brokerd.dialogs.transmission.rtt`: ``retry.initial``, or
  more on a link observed to acknowledge slowly, doubling up to
  ``retry.maximum``), one wake-up per endpoint;
* :meth:`Transmission.send_new`: a committed SEND hands its message to an open
  link without looking at the messages already waiting (a SEND costs the same
  behind a backlog);
* :meth:`Transmission.build_fragment`: a fragment's dialog header, built when
  the link writes it, carrying the endpoint's current acknowledgement
  (piggybacked). The retry clock starts then, not when the message was queued
  for the link: a backlog handed to a connection at once is not resent before
  its first copy is even written;
* dedicated acknowledgements: endpoints that received something are collected
  for ``retry.ack_delay`` and acknowledged per link in one batch
  (:meth:`ack_needed`, :meth:`flush_acks`), unless a message carried the
  acknowledgement meanwhile;
* the redial rule (R-PROTO-5): a message retransmitted ``retry.redial_after``
  times on a link that acknowledged nothing meanwhile (no acknowledgement
  removed a message of an endpoint routed over it, and it did not reconnect)
  makes the link close its connection and dial again, instead of a further
  retransmission on a connection that carries nothing back.

May import: ``protocol``, ``brokerd.config``, ``brokerd.traces`` and
``brokerd.dialogs.endpoints``. The router, which decides where an endpoint's messages
go, is handed in as a :class:`LinkChooser`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Protocol

from brokerd.config import LimitsConfig, RetryConfig
from brokerd.dialogs.endpoints.backlog import numbers_in, paged_limit, spill
from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage
from brokerd.dialogs.endpoints.runs import alike_runs
from brokerd.dialogs.endpoints.service_keys import ServiceKeys
from brokerd.dialogs.endpoints.stats import EngineStats
from brokerd.dialogs.transmission.bodies import Bodies, ReadBodies
from brokerd.dialogs.transmission.links import Link
from brokerd.dialogs.transmission.rtt import RttEstimator
from brokerd.dialogs.transmission.window import SendWindow
from brokerd.storage.reads import SentRow
from brokerd.traces.writer import TraceWriter
from protocol.buffers import Buffer
from protocol.dialog import FLAG_INITIATOR, Acknowledgement, DialogHeader
from protocol.dialog_security import make_key_exchange
from protocol.fragments import fragment_count

log = logging.getLogger("brokerd.dialogs.transmission")

ReadPage = Callable[[str, str, int, int, int], Awaitable[tuple[list[SentRow], dict[int, bytes]]]]
"""Reads a page of an endpoint's backlog, in one job of its database (database, handle,
first and last number, the bytes of bodies it may bring): the rows (sequence number,
message type, flags, length, enqueue time), and the bodies by number if they fit."""


class LinkChooser(Protocol):
    """Where an endpoint's messages go: the router, as transmission sees it."""

    def link_for(self, ep: Endpoint) -> Link | None:
        """The link ``ep``'s messages go to now, or None (no route yet)."""
        ...

    def waiting_status(self, ep: Endpoint) -> str:
        """Why ``ep``'s messages have no link."""
        ...


class Transmission:
    """Transmission state of all endpoints of an instance (one per dialog engine)."""

    def __init__(
        self,
        router: LinkChooser,
        retry: RetryConfig,
        fragment_size: int,
        trace: TraceWriter,
        stats: EngineStats,
        instance_of: Callable[[str], uuid.UUID],
        clock: Callable[[], float],
        limits: LimitsConfig,
        read_bodies: ReadBodies,
        read_page: ReadPage,
        service_keys: Callable[[str], ServiceKeys] | None = None,
    ) -> None:
        self.router = router
        self.service_keys = service_keys or (lambda _database: ServiceKeys())
        """The key pairs and remote service bindings of a database, by name (R-DLG-14)."""
        self.retry = retry
        self.fragment_size = fragment_size
        self.trace = trace
        self.stats = stats
        self.instance_of = instance_of
        """The broker instance of a database, by name."""
        self.clock = clock
        """Wall-clock time (the lifetime a header carries is counted on it)."""
        self._wakeups: list[tuple[float, int, Endpoint]] = []
        self._counter = itertools.count()
        self._ack_dirty: set[Endpoint] = set()
        self._answer_epochs: dict[Link, int] = {}
        """Per link, how often it answered (acknowledged something, or reconnected)."""
        self._ack_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rtt: dict[str, RttEstimator] = {}
        """Acknowledgement delays per link name."""
        self._windows: dict[str, SendWindow] = {}
        """The send window of each link, by name."""
        self._gathered: list[tuple[Endpoint, OutMessage, Link]] | None = None
        """While a run of new messages is handed over (:meth:`send_run`), or an endpoint's
        due messages (:meth:`transmit`), and traces are on: the ones of one fragment
        queued on a link for the first time, traced together at the end (:meth:`_gather`)."""
        self._hand_over_fn = self._hand_over
        """One bound method for every message a window holds back (a backlog of a million
        messages would otherwise hold a million of them)."""
        self._new_window = partial(
            SendWindow,
            limits.send_window,
            limits.backlog_send_window,
            limits.send_window_mb * 1024 * 1024,
        )
        """A link's send window, as ``limits`` sizes it."""
        self._read_page = read_page
        self.page = limits.backlog_page
        """Messages of one endpoint paged in at once (``limits.backlog_page``)."""
        self.exchange_renewed_after = limits.closed_endpoint_keep / 2
        """Seconds after which an initiator makes its key exchange again while its target
        has not answered (R-DLG-14): a target takes a first message only with an exchange
        younger than the time it keeps a closed endpoint (``closed_endpoint_keep``)."""
        self.spill = spill(self.page)
        self.paged_limit = paged_limit(self.page)
        self.paged = 0
        """Messages paged in from backlogs and still in an outbox (all endpoints)."""
        self.pages_read = 0
        self._page_waiting: deque[Endpoint] = deque()
        """Endpoints waiting for :attr:`paged_limit` to allow their next page."""
        self._names: dict[str, str] = {}
        """One string per message type for the messages paged in."""
        self._page_reads: set[asyncio.Task[None]] = set()
        """Page reads in flight (held here so that none is collected before it ends)."""
        self.bodies = Bodies(
            limits.held_bodies_mb * 1024 * 1024,
            limits.transit_bodies_mb * 1024 * 1024,
            read_bodies,
            self.read_failed,
        )

    def start(self, loop: asyncio.AbstractEventLoop, unacknowledged: Iterable[Endpoint]) -> None:
        """Begin on ``loop``; ``unacknowledged`` are endpoints recovered with an ack owed."""
        self._loop = loop
        self._ack_dirty.update(unacknowledged)

    def stop(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "transmission not started"
        return self._loop

    # -- sending -------------------------------------------------------------------

    def build_fragment(
        self, ep: Endpoint, msg: OutMessage, index: int
    ) -> tuple[DialogHeader, Buffer]:
        """Header and bytes of one fragment, as the link writes it; carries the endpoint's
        current acknowledgement. The message's retry clock starts now."""
        size = self.fragment_size
        offset = index * size
        whole = msg.body
        assert whole is not None, "links skip a queued copy whose body was dropped (written)"
        body: Buffer = whole
        if msg.fragment_count > 1:  # a view: the link copies the bytes once, into the frame
            body = memoryview(whole)[offset : offset + size]
        header = DialogHeader(
            ep.conversation_id,
            ep.service,
            ep.far_service,
            self.instance_of(ep.database),
            ep.far_broker_instance,
            ep.contract,
            msg.message_type,
            msg.flags,
            msg.seq,
            index,
            msg.fragment_count,
            offset,
            msg.length,
            ep.lifetime_left(self.clock()),
            0,
            self.ack_of(ep),
        )
        if ep.keys is not None:
            header, body = self.seal(ep, header, body)
        self.fragment_left(ep, msg, index)
        return header, body

    def fragment_left(self, ep: Endpoint, msg: OutMessage, index: int) -> None:
        """Fragment ``index`` of ``msg`` left on its link: the retry clock starts now, and
        once its last fragment is out, a body that is not held leaves memory."""
        self.stats.fragments_sent += 1
        now = self.loop.time()
        msg.last_sent_at = now
        msg.due = now + msg.retry_wait
        self.schedule(ep, msg.due)
        if index == msg.fragment_count - 1 or _last_unacknowledged(msg) == index:
            self.bodies.written(msg)

    def seal(self, ep: Endpoint, header: DialogHeader, body: Buffer) -> tuple[DialogHeader, bytes]:
        """``header`` and ``body`` under the dialog key (R-DLG-14); the initiator's carry
        the key exchange until the target has answered under the key."""
        keys = ep.keys
        assert keys is not None
        exchange = b""
        if ep.initiator and not ep.key_confirmed and header.sequenced:
            now = self.clock()
            if not ep.key_exchange or now - ep.key_exchange_at > self.exchange_renewed_after:
                sk = self.service_keys(ep.database)
                own, far = sk.own.get(ep.service), sk.bound.get(ep.far_service)
                if own is not None and far is not None:
                    ep.key_exchange = make_key_exchange(
                        ep.conversation_id,
                        ep.service,
                        ep.far_service,
                        keys.key,
                        own,
                        far,
                        made_at=int(now * 1000),
                    )
                    ep.key_exchange_at = now
            exchange = ep.key_exchange
        return keys.seal(header, body, exchange)

    def ack_of(self, ep: Endpoint) -> Acknowledgement:
        """What ``ep`` has durably received, now sent to the other side."""
        ep.ack_sent_version = ep.ack_version
        return ep.durable.acknowledgement()

    def acknowledged(self, msg: OutMessage) -> None:
        """``msg`` was acknowledged: a message sent once tells how slow its link is."""
        if msg.attempts == 1 and msg.last_sent_at and msg.sent_via:
            rtt = self._rtt.get(msg.sent_via)
            if rtt is not None:
                rtt.observe(self.loop.time() - msg.last_sent_at)

    def timeout_of(self, link_name: str) -> float:
        """The current first retransmission wait on a link (for views and tests)."""
        rtt = self._rtt.get(link_name)
        return rtt.timeout if rtt is not None else self.retry.initial

    def transmit(self, ep: Endpoint) -> None:
        """Send every message of ``ep`` that is due, or record why it waits; page in more
        of its backlog when few of its messages are in memory."""
        if not ep.outbox and not ep.backlog:
            return
        link = self.router.link_for(ep)
        now = self.loop.time()
        if link is None or not link.is_open:
            self._wait(ep, link, now)
            return
        if ep.backlog and len(ep.outbox) < self.page:
            self.page_in(ep)
        gathered = self._gather()  # a drained backlog sends a page of them here
        try:
            earliest = math.inf
            for msg in ep.outbox.values():
                if msg.due <= now:
                    if not self._send_message(ep, msg, link, now):
                        # The link redials; its link_up sends everything again, and this
                        # wake-up covers a link that had no connection to close.
                        self.schedule(ep, now + self.retry.initial)
                        return
                    window = self._windows[link.name]  # made by _send_message
                    if msg.window is not window:
                        # The window is full: this message waits in it, and the
                        # endpoint's other due messages are offered when it has room
                        # again, so a backlog costs the window one entry per endpoint,
                        # not per message.
                        window.block(ep, msg.paged)
                        break
                if msg.due < earliest:
                    earliest = msg.due
            if earliest < math.inf:
                self.schedule(ep, earliest)
        finally:
            self._gathered_out(gathered)

    # -- the backlog ----------------------------------------------------------------------

    def page_in(self, ep: Endpoint) -> None:
        """Read the next page of ``ep``'s backlog (R-DLG-13): at most :attr:`page` messages,
        in sequence order, without bodies (read back when sent). An endpoint with messages
        in memory waits while :attr:`paged_limit` paged-in messages are; one with none
        always gets its page, so every endpoint progresses."""
        backlog = ep.backlog
        if not backlog or backlog.paging or len(ep.outbox) >= self.page:
            return
        backlog.paging = True
        if ep.outbox and self.paged >= self.paged_limit:
            self._page_waiting.append(ep)
            return
        self._read_next_page(ep)

    def _read_next_page(self, ep: Endpoint) -> None:
        task = self.loop.create_task(self._page(ep), name="backlog-page-in")
        self._page_reads.add(task)
        task.add_done_callback(self._page_reads.discard)

    async def _page(self, ep: Endpoint) -> None:
        backlog = ep.backlog
        if not backlog:  # dropped meanwhile (an ending, or the image forgotten)
            backlog.paging = False
            return
        first, last = backlog.span(self.page)
        try:
            room = self.bodies.read_ahead_room()
            rows, bodies = await self._read_page(ep.database, ep.handle_text, first, last, room)
        except Exception:  # the page is read again after the first wait
            log.exception("cannot read a page of conversation %s's backlog", ep.conversation_id)
            backlog.paging = False
            self.schedule(ep, self.loop.time() + self.retry.initial)
            return
        backlog.paging = False
        # Acknowledgements and endings may have removed numbers while the page was read.
        wanted = [row for row in rows if row[0] in backlog]
        expected = numbers_in(backlog.remove(first, last))
        if expected != len(wanted):
            log.warning(
                "conversation %s: %d message(s) of its backlog are not in the file",
                ep.conversation_id,
                expected - len(wanted),
            )
        if bodies and not self.bodies.fits_read_ahead(sum(map(len, bodies.values()))):
            bodies = {}  # other pages read meanwhile took the room: read back when sent
        names, size, outbox = self._names, self.fragment_size, ep.outbox
        prefetched = self.bodies.prefetched
        for seq, message_type, flags, length, enqueued_at in wanted:
            msg = outbox[seq] = OutMessage(
                seq=seq,
                message_type=names.setdefault(message_type, message_type),
                flags=flags,
                body=bodies.get(seq),  # None: read back when sent
                length=length,
                enqueued_at=enqueued_at,
                fragment_count=fragment_count(length, size),
                paged=True,
            )
            if msg.body is not None:
                prefetched(msg)
        self.paged += len(wanted)
        self.pages_read += 1
        self.transmit(ep)

    def _paged_left(self, msg: OutMessage) -> None:
        """A paged-in message left its outbox: the next waiting page may be read."""
        msg.paged = False
        self.paged -= 1
        waiting = self._page_waiting
        while waiting and self.paged < self.paged_limit:
            ep = waiting.popleft()
            if ep.backlog.paging:
                self._read_next_page(ep)

    def forget(self, ep: Endpoint) -> None:
        """``ep``'s image is dropped (its database is no longer principal here): its
        messages' bodies' bytes and their places in their links' send windows are freed.
        Nothing is sent now (the database is fenced): what waits for those windows goes
        once the image is dropped (:meth:`_resume`, in a later turn of the loop). Not
        with their next acknowledgement only: a window whose places were all this
        image's has none coming, and what waits there (the rebuilt image's messages
        too, queued behind the dropped ones) would wait until the connection closed.

        Nor is it acknowledged any more (R-DLG-5, R-ROUTE-16): what it says it holds may
        be what this partner committed alone and its mirror never confirmed (a principal
        restarted in doubt loads such an image, then learns it was superseded). Left
        owed, its acknowledgement went out with the next batch, once this partner was
        promoted again with a file copied from the other, which never had those
        messages: their sender dropped them, lost (found by the soak's mirrored pair)."""
        for msg in ep.outbox.values():
            self.release(msg, send_waiting=False)
        ep.outbox.clear()
        ep.backlog.clear()
        self._ack_dirty.discard(ep)
        ep.ack_sent_version = ep.ack_version

    def view(self) -> dict[str, int]:
        return {
            "outbound_paged_in": self.paged,
            "backlog_pages_read": self.pages_read,
        }

    def congested(self, ep: Endpoint) -> bool:
        """``ep``'s link is open and its peer takes messages more slowly than they are sent:
        its send window is full and more wait for it (:meth:`SendWindow.congested`). A
        link that is down is never congested: SENDs then wait in the transmission queue,
        as long as it takes (store and forward). It looks only at the link the endpoint's
        messages last went to: no routing decision is made for it."""
        link = ep.route_link
        if link is None or not link.is_open:
            return False
        window = self._windows.get(link.name)
        return window is not None and window.congested(ep)

    def link_open(self, ep: Endpoint) -> bool:
        """Whether ``ep``'s messages have an open link to go to now."""
        link = self.router.link_for(ep)
        return link is not None and link.is_open

    def send_run(self, ep: Endpoint, messages: list[OutMessage]) -> None:
        """:meth:`send_new` of each of ``messages`` (committed together, in order); their
        ``fragment_sent`` events are traced together, a line each as ever."""
        if len(messages) == 1:  # a run of one (10,000 dialogs taking turns): nothing to gather
            self.send_new(ep, messages[0])
            return
        gathered = self._gather()
        try:
            for msg in messages:
                self.send_new(ep, msg)
        finally:
            self._gathered_out(gathered)

    def _gather(self) -> list[tuple[Endpoint, OutMessage, Link]] | None:
        """From now on, the ``fragment_sent`` lines of messages of one fragment sent for the
        first time are gathered (:meth:`_queue_fragments`), to be traced together by
        :meth:`_gathered_out`: the list, or None if an outer call gathers them already
        or nothing is traced."""
        if self._gathered is not None or not self.trace.enabled:
            return None
        gathered: list[tuple[Endpoint, OutMessage, Link]] = []
        self._gathered = gathered
        return gathered

    def _gathered_out(self, gathered: list[tuple[Endpoint, OutMessage, Link]] | None) -> None:
        """Trace what :meth:`_gather` gathered (one entry per run) and stop gathering."""
        if gathered is None:
            return
        self._gathered = None
        if gathered:
            self._trace_gathered(gathered)

    def _trace_gathered(self, gathered: list[tuple[Endpoint, OutMessage, Link]]) -> None:
        """``fragment_sent`` of messages of one fragment queued on their first attempt, one
        entry per run of messages of one endpoint, link and size."""
        keys = [(id(ep), link.name, msg.length) for ep, msg, link in gathered]
        for start, end in alike_runs(keys):
            ep, msg, link = gathered[start]
            self.trace.emit_each(
                "fragment_sent",
                ep.conversation_id,
                "seq",
                [m.seq for _, m, _ in gathered[start:end]],
                database=ep.database,
                initiator=ep.initiator,
                fragment=0,
                fragments=1,
                size=msg.length,
                attempt=1,
                peer=link.name,
                route=ep.route.route if ep.route else None,
            )

    def send_new(self, ep: Endpoint, msg: OutMessage) -> None:
        """A SEND committed ``msg``: hand it to the endpoint's link if that is open,
        without looking at the messages already waiting; otherwise the endpoint
        waits as a whole (its messages go when the link opens)."""
        link = self.router.link_for(ep)
        if link is not None and link.is_open:
            window = self._windows.get(link.name)
            if window is not None and id(ep) in window.blocked:
                if not msg.held:
                    msg.body = None  # read back when it is offered
                return  # due: offered after the endpoint's older messages, in order
            self._send_message(ep, msg, link, self.loop.time())
        else:
            if not msg.held:
                msg.body = None  # beyond the budget: read back when the link opens
            self._wait(ep, link, self.loop.time())

    def _wait(self, ep: Endpoint, link: Link | None, now: float) -> None:
        """``ep`` has no open link: say why, and look again when that may have changed."""
        if link is None:
            ep.waiting_status = self.router.waiting_status(ep)
            self.schedule(ep, now + self.retry.delayed_retry)
        else:
            ep.waiting_status = link.status
            link.want(ep)

    def _send_message(self, ep: Endpoint, msg: OutMessage, link: Link, now: float) -> bool:
        """Send ``msg`` on ``link``; False if the link redials instead (nothing sent)."""
        if msg.attempts and not self._answered_lately(link, msg):
            self._answer_epochs[link] = self._answer_epochs.get(link, 0) + 1
            link.redial(
                f"message {msg.seq} of conversation {ep.conversation_id} was retransmitted "
                f"{msg.unanswered} times on {link.name} and nothing was acknowledged "
                "(retry.redial_after)"
            )
            return False
        msg.attempts += 1
        rtt = self._rtt.get(link.name)
        if rtt is None:
            rtt = self._rtt[link.name] = RttEstimator(self.retry.initial, self.retry.maximum)
        if msg.attempts > 1:
            rtt.retransmitted(now)
        wait = rtt.wait(msg.attempts)
        trace = self.trace
        if msg.attempts > 1:
            self.stats.retransmissions += 1
            trace.emit(
                "retransmission",
                ep.conversation_id,
                database=ep.database,
                initiator=ep.initiator,
                seq=msg.seq,
                attempt=msg.attempts,
                wait=wait,
                peer=link.name,
            )
        msg.due = math.inf  # until the link writes it (build_fragment)
        msg.sent_via = link.name
        msg.retry_wait = wait
        window = self._windows.get(link.name)
        if window is None:
            window = self._windows[link.name] = self._new_window()
        if msg.window is not None and msg.window is not window:
            # Its route moved to another link while the one it went to stays open: it
            # leaves that link's window now (its acknowledgement will release it from
            # the window of the link it goes to), or that window would count it for ever.
            # Or the connection that counted it was lost (its window with it): the new
            # connection's window counts it, as any message handed over.
            self._leave_window(msg)
        window.offer(ep, msg, link, self._hand_over_fn)
        return True

    def _hand_over(self, ep: Endpoint, msg: OutMessage, link: Link) -> None:
        self.bodies.hand_over(ep, msg, link, self._queue_fragments)

    def release(self, msg: OutMessage, send_waiting: bool = True) -> None:
        """``msg`` left the transmission queue (acknowledged, or dropped by an ending): its
        body's memory and its place in its link's send window are freed, and what waits
        for that window goes if it now has room: at once, or in a later turn of the loop if
        not ``send_waiting``."""
        self.bodies.release(msg)
        if msg.paged:
            self._paged_left(msg)
        self._leave_window(msg, send_waiting)

    def _leave_window(self, msg: OutMessage, send_waiting: bool = True) -> None:
        """``msg`` leaves the send window that counts it (R-DLG-13); what waits for that
        window goes if it now has room: at once, or in a later turn of the loop if not
        ``send_waiting`` (:meth:`_resume`)."""
        window = msg.window
        if isinstance(window, SendWindow):
            if not send_waiting:
                window.uncount(msg)
                if not window.resuming:
                    window.resuming = True
                    self.loop.call_soon(self._resume, window)
            else:
                window.release(msg)
                if window.blocked and not window.resuming:
                    window.resuming = True
                    self.loop.call_soon(self._resume, window)
        msg.window = None

    def _resume(self, window: SendWindow) -> None:
        """What waits for a window that has room again goes, in order, then the endpoints
        that stopped at it offer their due messages again."""
        window.resuming = False
        window.feed()
        for ep in window.unblocked():
            self.transmit(ep)

    def _queue_fragments(self, ep: Endpoint, msg: OutMessage, link: Link) -> None:
        """Queue the fragments of ``msg`` not yet acknowledged (its body is in memory), but
        those still waiting on ``link`` to be written: a retransmission due while the last
        of a large message wait there sends only the ones written (R-DLG-6)."""
        trace = self.trace
        gathered = self._gathered
        if gathered is not None:
            if msg.fragment_count == 1 and msg.attempts == 1:
                gathered.append((ep, msg, link))
                link.queue_fragment(ep, msg, 0)
                return
            if gathered:  # traced before this one's lines, in the order they were queued
                self._trace_gathered(gathered)
                gathered.clear()
        for index in range(msg.fragment_count):
            queued = index not in msg.acked_fragments and link.queue_fragment(ep, msg, index)
            if queued and trace.enabled:
                trace.emit_grouped(
                    "fragment_sent",
                    ep.conversation_id,
                    "seq",
                    msg.seq,
                    database=ep.database,
                    initiator=ep.initiator,
                    fragment=index,
                    fragments=msg.fragment_count,
                    size=min(self.fragment_size, msg.length - index * self.fragment_size),
                    attempt=msg.attempts,
                    peer=link.name,
                    route=ep.route.route if ep.route else None,
                )

    def discard(self, ep: Endpoint) -> None:
        """``ep``'s unacknowledged messages are dropped (an ending): their memory and window
        places are freed."""
        for msg in list(ep.outbox.values()):
            self.release(msg)
        ep.outbox.clear()
        ep.backlog.clear()

    def read_failed(self, ep: Endpoint, msg: OutMessage) -> None:
        """``msg``'s body could not be read back, or its link went away meanwhile: send it
        again after the first wait."""
        msg.due = 0.0
        self.schedule(ep, self.loop.time() + self.retry.initial)

    def _answered_lately(self, link: Link, msg: OutMessage) -> bool:
        """Count one more retransmission of ``msg`` on ``link``; False once it has been
        retransmitted ``retry.redial_after`` times since the link last answered."""
        epoch = self._answer_epochs.get(link, 0)
        if msg.answer_epoch != epoch:
            msg.answer_epoch = epoch
            msg.unanswered = 0
        if msg.unanswered >= self.retry.redial_after:
            return False
        msg.unanswered += 1
        return True

    def answered(self, ep: Endpoint) -> None:
        """An acknowledgement removed messages of ``ep``, or acknowledged fragments: the
        link its messages are routed over carries answers."""
        link = ep.route_link
        if link is not None:
            self._answer_epochs[link] = self._answer_epochs.get(link, 0) + 1

    def link_up(self, link: Link, waiting: Iterable[Endpoint]) -> None:
        """A link opened: everything waiting for it goes now (resent at once after a drop)."""
        self._answer_epochs[link] = self._answer_epochs.get(link, 0) + 1
        for ep in waiting:
            for msg in ep.outbox.values():
                msg.due = 0.0
            self.transmit(ep)

    def link_down(self, link: Link, endpoints: Iterable[Endpoint]) -> None:
        """A link closed: unacknowledged messages sent on it wait for the next connection
        (or another link the router chooses meanwhile)."""
        name = link.name
        window = self._windows.pop(name, None)
        if window is not None:
            # What waited for room was never handed over: it goes again like the rest.
            endpoints = [*endpoints, *window.forget_waiting()]
        for ep in endpoints:
            lost = False
            for msg in ep.outbox.values():
                if window is not None and msg.window is window:
                    msg.window = None  # the window starts empty on the next connection
                if msg.sent_via == name:
                    msg.sent_via = ""
                    msg.due = 0.0
                    lost = True
            if ep.has_unacknowledged and ep.route_link is link:
                ep.waiting_status = link.status
                link.want(ep)
            elif lost:
                self.transmit(ep)  # on the link the router chose since

    # -- wake-ups ---------------------------------------------------------------------

    def schedule(self, ep: Endpoint, due: float) -> None:
        """Wake ``ep``'s transmission at loop time ``due``: one entry per endpoint, the
        earliest (a later wake-up is recomputed by :meth:`transmit` when it runs)."""
        if ep.wakeup and ep.wakeup <= due:
            return
        ep.wakeup = due
        heapq.heappush(self._wakeups, (due, next(self._counter), ep))

    def wake_due(self) -> None:
        """Transmit for every endpoint whose wake-up time has come."""
        now = self.loop.time()
        due: dict[int, Endpoint] = {}
        wakeups = self._wakeups
        while wakeups and wakeups[0][0] <= now:
            when, _, ep = heapq.heappop(wakeups)
            if ep.wakeup != when:
                continue  # replaced by an earlier wake-up
            ep.wakeup = 0.0
            due[id(ep)] = ep
        for ep in due.values():
            if ep.has_unacknowledged:
                self.transmit(ep)

    # -- dedicated acknowledgements ---------------------------------------------------------

    def ack_needed(self, ep: Endpoint) -> None:
        """``ep`` received something: acknowledge it within ``retry.ack_delay``."""
        ep.mark_ack_needed()
        self._ack_dirty.add(ep)
        if self._ack_timer is None:
            self._ack_timer = self.loop.call_later(self.retry.ack_delay, self.flush_acks)

    def flush_acks(self) -> None:
        """One batch of acknowledgements per link, for every endpoint still owed one."""
        self._ack_timer = None
        dirty, self._ack_dirty = self._ack_dirty, set()
        per_link: dict[int, tuple[Link, list[DialogHeader]]] = {}
        for ep in dirty:
            if ep.ack_sent_version >= ep.ack_version:
                continue  # piggybacked on a message meanwhile
            link = ep.last_link if ep.last_link is not None and ep.last_link.is_open else None
            if link is None:
                link = self.router.link_for(ep)
                if link is None or not link.is_open:
                    continue  # the peer retransmits; it will be acknowledged then
            header = DialogHeader(
                ep.conversation_id,
                ep.service,
                ep.far_service,
                self.instance_of(ep.database),
                ep.far_broker_instance,
                ep.contract,
                flags=FLAG_INITIATOR if ep.initiator else 0,
                ack=self.ack_of(ep),
            )
            if ep.keys is not None:
                header = self.seal(ep, header, b"")[0]
            per_link.setdefault(id(link), (link, []))[1].append(header)
            self.trace.emit(
                "ack_sent",
                ep.conversation_id,
                database=ep.database,
                initiator=not ep.initiator,
                through=header.ack.through,
                peer=link.name,
            )
        for link, headers in per_link.values():
            self.stats.acks_sent += len(headers)
            link.queue_acks(headers)


def _last_unacknowledged(msg: OutMessage) -> int:
    """The highest fragment of ``msg`` its peer has not acknowledged."""
    for index in range(msg.fragment_count - 1, -1, -1):
        if index not in msg.acked_fragments:
            return index
    return -1
