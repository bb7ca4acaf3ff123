"""A run of messages of one conversation that arrived in order, stored by one job, and
what happens once that job commits (R-DLG-5: each is acknowledged only then).

May import what ``brokerd.dialogs.arrivals.receiving`` may import.
"""

from __future__ import annotations

import logging
from typing import Protocol

from brokerd.dialogs.arrivals.delivery import Delivery
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.endpoints.events import DialogEvents
from brokerd.dialogs.endpoints.states import DELIVERING
from brokerd.dialogs.router.router import Router
from brokerd.dialogs.transmission.transmission import Transmission
from brokerd.storage.catalog import ROUTE_REQUESTER_SERVICE

log = logging.getLogger("brokerd.dialogs.receiving")


class Receiver(Protocol):
    """What a run needs of the arrivals part that made it."""

    last_run: InOrderRun | None
    events: DialogEvents
    delivery: Delivery
    router: Router
    transmission: Transmission


class InOrderRun:
    """Messages of one conversation that arrived in order and are stored by one job: what
    runs after its commit (each message is acknowledged only then, R-DLG-5).

    The run is its own commit callback (calling it is :meth:`committed`): the store knows
    the run's part of a joined job by that one object (:meth:`Store.join_last` compares by
    identity). A bound method kept on the run instead made a reference cycle per run,
    freed only by the cyclic garbage collector: with many dialogs (W4) a run a message,
    and the receiving daemon's young collections took four times the sender's
    (docs/performance.md, "No reference cycle per message received (W4)")."""

    __slots__ = ("db", "ep", "index", "queue", "receiving", "seqs")

    def __init__(
        self, receiving: Receiver, db: Database, ep: Endpoint, queue: str, seqs: list[int]
    ) -> None:
        self.receiving = receiving
        self.db = db
        self.ep = ep
        self.queue = queue
        self.index = db.ready.get(queue)
        self.seqs = seqs

    def __call__(self) -> None:
        self.committed()

    def committed(self) -> None:
        ep, seqs, receiving = self.ep, self.seqs, self.receiving
        if receiving.last_run is self:
            receiving.last_run = None  # nothing joins a committed run
        durable = ep.durable
        for seq in seqs:
            durable.add_message(seq)
        receiving.events.arrival_committed(ep)
        if ep.state not in DELIVERING:  # an END committed with them or before (R-DLG-10)
            receiving.events.discarded(
                ep, seqs, "this side has ended the conversation", received=True
            )
        else:
            receiving.delivery.delivered(self.db, ep, self.queue, self.index, seqs, False)
        if ep.ended_remote and ep.service == ROUTE_REQUESTER_SERVICE:
            receiving.router.request_ended(ep)
        receiving.transmission.ack_needed(ep)

    def failed(self, exc: BaseException) -> None:
        log.error("store error while receiving into %s: %s", self.db.name, exc)
        self.receiving.delivery.suspend_receiving(self.db)
