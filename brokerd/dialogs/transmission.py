"""The sending half of every endpoint: transmission, retransmission and acknowledgements.

Owns (SPEC R-DLG-4..7, R-PROTO-4):

* :meth:`Transmission.transmit`: every message of an endpoint's outbox that is
  due goes to the link its route chose, or records why it waits (DELAYED, the
  connection's status); retransmission with exponential backoff
  (``retry.initial`` doubling up to ``retry.maximum``), one wake-up per endpoint;
* :meth:`Transmission.build_fragment`: a fragment's dialog header, built when
  the link drains it, carrying the endpoint's current acknowledgement (piggybacked);
* dedicated acknowledgements: endpoints that received something are collected
  for ``retry.ack_delay`` and acknowledged per link in one batch
  (:meth:`ack_needed`, :meth:`flush_acks`), unless a message carried the
  acknowledgement meanwhile.

May import: ``protocol``, ``brokerd.config``, ``brokerd.traces``, the models of
``brokerd.dialogs`` and the router (which decides where an endpoint's messages go).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import uuid
from collections.abc import Callable, Iterable

from brokerd.config import RetryConfig
from brokerd.dialogs.endpoint import Endpoint, OutMessage
from brokerd.dialogs.links import Link
from brokerd.dialogs.router import Router
from brokerd.dialogs.stats import EngineStats
from brokerd.traces.writer import TraceWriter
from protocol.dialog import FLAG_INITIATOR, Acknowledgement, DialogHeader


class Transmission:
    """Transmission state of all endpoints of an instance (one per dialog engine)."""

    def __init__(
        self,
        router: Router,
        retry: RetryConfig,
        fragment_size: int,
        trace: TraceWriter,
        stats: EngineStats,
        instance_of: Callable[[str], uuid.UUID],
        clock: Callable[[], float],
    ) -> None:
        self.router = router
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
        self._ack_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

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
    ) -> tuple[DialogHeader, bytes]:
        """Header and bytes of one fragment; carries the endpoint's current acknowledgement."""
        size = self.fragment_size
        offset = index * size
        body = msg.body[offset : offset + size] if msg.fragment_count > 1 else msg.body
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
            len(msg.body),
            ep.lifetime_left(self.clock()),
            0,
            self.ack_of(ep),
        )
        self.stats.fragments_sent += 1
        return header, body

    def ack_of(self, ep: Endpoint) -> Acknowledgement:
        """What ``ep`` has durably received, now sent to the other side."""
        ep.ack_sent_version = ep.ack_version
        return ep.durable.acknowledgement()

    def transmit(self, ep: Endpoint) -> None:
        """Send every message of ``ep`` that is due, or record why it waits."""
        if not ep.outbox:
            return
        link = self.router.link_for(ep)
        now = self.loop.time()
        if link is None:
            reason = self.router.waiting_status(ep)
            for msg in ep.outbox.values():
                msg.status = reason
            self.schedule(ep, now + self.retry.delayed_retry)
            return
        if not link.is_open:
            for msg in ep.outbox.values():
                msg.status = link.status
            link.want(ep)
            return
        earliest = None
        for msg in ep.outbox.values():
            if msg.due <= now:
                self._send_message(ep, msg, link, now)
            if earliest is None or msg.due < earliest:
                earliest = msg.due
        if earliest is not None:
            self.schedule(ep, earliest)

    def _send_message(self, ep: Endpoint, msg: OutMessage, link: Link, now: float) -> None:
        msg.attempts += 1
        wait = min(self.retry.maximum, self.retry.initial * (2 ** (msg.attempts - 1)))
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
        msg.due = now + wait
        msg.last_sent_at = now
        msg.status = ""  # sent: the view describes it from sent_via, attempts and retry_wait
        msg.sent_via = link.name
        msg.retry_wait = wait
        for index in range(msg.fragment_count):
            if index not in msg.acked_fragments:
                if trace.enabled:
                    trace.emit(
                        "fragment_sent",
                        ep.conversation_id,
                        database=ep.database,
                        initiator=ep.initiator,
                        seq=msg.seq,
                        fragment=index,
                        fragments=msg.fragment_count,
                        size=min(self.fragment_size, len(msg.body) - index * self.fragment_size),
                        attempt=msg.attempts,
                        peer=link.name,
                        route=ep.route.route if ep.route else None,
                    )
                link.queue_fragment(ep, msg, index)

    def link_up(self, link: Link, waiting: Iterable[Endpoint]) -> None:
        """A link opened: everything waiting for it goes now (resent at once after a drop)."""
        for ep in waiting:
            for msg in ep.outbox.values():
                msg.due = 0.0
            self.transmit(ep)

    def link_down(self, link: Link, endpoints: Iterable[Endpoint]) -> None:
        """A link closed: unacknowledged messages sent on it wait for the next connection."""
        for ep in endpoints:
            if ep.outbox and ep.route_link is link:
                for msg in ep.outbox.values():
                    msg.status = link.status
                link.want(ep)

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
            if ep.outbox:
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
