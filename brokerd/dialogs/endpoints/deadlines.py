"""Wall-clock deadlines of conversations: timers (R-DLG-11) and lifetimes (R-DLG-9).

Owns the time-ordered list of what fires when. It does not fire anything: the
engine asks :meth:`Deadlines.due` for what has come and checks that it still
applies (a timer replaced, an endpoint closed) before acting.

An entry that no longer applies stays in the list until it comes due, unless the list
outgrows what applies: it is then rebuilt with only the entries that still do, so a
timer set again and again (an idle timeout reset at every message) holds one entry,
not one per timer ever set until the oldest of them would have fired.

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


COMPACT_ABOVE = 1024
"""Entries the list may hold before it is first rebuilt with only those that apply."""


def applies(kind: Deadline, when: float, ep: Endpoint) -> bool:
    """Whether the entry ``(kind, when)`` of ``ep`` is still its timer or its lifetime."""
    if ep.state is State.CLOSED:
        return False
    if kind is Deadline.TIMER:
        return ep.timer_due == when
    return ep.lifetime_ends == when and not ep.broker_error


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline, Endpoint]] = []
        self._counter = itertools.count()
        self._compact_at = COMPACT_ABOVE

    def watch(self, ep: Endpoint) -> None:
        """Schedule the endpoint's timer and lifetime, if it has them."""
        if ep.state is State.CLOSED:
            return
        if ep.timer_due:
            self._push(ep.timer_due, Deadline.TIMER, ep)
        if ep.lifetime_ends and not ep.broker_error:
            self._push(ep.lifetime_ends, Deadline.LIFETIME, ep)

    def watch_timer(self, ep: Endpoint) -> None:
        """Schedule the endpoint's new timer (BEGIN CONVERSATION TIMER); its lifetime is
        scheduled already."""
        if ep.timer_due and ep.state is not State.CLOSED:
            self._push(ep.timer_due, Deadline.TIMER, ep)

    def _push(self, when: float, kind: Deadline, ep: Endpoint) -> None:
        heapq.heappush(self._heap, (when, next(self._counter), kind, ep))
        if len(self._heap) > self._compact_at:
            self._compact()

    def _compact(self) -> None:
        """Rebuild the list with one entry per timer or lifetime that still applies (amortized:
        the next rebuild waits until it has doubled)."""
        seen: set[tuple[int, Deadline]] = set()
        kept = []
        for entry in self._heap:
            when, _, kind, ep = entry
            key = (id(ep), kind)
            if key not in seen and applies(kind, when, ep):
                seen.add(key)
                kept.append(entry)
        heapq.heapify(kept)
        self._heap = kept
        self._compact_at = max(COMPACT_ABOVE, 2 * len(kept))

    def due(self, now: float) -> list[tuple[Deadline, float, Endpoint]]:
        """Every deadline at or before ``now`` (wall-clock), earliest first, removed."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, _, kind, ep = heapq.heappop(heap)
            out.append((kind, when, ep))
        return out
