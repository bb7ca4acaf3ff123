"""Closed endpoints waiting to be removed, and when each may go (SPEC §5, Decision).

An endpoint in ``CD`` is done: this side ended, the other side ended too and everything
this side sent is acknowledged, or this side, the initiator, ended before it sent anything
(``states.RULES``). :class:`ClosedEndpoints` remembers
each one from the moment it closed and says when it may be removed:

* an **initiator**'s as soon as it owes no acknowledgement (the one of the target's
  EndDialog or Error has been sent), and at the latest after ``keep`` seconds;
* a **target**'s ``keep`` seconds after it closed, or after the last copy of one of
  its messages that arrived since (:meth:`touched`): while it is kept, a late copy of
  the initiator's messages is acknowledged again and not delivered (R-DLG-4).

Pure: no I/O. The clean-up part (``brokerd.dialogs.lifetime.cleanup``) asks
:meth:`due` and removes what it returns. The engine hands it a monotonic clock: the
keep lives in memory only (a restart starts it again), so it counts elapsed time, and a
wall clock set forward or back neither cuts it short nor stretches it.

May import: the models of ``brokerd.dialogs.endpoints``.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable

from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.endpoints.states import State


class ClosedEndpoints:
    """The closed endpoints of every database, in the order they may go."""

    def __init__(self, keep: float, clock: Callable[[], float]) -> None:
        self.keep = keep
        """``limits.closed_endpoint_keep``: seconds a target keeps a closed endpoint."""
        self._clock = clock
        self._since: dict[uuid.UUID, float] = {}
        """Handle -> when it closed (or, for a target, when a copy last arrived)."""
        self._initiators: deque[Endpoint] = deque()
        self._targets: deque[tuple[float, Endpoint]] = deque()
        """Oldest first; an entry whose time is not the endpoint's in ``_since`` is stale."""

    def __len__(self) -> int:
        return len(self._since)

    def watch(self, ep: Endpoint) -> None:
        """``ep`` may have closed: remember it from now on (once)."""
        if ep.state is not State.CLOSED or ep.handle in self._since:
            return
        now = self._clock()
        self._since[ep.handle] = now
        if ep.initiator:
            self._initiators.append(ep)
        else:
            self._targets.append((now, ep))

    def watched(self, ep: Endpoint) -> bool:
        """Whether ``ep``'s closing has been seen (and it is not forgotten)."""
        return ep.handle in self._since

    def touched(self, ep: Endpoint) -> None:
        """A copy of one of the initiator's messages arrived for the closed target ``ep``:
        the initiator has not had its acknowledgement yet, so the keep counts again."""
        if ep.initiator or ep.handle not in self._since:
            return
        now = self._clock()
        self._since[ep.handle] = now
        self._targets.append((now, ep))

    def forget(self, ep: Endpoint) -> None:
        """``ep`` went another way (END WITH CLEANUP, an image dropped)."""
        self._since.pop(ep.handle, None)

    def due(self, limit: int) -> list[Endpoint]:
        """At most ``limit`` closed endpoints that may be removed now, forgotten here."""
        now = self._clock()
        out: list[Endpoint] = []
        later: list[Endpoint] = []
        initiators = self._initiators
        while initiators and len(out) < limit:
            ep = initiators.popleft()
            since = self._since.get(ep.handle)
            if since is None:
                continue
            if ep.ack_version > ep.ack_sent_version and now < since + self.keep:
                later.append(ep)  # its last acknowledgement has not gone yet
                continue
            del self._since[ep.handle]
            out.append(ep)
        initiators.extend(later)
        targets = self._targets
        while targets and len(out) < limit and targets[0][0] + self.keep <= now:
            since, ep = targets.popleft()
            if self._since.get(ep.handle) != since:
                continue  # touched since, or gone
            del self._since[ep.handle]
            out.append(ep)
        return out

    def waiting(self) -> dict[str, int]:
        """How many closed endpoints wait to be removed, per side (for the stats view)."""
        initiators = sum(1 for ep in self._initiators if ep.handle in self._since)
        return {
            "closed_initiators_waiting": initiators,
            "closed_targets_kept": len(self._since) - initiators,
        }
