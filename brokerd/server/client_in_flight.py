"""A client connection's requests in flight: read after its login and not yet answered,
and the bytes each holds until its reply, its meta's and its body's
(``limits.client_pending_mb``, the listener's flow control,
``brokerd.server.client_listener``).

A request is known by the id its client chose, and its reply names it by that id: two
requests in flight with one id could not be told apart, and the first reply would
release the bytes of both. The listener refuses an id in flight (``id in in_flight``)
and closes the connection, so the count is exact against any client.

Reading is held past the limit and resumes at half of it, once replies release bytes.
A request that may wait for ever (a RECEIVE or GET CONVERSATION GROUP) holds its bytes
until something comes or its client withdraws it, so those waiting may hold half the
limit at most, and :data:`MAX_WAITING` in number (:meth:`InFlight.wait`): by themselves
they never hold the reading, and the withdraw that ends one is always read.

May import: nothing of the project.
"""

from __future__ import annotations

MAX_WAITING = 1024
"""RECEIVEs and GET CONVERSATION GROUPs of one connection waiting at once, at most (the
SDK's ``serve`` keeps 16): one more is refused (``InvalidRequest``). Each waits with a
task, its request and its place among its queue's waiters, all woken by every change of
the queue: unbounded, a client's pipelined RECEIVEs of a few dozen bytes each held
kilobytes of the daemon apiece."""


class InFlight:
    """The requests of one connection awaiting their replies, and their bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        """Bytes past which the connection's reading is held."""
        self.bytes = 0
        """Bytes (metas and bodies) of the requests in flight."""
        self.waiting_bytes = 0
        """Bytes of those of them that wait (:meth:`wait`): half the limit at most."""
        self._sizes: dict[int, int] = {}
        """The bytes of each request in flight."""
        self._waiting: set[int] = set()

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def add(self, request_id: int, size: int) -> bool:
        """A request read, of ``size`` bytes (meta and body; its id not in flight): True
        when the bytes in flight are now past the limit."""
        self._sizes[request_id] = size
        self.bytes += size
        return self.bytes > self.limit

    def wait(self, request_id: int) -> str | None:
        """Request ``request_id``, in flight, is to wait until something comes (a RECEIVE
        or GET CONVERSATION GROUP): None, or why it may not (and it does not): those
        waiting are :data:`MAX_WAITING` already, or their bytes would pass half the
        limit with its own."""
        if len(self._waiting) >= MAX_WAITING:
            return (
                f"this connection has {MAX_WAITING} RECEIVE and GET CONVERSATION GROUP "
                "requests under way, the most it may; wait for or withdraw one"
            )
        size = self._sizes.get(request_id, 0)
        if self.waiting_bytes + size > self.limit // 2:
            return (
                f"this connection's waiting RECEIVE and GET CONVERSATION GROUP requests hold "
                f"{self.waiting_bytes} bytes; with this one's {size} they would hold more "
                "than half of limits.client_pending_mb, the most they may; wait for or "
                "withdraw one"
            )
        self._waiting.add(request_id)
        self.waiting_bytes += size
        return None

    def answered(self, request_id: int) -> bool:
        """A request answered (or dropped unanswered): True when bytes were released and
        those in flight are down to half the limit, where the reading may resume."""
        size = self._sizes.pop(request_id, 0)
        if request_id in self._waiting:
            self._waiting.discard(request_id)
            self.waiting_bytes -= size
        self.bytes -= size
        return bool(size) and self.bytes <= self.limit // 2

    def clear(self) -> None:
        """None of them will be answered (the connection is lost)."""
        self._sizes.clear()
        self._waiting.clear()
        self.bytes = self.waiting_bytes = 0
