"""The part of an endpoint's transmission queue that is only in the database file.

Owns (SPEC R-DLG-5, R-DLG-13) the compact image of unacknowledged messages that
are not in memory (after a restart all of them, since recovery loads none; and
those SENT while the endpoint's link is down, beyond :func:`spill`): the sequence
numbers of an endpoint's transmission queue rows, as ascending runs ``[first,
last]`` (a dialog's queue is one run of numbers, less what was acknowledged out
of order), and their count. No message object exists for them: the transmission
pages them in from the file, in sequence order and a bounded number at a time, as
the link has room (:mod:`brokerd.dialogs.transmission.transmission`).

Every number here is larger than those of the endpoint's messages in memory (its
``outbox``): a SEND committed while an endpoint has a backlog joins the backlog, so
pages are appended to the outbox in sequence order.

Pure: no I/O and no clock.
"""

from __future__ import annotations

from collections.abc import Iterator

PAGE = 256
"""Messages of one endpoint paged in at once (``limits.backlog_page``, its default); it
pages in more once fewer than this of its messages are in memory (so at most twice this
many)."""


def spill(page: int) -> int:
    """An endpoint whose link is not open keeps at most this many messages in memory: a
    SEND beyond them joins its backlog (paged in once the link opens)."""
    return 2 * page


def paged_limit(page: int) -> int:
    """Paged-in messages in memory at once, over all endpoints, beyond which an endpoint
    that still has messages in memory waits for its next page (one with none never
    waits): 16,384 with the default page."""
    return 64 * page


Runs = list[tuple[int, int]]
"""Runs of sequence numbers ``(first, last)``, ascending."""


def numbers_in(runs: Runs) -> int:
    """How many sequence numbers ``runs`` hold."""
    return sum(last - first + 1 for first, last in runs)


class Backlog:
    """Sequence numbers of one endpoint's transmission queue rows not in memory."""

    __slots__ = ("count", "paging", "runs")

    def __init__(self) -> None:
        self.runs: list[list[int]] = []
        """Ascending, disjoint, not adjacent: ``[first, last]`` each."""
        self.count = 0
        self.paging = False
        """A page of this endpoint is being read."""

    def __bool__(self) -> bool:
        return self.count > 0

    def __len__(self) -> int:
        return self.count

    def __contains__(self, seq: int) -> bool:
        return any(first <= seq <= last for first, last in self.runs)

    def __iter__(self) -> Iterator[int]:
        for first, last in list(self.runs):
            yield from range(first, last + 1)

    @property
    def first(self) -> int:
        """The lowest sequence number (the backlog is not empty)."""
        return self.runs[0][0]

    def add(self, first: int, last: int | None = None) -> None:
        """Rows ``first..last`` (one row if ``last`` is None), normally above every number
        here (a backlog grows in sequence order)."""
        last = first if last is None else last
        runs = self.runs
        if runs and first <= runs[-1][1]:
            self.restore([(first, last)])
            return
        if runs and runs[-1][1] == first - 1:
            runs[-1][1] = last
        else:
            runs.append([first, last])
        self.count += last - first + 1

    def span(self, n: int) -> tuple[int, int]:
        """The first number and the ``n``-th (or the last one): the next page."""
        left = n
        for first, last in self.runs:
            size = last - first + 1
            if size >= left:
                return self.runs[0][0], first + left - 1
            left -= size
        return self.runs[0][0], self.runs[-1][1]

    def remove(self, first: int, last: int) -> Runs:
        """Drop the numbers in ``first..last``; returns the runs dropped."""
        removed: Runs = []
        kept: list[list[int]] = []
        for lo, hi in self.runs:
            if hi < first or lo > last:
                kept.append([lo, hi])
                continue
            a, b = max(lo, first), min(hi, last)
            removed.append((a, b))
            self.count -= b - a + 1
            if lo < a:
                kept.append([lo, a - 1])
            if b < hi:
                kept.append([b + 1, hi])
        self.runs = kept
        return removed

    def spans(self) -> Runs:
        """The runs, as a copy (to restore after a unit of work that failed)."""
        return [(lo, hi) for lo, hi in self.runs]

    def clear(self) -> Runs:
        """Drop everything; returns the runs dropped."""
        removed = self.spans()
        self.runs = []
        self.count = 0
        return removed

    def restore(self, runs: Runs) -> None:
        """Put back runs taken by :meth:`clear` (a unit of work that failed to commit)."""
        merged: list[list[int]] = []  # overlapping runs count once
        for lo, hi in sorted([*((a, b) for a, b in self.runs), *runs]):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.runs = merged
        self.count = sum(hi - lo + 1 for lo, hi in merged)
