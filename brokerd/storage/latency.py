"""The commit-latency histogram of one database file: how long each group commit took,
from ``BEGIN`` to ``COMMIT``, counted into fixed buckets by the committer thread.

It is plain counts, not a metrics library's object: the admin port's Prometheus
collector (``brokerd.server.admin_http.metrics``) reads it at scrape time. One thread
writes (the committer) and the event loop reads; a reader may see a commit counted in
``count`` before its bucket, which a scrape tolerates.

May import nothing of brokerd.
"""

from __future__ import annotations

import bisect

COMMIT_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
"""Upper bounds (seconds) of the buckets; one more, unbounded, follows them."""


class CommitLatency:
    """Counts of group commits by duration (:data:`COMMIT_BUCKETS`), their sum and number."""

    def __init__(self, buckets: tuple[float, ...] = COMMIT_BUCKETS) -> None:
        self.bounds = buckets
        self.counts = [0] * (len(buckets) + 1)
        """Commits per bucket (not cumulative); the last is those over the last bound."""
        self.total_seconds = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total_seconds += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, commits at most that long)`` per bucket, ``inf`` last."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), list(self.counts), strict=True):
            running += n
            out.append((bound, running))
        return out
