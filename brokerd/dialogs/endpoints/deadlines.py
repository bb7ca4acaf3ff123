"""Wall-clock deadlines of conversations: timers (R-DLG-11) and lifetimes (R-DLG-9).

Owns the time-ordered list of what fires when. It does not fire anything: the
engine asks :meth:`Deadlines.due` for what has come and checks that it still
applies (a timer replaced, an endpoint closed) before acting.

May import: the models of ``brokerd.dialogs``.
"""

from __future__ import annotations

import enum
import heapq
import itertools

from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.endpoints.states import State


class Deadline(enum.StrEnum):
    TIMER = "timer"
    """BEGIN CONVERSATION TIMER's timeout: a DialogTimer message."""
    LIFETIME = "lifetime"
    """The dialog's lifetime: an Error on both sides."""


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline, Endpoint]] = []
        self._counter = itertools.count()

    def watch(self, ep: Endpoint) -> None:
        """Schedule the endpoint's timer and lifetime, if it has them."""
        if ep.state is State.CLOSED:
            return
        if ep.timer_due:
            heapq.heappush(self._heap, (ep.timer_due, next(self._counter), Deadline.TIMER, ep))
        if ep.lifetime_ends and not ep.broker_error:
            entry = (ep.lifetime_ends, next(self._counter), Deadline.LIFETIME, ep)
            heapq.heappush(self._heap, entry)

    def due(self, now: float) -> list[tuple[Deadline, float, Endpoint]]:
        """Every deadline at or before ``now`` (wall-clock), earliest first, removed."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, _, kind, ep = heapq.heappop(heap)
            out.append((kind, when, ep))
        return out
