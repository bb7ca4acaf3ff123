"""How long to wait for an acknowledgement on a link, learnt from the ones that came.

Owns the retransmission timeout of each link (SPEC R-DLG-6): the first wait is
``retry.initial``, or more when the peer has been observed to acknowledge more
slowly. The estimate is TCP's (RFC 6298): a smoothed delay and its mean
deviation, updated with every acknowledgement of a message sent once (Karn's
rule: an acknowledgement of a message sent twice says nothing about which copy
it answers), and the timeout is ``smoothed + 4 x deviation``, never below
``retry.initial`` nor above ``retry.maximum``.

Until such an acknowledgement comes, a retransmission on the link doubles the
timeout of the link's next messages (TCP's timer back-off, RFC 6298 5.5), at
most once per timeout: otherwise, on a link slower than ``retry.initial``, every
message would be resent before its acknowledgement and no delay could ever be
learnt. A message's own retries double its wait from the learnt timeout: the
first wait, then twice it, four times, ... up to ``retry.maximum`` (R-DLG-6). The
link's back-off is not doubled on top of that (a message lost every time would
otherwise wait four times longer per retry, not twice); a retry only never waits
less than the link's backed-off timeout.

A slow but healthy peer (a receiver committing a burst of thousands of new
dialogs, for instance) thus gets no duplicates once its delays have been seen,
while a lost message on a fast link is still resent after ``retry.initial``.

Pure: no I/O, no clock; the caller measures the delays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALPHA = 1 / 8
"""Weight of a new sample in the smoothed delay (RFC 6298)."""
BETA = 1 / 4
"""Weight of a new sample's deviation in the mean deviation (RFC 6298)."""


@dataclass(slots=True)
class RttEstimator:
    """The acknowledgement delay of one link and the retransmission timeout it implies."""

    floor: float
    """``retry.initial``: the timeout is never shorter."""
    ceiling: float
    """``retry.maximum``: nor longer."""
    smoothed: float = 0.0
    deviation: float = 0.0
    samples: int = 0
    backoff: float = 1.0
    """Factor on the timeout since the last retransmission without a sample since."""
    backed_off_at: float = -math.inf
    first_wait: float = 0.0
    """:meth:`wait` of a first attempt while nothing changed since it was computed (0:
    compute it again); every message sent asks for it."""

    def observe(self, delay: float) -> None:
        """A message sent once was acknowledged ``delay`` seconds after it was written."""
        if delay < 0:
            return
        self.first_wait = 0.0
        self.backoff = 1.0
        if self.samples == 0:
            self.smoothed = delay
            self.deviation = delay / 2
        else:
            self.deviation += BETA * (abs(self.smoothed - delay) - self.deviation)
            self.smoothed += ALPHA * (delay - self.smoothed)
        self.samples += 1

    def retransmitted(self, now: float) -> None:
        """A message on the link timed out (at loop time ``now``): back off, once per timeout."""
        if now - self.backed_off_at >= self.timeout:
            self.backed_off_at = now
            self.backoff = min(self.backoff * 2, self.ceiling / self.floor)
            self.first_wait = 0.0

    @property
    def learnt(self) -> float:
        """The timeout the acknowledgement delays alone give (no back-off): the floor until
        a sample comes, then ``smoothed + 4 x deviation``, within floor and ceiling."""
        estimate = self.floor if self.samples == 0 else self.smoothed + 4 * self.deviation
        return min(self.ceiling, max(self.floor, estimate))

    @property
    def timeout(self) -> float:
        """Seconds to wait for the first acknowledgement of a message: the learnt timeout,
        backed off by the retransmissions since the last sample."""
        return min(self.ceiling, self.learnt * self.backoff)

    def wait(self, attempt: int) -> float:
        """Seconds before attempt ``attempt + 1``: the timeout for a first attempt; for a
        retry the learnt timeout doubled per attempt (R-DLG-6), and never less than the
        link's backed-off timeout."""
        if attempt == 1:
            if not self.first_wait:
                self.first_wait = min(self.ceiling, self.timeout)
            return self.first_wait
        return min(self.ceiling, max(self.timeout, self.learnt * 2.0 ** (attempt - 1)))
