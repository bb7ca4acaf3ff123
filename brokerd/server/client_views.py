"""The client protocol's ``view`` op: the admin views by name, each a page at a time
(SPEC R-PROTO-4, Decision).

A request names the view (``name``), optionally the key of the last row it has
(``after``, the previous reply's ``next``) and how many rows it wants (``limit``, 1 to
:data:`~brokerd.dialogs.verbs.paging.MAX_PAGE`, 500 by default); the queue view also
takes ``queue``. The reply's meta says how many rows its body holds (``rows_in_body``)
and, when more follow, the cursor of the next page (``next``). A page holds at most
``limit`` rows and :data:`MAX_PAGE_BYTES` of them encoded, so a reply is bounded
whatever the view's size.

Each view sorts its rows by a key that names one row (:data:`VIEWS`); the few small ones
whose rows have no such key (``stats``, ``broker_connections``, ``mirrors``,
``mirroring``, ``drops``) are keyed by their position. ``quarantined`` lists the
conversations poison-message handling set aside (SPEC §6).

May import: ``protocol``, ``brokerd.dialogs``, ``brokerd.server.client_meta``; the
daemon's parts (``brokerd.server.transport``, ``brokerd.server.mirroring``,
``brokerd.server.activation``) for their types only.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from brokerd.dialogs.verbs import stored_views, views
from brokerd.dialogs.verbs.paging import (
    DEFAULT_PAGE,
    MAX_CURSOR,
    MAX_PAGE,
    PageRequest,
    key_part,
    row_key,
    smallest_after,
)
from brokerd.server.client_meta import meta_str
from protocol.errors import InvalidRequest

if TYPE_CHECKING:
    from brokerd.dialogs.engine import DialogEngine
    from brokerd.server.activation import ExternalActivation
    from brokerd.server.mirroring_service import Mirroring
    from brokerd.server.transport import Transport

MAX_PAGE_BYTES = 1 << 20
"""Bytes of one page's rows, encoded, at most (one row always goes, however large)."""


class ViewedBroker(Protocol):
    """What the views read of the daemon (``brokerd.server.daemon.Broker``)."""

    engine: DialogEngine
    transport: Transport
    mirroring: Mirroring
    activation: ExternalActivation
    client_reads_held: int
    client_sends_held: int


Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class View:
    """One view: its rows for a page request (all of them, or a superset of the page),
    and the fields of its key (None: by position)."""

    rows: Callable[[ViewedBroker, PageRequest, Mapping[str, Any]], Rows | Awaitable[Rows]]
    key: tuple[str, ...] | None


def _stats(broker: ViewedBroker) -> Rows:
    engine = broker.engine
    return [
        {
            **{k: v for k, v in asdict(engine.stats).items() if k != "drop_reasons"},
            **engine.router.stats_view(),
            **engine.trace.view(),
            **broker.transport.view(),
            **engine.transmission.bodies.view(),
            **engine.outbound_view(),
            **engine.closing.waiting(),
            "client_reads_held": broker.client_reads_held,
            "client_sends_held": broker.client_sends_held,
            **broker.activation.stats(),
        }
    ]


def _databases(broker: ViewedBroker) -> list[Any]:
    return list(broker.engine.databases.values())


async def _queues(broker: ViewedBroker) -> Rows:
    """The ``queues`` view, once the rollback counts in flight are written (a queue
    disabled or a conversation quarantined by poison-message handling shows as a restart
    would find it, SPEC §6)."""
    await broker.engine.poison.settled()
    return views.queues(_databases(broker))


VIEWS: dict[str, View] = {
    "conversation_endpoints": View(
        lambda b, page, _: views.conversation_endpoints(_databases(b), page),
        views.ENDPOINTS_VIEW_KEY,
    ),
    "transmission_queue": View(
        lambda b, page, _: b.engine.conversation_verbs.transmission_queue(page),
        ("database", "conversation_handle", "message_sequence_number"),
    ),
    "queue_messages": View(
        lambda b, page, meta: stored_views.queue_messages(
            _databases(b), meta_str(dict(meta), "queue"), page
        ),
        stored_views.QUEUE_VIEW_KEY,
    ),
    "endpoint_ages": View(
        lambda b, _, __: views.endpoint_ages(_databases(b), time.time()), views.AGES_VIEW_KEY
    ),
    "oldest_waiting": View(
        lambda b, _, __: stored_views.oldest_waiting(_databases(b), time.time()),
        stored_views.WAITING_VIEW_KEY,
    ),
    "queues": View(lambda b, _, __: _queues(b), ("database", "queue")),
    "routes": View(lambda b, _, __: views.routes(_databases(b)), ("database", "name")),
    "databases": View(lambda b, _, __: views.databases(_databases(b)), ("database",)),
    "broker_connections": View(lambda b, _, __: b.transport.broker_connections(), None),
    "stats": View(lambda b, _, __: _stats(b), None),
    "activation": View(lambda b, _, __: b.activation.view(), ("database", "queue")),
    "mirrors": View(lambda b, _, __: b.engine.router.mirrors_view(), None),
    "mirroring": View(lambda b, _, __: b.mirroring.view(), None),
    "quarantined": View(
        lambda b, _, __: b.engine.poison.view(), ("database", "conversation_handle")
    ),
    "drops": View(lambda b, _, __: [{"reason": r} for r in b.engine.stats.drop_reasons], None),
}


def page_request(meta: Mapping[str, Any]) -> PageRequest:
    """The page a ``view`` request asks for; InvalidRequest if ``after`` or ``limit`` is
    not one."""
    after = meta.get("after") or ""
    if not isinstance(after, str) or len(after) > MAX_CURSOR:
        raise InvalidRequest(f"after must be a cursor (a string of at most {MAX_CURSOR})")
    limit = meta.get("limit", DEFAULT_PAGE)
    if limit is None:
        limit = DEFAULT_PAGE
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be a whole number from 1 to {MAX_PAGE}")
    return PageRequest(after, limit)


def encode_page(
    rows: Sequence[Mapping[str, Any]],
    key: tuple[str, ...] | None,
    request: PageRequest,
    max_bytes: int = MAX_PAGE_BYTES,
) -> tuple[bytes, int, str | None]:
    """The page of ``rows`` (any order) that ``request`` asks for, as a JSON array: its
    bytes, its row count and the cursor of the page after it (None if it is the last).
    It stops at ``limit`` rows or before ``max_bytes``, whichever comes first."""
    keyed = [
        (row_key(row, key) if key is not None else key_part(i), row) for i, row in enumerate(rows)
    ]
    chosen = smallest_after(keyed, lambda pair: pair[0], request)
    parts: list[bytes] = []
    size = 2
    for _, row in chosen[: request.limit]:
        part = orjson.dumps(row, default=str)
        if parts and size + len(part) + 1 > max_bytes:
            break
        parts.append(part)
        size += len(part) + 1
    more = len(parts) < len(chosen)
    cursor = chosen[len(parts) - 1][0] if more else None
    return b"[" + b",".join(parts) + b"]", len(parts), cursor


async def view(broker: ViewedBroker, meta: Mapping[str, Any]) -> tuple[dict[str, Any], bytes]:
    """The ``view`` op: one page of the view ``meta["name"]``."""
    name = meta_str(dict(meta), "name")
    source = VIEWS.get(name)
    if source is None:
        raise InvalidRequest(f"unknown view {name!r}; views: {', '.join(sorted(VIEWS))}")
    request = page_request(meta)
    rows = source.rows(broker, request, meta)
    if isinstance(rows, Awaitable):
        rows = await rows
    # In the body, not the meta: a page may be larger than a meta's 1 MiB.
    body, count, cursor = encode_page(rows, source.key, request)
    reply: dict[str, Any] = {"rows_in_body": count}
    if cursor is not None:
        reply["next"] = cursor
    return reply, body
