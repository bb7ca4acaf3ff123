"""A client connection's requests in flight: read after its login and not yet answered,
and the body bytes each holds until its reply (``limits.client_pending_mb``, the
listener's flow control, ``brokerd.server.client_listener``).

A request is known by the id its client chose, and its reply names it by that id: two
requests in flight with one id could not be told apart, and the first reply would
release the bytes of both. The listener refuses an id in flight (``id in in_flight``)
and closes the connection, so the count is exact against any client.

May import: nothing of the project.
"""

from __future__ import annotations


class InFlight:
    """The requests of one connection awaiting their replies, and their body bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        """Body bytes past which the connection's reading is held."""
        self.bytes = 0
        """Body bytes of the requests in flight."""
        self._ids: set[int] = set()
        self._sizes: dict[int, int] = {}
        """The body bytes of each request in flight that has a body."""

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, request_id: int, size: int) -> bool:
        """A request read, with a body of ``size`` bytes (its id not in flight): True when
        the bytes in flight are now past the limit."""
        self._ids.add(request_id)
        if size:
            self._sizes[request_id] = size
            self.bytes += size
        return self.bytes > self.limit

    def answered(self, request_id: int) -> bool:
        """A request answered (or dropped unanswered): True when its bytes were released
        and those in flight are down to half the limit, where the reading may resume."""
        self._ids.discard(request_id)
        if not self._sizes:
            return False
        size = self._sizes.pop(request_id, 0)
        self.bytes -= size
        return bool(size) and self.bytes <= self.limit // 2

    def clear(self) -> None:
        """None of them will be answered (the connection is lost)."""
        self._ids.clear()
        self._sizes.clear()
        self.bytes = 0
