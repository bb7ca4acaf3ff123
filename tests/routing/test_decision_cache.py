"""The router's shared decision cache forgets as the router always did (R-ROUTE-1,
R-ROUTE-4: kept until a route it consulted expires or the cache is full). That the
router's parts are composed, not inherited, is ``tests/test_structure.py``'s check of the
whole project."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from brokerd.dialogs.router.state import DecisionCache
from brokerd.routing.rules import Decision


def decision(valid_for: float | None = None) -> Decision:
    until = None if valid_for is None else datetime.now(UTC) + timedelta(seconds=valid_for)
    return Decision("delayed", "no route", valid_until=until)


def test_a_decision_cache_forgets_when_a_route_it_consulted_expires() -> None:
    cache: DecisionCache[str] = DecisionCache(limit=10)
    assert not cache.stale(datetime.now(UTC).timestamp())
    kept = decision(valid_for=60)
    cache.keep("a", kept)
    cache.expire_with(kept)
    assert cache.get("a") is kept
    now = datetime.now(UTC).timestamp()
    assert not cache.stale(now)
    assert cache.stale(now + 61)
    cache.clear()
    assert cache.get("a") is None
    assert not cache.stale(now + 61)


def test_a_decision_cache_is_stale_past_its_limit() -> None:
    cache: DecisionCache[uuid.UUID] = DecisionCache(limit=2)
    for _ in range(3):
        cache.keep(uuid.uuid4(), decision())
    assert cache.stale(0.0)
