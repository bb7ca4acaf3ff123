"""Unacknowledged message bodies: which stay in memory, and reading the others back.

Owns (SPEC R-DLG-5, R-DLG-13) the memory that the transmission queue's bodies take:

* **held** bodies stay in memory from SEND until acknowledged, up to
  ``limits.held_bodies_mb`` for the whole instance. A SEND beyond that keeps its
  body only until the connection has written it;
* bodies not held are read back from the database file when they are (re)sent,
  in order per endpoint and in batches, and dropped again once written; small ones
  come with their page of a backlog instead (:meth:`Bodies.prefetched`). At most
  ``limits.transit_bodies_mb`` of such bodies are in memory at once: the rest wait
  here until written ones make room, so a backlog of any size is fed to a
  connection as it drains (the send window), never loaded at once;
* a restart loads no body: recovery reads the transmission queue's metadata only.

The transmission hands every message over through :meth:`Bodies.hand_over` and
reports writes (:meth:`written`) and removals (:meth:`release`); everything here
runs on the event loop, and the reads are jobs of the database's committer.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable

from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage
from brokerd.dialogs.transmission.links import Link

log = logging.getLogger("brokerd.dialogs.bodies")

READ_AHEAD_PAGE = 1024 * 1024
"""Bytes of bodies one page of a backlog brings with it at most (256 messages of 4 KiB):
a page of larger messages reads each body back when it is sent."""
READ_AHEAD_MOST = 16 * 1024 * 1024
"""Bytes of bodies read ahead with their pages and not yet handed to a link, over every
endpoint: a budget of their own, so bodies waiting for a full window never take the
room that bodies read back for that window need."""

ReadBodies = Callable[[str, dict[str, list[int]]], Awaitable[dict[tuple[str, int], bytes]]]
"""Reads bodies back, in one job of a database: sequence numbers by conversation handle ->
body by (handle, sequence number)."""
Queue = Callable[[Endpoint, OutMessage, Link], None]
"""Queues a message's fragments on a link (the body is in memory when it is called)."""
Failed = Callable[[Endpoint, OutMessage], None]
"""Told about a message whose body could not be read back (it must be sent again later)."""


class Bodies:
    """The bodies of every endpoint's unacknowledged messages, within two budgets."""

    def __init__(
        self, held_limit: int, transit_limit: int, read: ReadBodies, failed: Failed
    ) -> None:
        self.held_limit = held_limit
        self.transit_limit = transit_limit
        self._read = read
        self._failed = failed
        self.held = 0
        """Bytes of bodies kept from SEND until acknowledged."""
        self.transit = 0
        """Bytes of bodies in memory only until written (read back, or beyond the budget)."""
        self.reads = 0
        """Bodies read back from the database (a counter for the stats view)."""
        self.read_ahead = 0
        """Bodies that came with their page of a backlog (a counter for the stats view)."""
        self.ahead = 0
        """Bytes of bodies read ahead and not yet handed to a link (``msg.read_ahead``)."""
        self._waiting: deque[tuple[Endpoint, OutMessage, Link, Queue]] = deque()
        self._reading = False

    # -- SEND and removal ---------------------------------------------------------------

    def keep(self, msg: OutMessage) -> None:
        """A SEND committed ``msg``: hold its body until acknowledged if the budget allows."""
        if self.held + msg.length <= self.held_limit:
            msg.held = True
            self.held += msg.length

    def release(self, msg: OutMessage) -> None:
        """``msg`` left the transmission queue (acknowledged, or dropped by an ending)."""
        if msg.read_ahead:
            self._leave_read_ahead(msg)
        if msg.held:
            msg.held = False
            self.held -= msg.length
        if msg.in_transit:
            msg.in_transit = False
            self.transit -= msg.length
            self._pump()

    def release_all(self, messages: Iterable[OutMessage]) -> None:
        for msg in messages:
            self.release(msg)

    # -- sending --------------------------------------------------------------------------

    def hand_over(self, ep: Endpoint, msg: OutMessage, link: Link, queue: Queue) -> None:
        """Queue ``msg`` on ``link`` now if its body is in memory and nothing of ``ep``
        waits before it; otherwise it waits here (in order) for room and a read."""
        if msg.read_ahead:
            self._leave_read_ahead(msg)
            if ep.bodies_waiting == 0:  # read ahead: its memory is taken already
                msg.in_transit = True
                self.transit += msg.length
                queue(ep, msg, link)
                return
        if (
            ep.bodies_waiting == 0
            and msg.body is not None
            and (msg.held or msg.in_transit or self._room(msg))
        ):
            self._enter_transit(msg)
            queue(ep, msg, link)
            return
        if not msg.held:
            if msg.in_transit:
                msg.in_transit = False
                self.transit -= msg.length
            msg.body = None  # read back when there is room: a waiting body takes no memory
        ep.bodies_waiting += 1
        self._waiting.append((ep, msg, link, queue))
        self._pump()

    def read_ahead_room(self) -> int:
        """Bytes of bodies a page read starting now may bring with it: at most
        :data:`READ_AHEAD_PAGE`, within what :data:`READ_AHEAD_MOST` has left. Reads run
        concurrently, so what one brings is kept only if it still fits when it is done
        (:meth:`fits_read_ahead`)."""
        return max(0, min(READ_AHEAD_PAGE, READ_AHEAD_MOST - self.ahead))

    def fits_read_ahead(self, size: int) -> bool:
        return self.ahead + size <= READ_AHEAD_MOST

    def prefetched(self, msg: OutMessage) -> None:
        """``msg``'s body came with its page: it stays in memory, counted against
        :data:`READ_AHEAD_MOST`, until a link takes it (:meth:`hand_over`), even while it
        waits for a full window; then it is a body in transit, dropped once written."""
        if msg.body is None or msg.read_ahead or msg.held or msg.in_transit:
            return
        msg.read_ahead = True
        self.ahead += msg.length
        self.read_ahead += 1

    def _leave_read_ahead(self, msg: OutMessage) -> None:
        msg.read_ahead = False
        self.ahead -= msg.length

    def written(self, msg: OutMessage) -> None:
        """The connection wrote the last fragment of ``msg``: a body not held is dropped."""
        if msg.in_transit:
            msg.in_transit = False
            self.transit -= msg.length
            if not msg.held:
                msg.body = None
            self._pump()

    def _room(self, msg: OutMessage) -> bool:
        # One message always fits, however large, so the queue cannot stall.
        return self.transit == 0 or self.transit + msg.length <= self.transit_limit

    def _enter_transit(self, msg: OutMessage) -> None:
        if not msg.held and not msg.in_transit:
            msg.in_transit = True
            self.transit += msg.length

    def _pump(self) -> None:
        if self._waiting and not self._reading:
            self._reading = True
            asyncio.get_running_loop().create_task(self._feed(), name="bodies-read-back")

    async def _feed(self) -> None:
        """Hand over waiting messages in order, reading back the bodies not in memory, as
        long as there is room; one read per endpoint's run of messages. A read that fails
        leaves its messages to be sent again later, with every message still waiting: one
        of the failed read itself, left out, was never due again (its window kept counting
        it) while its connection stayed up."""
        batch: list[tuple[Endpoint, OutMessage, Link, Queue]] = []
        try:
            while self._waiting:
                batch = []
                while self._waiting:
                    item = self._waiting[0]
                    msg = item[1]
                    if msg.held or msg.in_transit or self._room(msg):
                        self._waiting.popleft()
                        if not msg.held:
                            self._enter_transit(msg)
                        batch.append(item)
                    else:
                        break
                if not batch:
                    return  # no room: written or acknowledged bodies pump again
                await self._load(batch)
                loaded, batch = batch, []
                for ep, msg, link, queue in loaded:
                    ep.bodies_waiting -= 1
                    if msg.seq not in ep.outbox or msg.body is None:
                        self.release(msg)  # acknowledged or dropped meanwhile
                        continue
                    if msg.sent_via != link.name or not link.is_open:
                        self.written(msg)  # the link went away: it is sent again later
                        self._failed(ep, msg)
                        continue
                    queue(ep, msg, link)
        except Exception as exc:  # a read that fails: the messages are sent again later
            log.error(
                "cannot read message bodies back from the database: %s; the messages are "
                "sent again later",
                exc,
            )
            for ep, msg, _, _ in [*batch, *self._drain()]:
                ep.bodies_waiting -= 1
                self.written(msg)
                self._failed(ep, msg)
        finally:
            self._reading = False
        self._pump()

    def _drain(self) -> list[tuple[Endpoint, OutMessage, Link, Queue]]:
        items = list(self._waiting)
        self._waiting.clear()
        return items

    async def _load(self, batch: list[tuple[Endpoint, OutMessage, Link, Queue]]) -> None:
        wanted: dict[str, dict[str, list[OutMessage]]] = {}
        for ep, msg, _, _ in batch:
            if msg.body is None and msg.seq in ep.outbox:
                by_handle = wanted.setdefault(ep.database, {})
                by_handle.setdefault(ep.handle_text, []).append(msg)
        for database, by_handle in wanted.items():
            found = await self._read(
                database, {h: [m.seq for m in msgs] for h, msgs in by_handle.items()}
            )
            for handle, messages in by_handle.items():
                for msg in messages:
                    body = found.get((handle, msg.seq))
                    if body is not None:
                        msg.body = body
                        self.reads += 1

    def view(self) -> dict[str, int]:
        return {
            "bodies_held_bytes": self.held,
            "bodies_in_transit_bytes": self.transit,
            "bodies_waiting": len(self._waiting),
            "bodies_read_back": self.reads,
            "bodies_read_ahead": self.read_ahead,
            "bodies_ahead_bytes": self.ahead,
        }
