"""The send window of each link: how much may be sent and not yet acknowledged.

Owns (SPEC R-DLG-6, R-DLG-13) the flow control between a sender and a receiver: a
link carries at most ``limits.send_window`` messages (``WINDOW_MESSAGES`` by default)
or ``limits.send_window_mb`` that were handed to it and not yet acknowledged, or
``limits.backlog_send_window`` messages when the message to go was paged in from a
backlog. Beyond that, messages wait here, in the order they were sent (so each
endpoint's order holds), and go as acknowledgements return; an endpoint with more
due messages than that (a backlog) waits as one entry, *blocked*, and offers the
rest once the window has room. A backlog of any size is
thus fed to a connection at the pace the receiver commits, every message's retry
clock starts within a window's worth of the receiver's work, and a peer returning to
a large backlog is not sent more than it can acknowledge before the first wait runs
out. A window with more than ``WAITING_HIGH`` messages waiting is *congested*: the
client listener then reads no more of the SENDs bound for it until it drains.

Pure: no I/O and no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from brokerd.config import LimitsConfig
from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage
from brokerd.dialogs.transmission.links import Link

WINDOW_MESSAGES = LimitsConfig.send_window
"""Messages handed to one link and not yet acknowledged, at most, before a message kept
in memory since its SEND (not paged in from the file) waits (``limits.send_window``): a
message just SENT waits behind about this many in the receiver, and beyond that the
applications that SEND to the link are held (:meth:`SendWindow.congested`), so its
latency is bounded by the link's speed."""
BACKLOG_WINDOW_MESSAGES = LimitsConfig.backlog_send_window
"""The same bound for a message paged in from a backlog (``OutMessage.paged``,
``limits.backlog_send_window``): its latency is spent already, and the receiver must be
kept busy over the round trip of its group commits and acknowledgements for the backlog
to drain at its pace. Measured on the recovery workload (W6), 2,000 drained
21,000-21,300 msg/s, 4,000 23,800, 8,000 23,700-26,300, 16,000 no more. While an
endpoint whose next message is kept in memory is blocked, the backlogs have the smaller
bound too, so that endpoint is never starved by them."""
WINDOW_BYTES = LimitsConfig.send_window_mb * 1024 * 1024
"""Their bytes, at most (``limits.send_window_mb``; one message always fits, however
large)."""
WAITING_HIGH = 50
"""Messages waiting for room in a full window beyond which the link is *congested*: the
peer takes them more slowly than SENDs commit them, and the client listener makes the
applications that SEND to it wait (:meth:`SendWindow.congested`)."""

Send = Callable[[Endpoint, OutMessage, Link], None]


class SendWindow:
    """The window of one link."""

    __slots__ = (
        "backlog_messages",
        "blocked",
        "blocked_paged",
        "bytes",
        "count",
        "max_bytes",
        "messages",
        "resuming",
        "waiting",
    )

    def __init__(
        self,
        messages: int = WINDOW_MESSAGES,
        backlog_messages: int = BACKLOG_WINDOW_MESSAGES,
        max_bytes: int = WINDOW_BYTES,
    ) -> None:
        self.messages = messages
        """:data:`WINDOW_MESSAGES` of this window."""
        self.backlog_messages = max(messages, backlog_messages)
        """:data:`BACKLOG_WINDOW_MESSAGES` of this window."""
        self.max_bytes = max_bytes
        """:data:`WINDOW_BYTES` of this window."""
        self.count = 0
        self.bytes = 0
        self.waiting: deque[tuple[Endpoint, OutMessage, Link, Send]] = deque()
        self.blocked: dict[int, Endpoint] = {}
        """Endpoints that stopped offering their due messages when the window was full
        (:meth:`block`); they offer the rest once everything waiting has gone."""
        self.blocked_paged: set[int] = set()
        """Those of :attr:`blocked` whose message was paged in from a backlog."""
        self.resuming = False

    def offer(self, ep: Endpoint, msg: OutMessage, link: Link, send: Send) -> bool:
        """Send ``msg`` now if the window has room (or it is already counted in it, as a
        retransmission is), otherwise when acknowledgements make room (False)."""
        if msg.window is self:
            send(ep, msg, link)
        elif not self.waiting and self._room(msg):
            self._count(msg, link)
            send(ep, msg, link)
        else:
            if not msg.held and not msg.in_transit and not msg.read_ahead:
                msg.body = None  # a waiting body beyond the budget is read back when sent
            self.waiting.append((ep, msg, link, send))
            return False
        return True

    def congested(self, ep: Endpoint) -> bool:
        """More messages wait for this window than :data:`WAITING_HIGH`, or ``ep`` waits
        for it with all its due messages (:meth:`block`)."""
        return len(self.waiting) > WAITING_HIGH or id(ep) in self.blocked

    def block(self, ep: Endpoint, paged: bool = False) -> None:
        """``ep`` has more due messages than the window takes now: rather than queue each of
        them here (a backlog of a million would be a million entries, and the event loop
        would stop to queue them), it offers the rest when :meth:`unblocked` says so.
        ``paged``: the message that found the window full was paged in from a backlog
        (its bound is :attr:`backlog_messages`)."""
        key = id(ep)
        self.blocked[key] = ep
        if paged:
            self.blocked_paged.add(key)
        else:
            self.blocked_paged.discard(key)

    def unblocked(self) -> list[Endpoint]:
        """The blocked endpoints whose bound has room again, in the order they blocked,
        once nothing waits and the bytes allow (else none). While an endpoint blocked by
        a message kept in memory since its SEND waits, no endpoint of a backlog resumes
        before it: the window drains under :attr:`messages` and all resume."""
        blocked = self.blocked
        if not blocked or self.waiting or self.bytes >= self.max_bytes:
            return []
        if self.count >= self._bound(paged=True):  # the larger one if all are backlogs'
            return []
        endpoints = list(blocked.values())
        blocked.clear()
        self.blocked_paged.clear()
        return endpoints

    def _bound(self, paged: bool) -> int:
        """Messages in flight below which a message goes: a backlog's has the larger bound
        (``paged``) unless an endpoint blocked by a message kept in memory waits (it would
        never see the count fall under its bound while backlogs refill the window)."""
        if paged and len(self.blocked_paged) == len(self.blocked):
            return self.backlog_messages
        return self.messages

    def release(self, msg: OutMessage) -> None:
        """``msg`` was acknowledged, dropped, or its link went down: it leaves the window,
        and what waits goes if it now has room."""
        self.uncount(msg)
        self.feed()

    def uncount(self, msg: OutMessage) -> None:
        """``msg`` leaves the window, and nothing is sent now (its image was forgotten:
        the caller has the window fed (:meth:`feed`) in a later turn of the loop: no
        acknowledgement may be coming to do it)."""
        if msg.window is self:
            msg.window = None
            self.count -= 1
            self.bytes -= msg.length

    def feed(self) -> None:
        """Send what waits, in order, while there is room."""
        waiting = self.waiting
        while waiting:
            ep, msg, link, send = waiting[0]
            if msg.seq not in ep.outbox or msg.sent_via != link.name:
                waiting.popleft()  # acknowledged, dropped, or moved to another link
                continue
            if not self._room(msg):
                return
            waiting.popleft()
            self._count(msg, link)
            send(ep, msg, link)

    def forget_waiting(self) -> list[Endpoint]:
        """The link went down: the endpoints of what waited (and of what was not offered
        yet) send it again when a link is up."""
        endpoints = {id(ep): ep for ep, _, _, _ in self.waiting}
        endpoints.update(self.blocked)
        self.waiting.clear()
        self.blocked.clear()
        self.blocked_paged.clear()
        return list(endpoints.values())

    def _room(self, msg: OutMessage) -> bool:
        """Whether ``msg`` may be counted in now (:meth:`_bound`, and the bytes)."""
        if self.count == 0:
            return True
        return self.count < self._bound(msg.paged) and self.bytes + msg.length <= self.max_bytes

    def _count(self, msg: OutMessage, link: Link) -> None:
        msg.window = self
        self.count += 1
        self.bytes += msg.length
