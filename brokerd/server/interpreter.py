"""The interpreter's settings for a running daemon: the cyclic garbage collector and
the GIL's switch interval.

Owns :func:`settle_garbage_collector` and :func:`settle_switch_interval`, called once
when a daemon has started.

May import: the standard library only.
"""

from __future__ import annotations

import gc
import sys

GC_THRESHOLDS = (50_000, 50, 100)
"""The cyclic garbage collector's thresholds once the daemon runs (CPython's: 700, 10,
10). Every message allocates a few dozen container objects (headers, jobs, closures,
trace tuples) that reference counting frees; at 700 the collector still ran a young
collection every few messages, and the older generations rescanned the whole recovered
image. Measured on W2 (``python -m bench run --workload W2``, three alternating runs):
CPU per message 98 / 90 µs (sender / receiver daemon) before, 74 / 75 µs after."""


def settle_garbage_collector() -> None:
    """After start-up: what recovery loaded is moved out of the collector's generations
    (``gc.freeze``: it is never scanned again, it is still freed by reference counting),
    and collections run at :data:`GC_THRESHOLDS`. Cycles are still collected."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


SWITCH_INTERVAL = 0.001
"""Seconds a thread that wants the GIL waits before the holder is asked to drop it
(CPython's default: 0.005). A daemon's committer threads take the GIL back after every
SQLite statement; beside a busy event loop each take could wait out the interval, and
a commit crosses it about ten times. Measured, three alternating runs each
(``python -m bench run --workload W1 --messages 100000`` and ``--workload W2``): W1's
p50 / p99 latency went from 139-167 / 203-310 ms to 98-105 / 155-178 ms at the same
rate (22,000-25,700 and 25,000-26,500 msg/s), W2's rate from 24,400-25,900 to
25,800-27,300 msg/s."""


def settle_switch_interval() -> None:
    """The GIL's switch interval: :data:`SWITCH_INTERVAL`."""
    sys.setswitchinterval(SWITCH_INTERVAL)
