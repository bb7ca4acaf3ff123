"""The router's parts are composed, not inherited (SPEC §2), and its shared decision cache
forgets as the router always did (R-ROUTE-1, R-ROUTE-4: kept until a route it consulted
expires or the cache is full)."""

from __future__ import annotations

import enum
import importlib
import inspect
import pkgutil
import uuid
from datetime import UTC, datetime, timedelta

import brokerd.dialogs.router as router_package
from brokerd.dialogs.router.state import DecisionCache
from brokerd.routing.rules import Decision


def test_no_class_of_the_router_inherits_from_a_class_of_the_project() -> None:
    """Only protocols, errors, enums and named tuples may have a base of brokerd's own."""
    found = 0
    for info in pkgutil.iter_modules(router_package.__path__):
        module = importlib.import_module(f"{router_package.__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            found += 1
            if getattr(cls, "_is_protocol", False) or issubclass(cls, Exception | enum.Enum):
                continue
            own = [b for b in cls.__mro__[1:] if b.__module__.split(".")[0] == "brokerd"]
            assert own == [], f"{cls.__qualname__} inherits from {own}"
    assert found >= 7


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
