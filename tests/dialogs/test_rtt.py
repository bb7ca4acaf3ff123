"""The retransmission timeout learnt per link (R-DLG-6), without I/O."""

from __future__ import annotations

import pytest

from brokerd.dialogs.transmission.rtt import RttEstimator


def test_no_sample_means_the_configured_first_wait_doubling_per_attempt() -> None:
    rtt = RttEstimator(floor=4.0, ceiling=64.0)
    assert [rtt.wait(n) for n in (1, 2, 3, 4, 5, 6)] == [4.0, 8.0, 16.0, 32.0, 64.0, 64.0]


def _waits_of_a_message_lost_every_time(rtt: RttEstimator, attempts: int) -> list[float]:
    """The waits of one message that is never acknowledged, as ``Transmission`` asks for
    them: each retransmission first backs the link off, then asks for the wait."""
    now, waits = 0.0, []
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            rtt.retransmitted(now)
        waits.append(rtt.wait(attempt))
        now += waits[-1]
    return waits


def test_a_message_lost_every_time_waits_twice_as_long_per_retry_not_four_times() -> None:
    """R-DLG-6: the link's back-off on a timeout and the message's own doubling are one
    doubling, not two."""
    assert _waits_of_a_message_lost_every_time(RttEstimator(0.5, 2.0), 5) == [0.5, 1, 2, 2, 2]
    waits = _waits_of_a_message_lost_every_time(RttEstimator(4.0, 64.0), 7)
    assert waits == [4, 8, 16, 32, 64, 64, 64]


def test_a_retry_waits_at_least_the_links_backed_off_timeout() -> None:
    """Other messages timed out on the link meanwhile: a retry of this one does not go
    before the link's backed-off timeout, even when its own doubling is shorter."""
    rtt = RttEstimator(floor=0.5, ceiling=8.0)
    for now in (0.0, 1.0, 3.0, 7.0):  # four timeouts of other messages, each a timeout apart
        rtt.retransmitted(now)
    assert rtt.timeout == 8.0
    assert rtt.wait(2) == 8.0


def test_a_fast_link_keeps_the_floor() -> None:
    rtt = RttEstimator(floor=4.0, ceiling=64.0)
    for _ in range(50):
        rtt.observe(0.03)
    assert rtt.timeout == 4.0


def test_a_slow_link_raises_the_timeout_above_its_delays() -> None:
    rtt = RttEstimator(floor=1.0, ceiling=64.0)
    rtt.observe(3.0)
    assert rtt.timeout == pytest.approx(3.0 + 4 * 1.5)
    for _ in range(100):
        rtt.observe(3.0)
    assert 3.0 < rtt.timeout < 3.5  # the deviation decays on a steady link


def test_the_timeout_follows_a_link_that_becomes_slow_and_stays_below_the_ceiling() -> None:
    rtt = RttEstimator(floor=1.0, ceiling=10.0)
    for _ in range(20):
        rtt.observe(0.1)
    assert rtt.timeout == 1.0
    for _ in range(40):
        rtt.observe(5.0)
    assert rtt.timeout > 5.0
    rtt.observe(100.0)
    assert rtt.timeout == 10.0


def test_retransmissions_back_off_once_per_timeout_until_a_sample_comes() -> None:
    rtt = RttEstimator(floor=0.5, ceiling=8.0)
    for _ in range(1000):  # a burst of timeouts at the same moment backs off once
        rtt.retransmitted(now=10.0)
    assert rtt.timeout == 1.0
    rtt.retransmitted(now=10.5)  # less than a (backed-off) timeout later: no change
    assert rtt.timeout == 1.0
    rtt.retransmitted(now=11.0)
    rtt.retransmitted(now=13.0)
    rtt.retransmitted(now=17.0)
    rtt.retransmitted(now=30.0)
    assert rtt.timeout == 8.0  # never above the ceiling
    rtt.observe(0.2)  # a message sent once was acknowledged: the estimate decides again
    assert rtt.timeout == pytest.approx(0.2 + 4 * 0.1)


def test_negative_delays_are_ignored() -> None:
    rtt = RttEstimator(floor=2.0, ceiling=8.0)
    rtt.observe(-1.0)
    assert rtt.samples == 0 and rtt.timeout == 2.0
