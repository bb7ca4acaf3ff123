"""The interpreter's settings a daemon makes once started (``brokerd.server.interpreter``)."""

from __future__ import annotations

import sys

from brokerd.server.interpreter import SWITCH_INTERVAL, settle_switch_interval


def test_the_switch_interval_is_shortened_for_the_committer_threads() -> None:
    before = sys.getswitchinterval()
    try:
        settle_switch_interval()
        assert sys.getswitchinterval() == SWITCH_INTERVAL < 0.005
    finally:
        sys.setswitchinterval(before)
