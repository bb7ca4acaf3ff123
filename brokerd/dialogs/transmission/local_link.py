"""The link between databases of one instance: no network, the same dialog rules.

A fragment for a service of this instance goes through :class:`LocalLink` as it
would through a connection: queued, built when the link drains, acknowledged
(R-ROUTE-1's ``LOCAL`` address and the ``AutoCreatedLocal`` route).

May import: ``protocol``, ``brokerd.dialogs`` models; the engine only through
:class:`LocalDelivery`.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, NamedTuple, Protocol

from brokerd.dialogs.endpoints.binding import LOCAL
from brokerd.dialogs.transmission.links import Link, SendAcks, SendHeader
from protocol.dialog import DialogHeader
from protocol.events import PrincipalAnswer, PrincipalQuery

if TYPE_CHECKING:
    from brokerd.dialogs.endpoints.database import Database
    from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage
    from brokerd.routing.forwarding import Forward


class LocalDelivery(Protocol):
    """What the local link needs of the dialog engine."""

    databases: dict[str, Database]
    by_instance: dict[uuid.UUID, Database]

    def on_local_fragments(
        self,
        link: Link,
        sender: Endpoint,
        pieces: list[tuple[OutMessage, int]],
        db: Database | None,
    ) -> None: ...

    def on_fragment(
        self, link: Link, header: DialogHeader, body: bytes, db: Database | None = None
    ) -> None: ...

    def on_acks(self, link: Link, headers: list[DialogHeader]) -> None: ...

    def transmit(self, ep: Endpoint) -> None: ...


class _LocalFragment(NamedTuple):
    ep: Endpoint
    msg: OutMessage
    fragment: int
    database: str | None
    """The target database the sender's routing chose (None: route it on arrival)."""


class LocalLink:
    """Delivery between databases of this instance."""

    name = "local"
    identity = LOCAL
    is_open = True
    status = "delivered inside this instance"

    def __init__(self, engine: LocalDelivery) -> None:
        self._engine = engine
        self._items: list[_LocalFragment | SendAcks | SendHeader] = []
        self._scheduled = False
        self._closed = False

    def close(self) -> None:
        """At shutdown, before the stores close: what is still queued here is dropped. It
        is all in memory and redone after the restart (committed messages are sent
        again, R-DLG-6, and a resent message is acknowledged again, R-DLG-4)."""
        self._closed = True
        self._items = []

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def queue_fragment(self, ep: Endpoint, msg: OutMessage, index: int) -> bool:
        target = ep.route.database if ep.route is not None else None
        self._items.append(_LocalFragment(ep, msg, index, target))
        self._schedule()
        return True

    def queue_acks(self, headers: list[DialogHeader]) -> None:
        self._items.append(SendAcks(headers))
        self._schedule()

    def queue_header(self, header: DialogHeader, body: bytes) -> None:
        self._items.append(SendHeader(header, body))
        self._schedule()

    def want(self, ep: Endpoint) -> None:
        self._engine.transmit(ep)

    def forward(self, item: Forward) -> None:
        raise AssertionError("nothing is forwarded inside the instance")

    def may_hold(self, size: int, limit: int) -> bool:
        return False  # nothing is forwarded inside the instance

    def send_control(self, event: PrincipalQuery | PrincipalAnswer) -> None:
        pass  # every database here answers for itself

    def redial(self, reason: str) -> None:
        pass  # no connection to lose inside the instance

    def _flush(self) -> None:
        self._scheduled = False
        if self._closed:
            return
        items, self._items = self._items, []
        engine = self._engine
        sender: Endpoint | None = None
        target: str | None = None
        pieces: list[tuple[OutMessage, int]] = []
        """The fragments of one sender for one target queued one after the other: handed
        over together (:meth:`LocalDelivery.on_local_fragments`)."""
        for item in items:
            if type(item) is _LocalFragment:
                if pieces and (item.ep is not sender or item.database != target):
                    self._hand_over(sender, target, pieces)
                    pieces = []
                sender, target = item.ep, item.database
                pieces.append((item.msg, item.fragment))
                continue
            if pieces:
                self._hand_over(sender, target, pieces)
                pieces = []
            if type(item) is SendHeader:
                header, body = item
                to = header.to_broker_instance
                engine.on_fragment(self, header, body, engine.by_instance.get(to) if to else None)
            elif type(item) is SendAcks:
                engine.on_acks(self, item.headers)
        if pieces:
            self._hand_over(sender, target, pieces)

    def _hand_over(
        self, sender: Endpoint | None, target: str | None, pieces: list[tuple[OutMessage, int]]
    ) -> None:
        assert sender is not None
        engine = self._engine
        db = engine.databases.get(target) if target else None
        engine.on_local_fragments(self, sender, pieces, db)
