"""The retransmission timeout learnt per link (R-DLG-6), without I/O."""

from __future__ import annotations

import pytest

from brokerd.dialogs.transmission.rtt import RttEstimator


def test_no_sample_means_the_configured_first_wait_doubling_per_attempt() -> None:
    rtt = RttEstimator(floor=4.0, ceiling=64.0)
    assert [rtt.wait(n) for n in (1, 2, 3, 4, 5, 6)] == [4.0, 8.0, 16.0, 32.0, 64.0, 64.0]


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
