"""One database of an instance: its store, catalog, endpoints and ready-message index.

Owns the in-memory image of a database (R-DLG-13): the conversation endpoints
keyed by handle and by (conversation id, role), the index of messages ready to
RECEIVE per queue and conversation group (status 1, R-OBJ-3), and the recovery
that rebuilds all of it from the SQLite file after a restart or ``kill -9``.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokerd.config import DatabaseConfig
from brokerd.dialogs.endpoint import Endpoint, OutMessage, endpoint_from_row
from brokerd.dialogs.ready import Item, ReadyIndex
from brokerd.storage.catalog import Catalog, route_from_row
from brokerd.storage.store import Store
from protocol.acks import AckState
from protocol.dialog import END_DIALOG, ERROR, MessageFlags
from protocol.fragments import fragment_count


@dataclass(eq=False)
class Lease:
    """Messages taken by a RECEIVE, with their group's lock, until commit or rollback."""

    db: Database
    queue: str
    index: ReadyIndex
    group: uuid.UUID
    items: list[Item]
    retention: bool
    locks: bool = True
    """False when the caller's transaction already held the group (it unlocks it once)."""
    released: bool = False


Fetch = Callable[[str, Sequence[Any]], Awaitable[Iterable[Any]]]
"""Runs a query and returns its rows: the store's start-up read, or a connection's."""

_END_FLAGS = {
    END_DIALOG: int(MessageFlags.END_DIALOG | MessageFlags.SEQUENCED),
    ERROR: int(MessageFlags.ERROR | MessageFlags.SEQUENCED),
}


class Database:
    def __init__(self, config: DatabaseConfig, data_dir: Path) -> None:
        self.config = config
        self.name = config.name
        self.store = Store(data_dir / f"{config.name}.sqlite", config.name)
        self.catalog = Catalog.from_config(config)
        self.broker_instance = uuid.UUID(int=0)
        self.endpoints: dict[uuid.UUID, Endpoint] = {}
        self.by_key: dict[tuple[uuid.UUID, bool], Endpoint] = {}
        self.ready: dict[str, ReadyIndex] = {name: ReadyIndex() for name in self.catalog.queues}
        self.next_local_seq = -1
        """Sequence number of the next message this broker queues itself (a broker error,
        a DialogTimer): -1, -2, ... so it never meets a dialog's own numbers."""
        self.rx_suspended = False
        self.mirror_role: str | None = config.mirror_role
        """``principal``, ``mirror`` or None (not mirrored), R-ROUTE-10; swapped by failover."""

    async def open(self) -> None:
        self.broker_instance = await self.store.open(self.config.broker_instance)
        await self.store.execute_now(self.catalog.persist())
        for row in await self.store.fetchall("SELECT * FROM routes WHERE source = 'admin'"):
            route = route_from_row(row)
            self.catalog.routes[route.name] = route
        if self.config.mirror_role is not None:
            rows = await self.store.fetchall("SELECT value FROM meta WHERE key = 'mirror_role'")
            self.mirror_role = str(rows[0][0]) if rows else self.config.mirror_role

    def add_endpoint(self, ep: Endpoint) -> None:
        self.endpoints[ep.handle] = ep
        self.by_key[ep.key] = ep

    def remove_endpoint(self, ep: Endpoint) -> None:
        self.endpoints.pop(ep.handle, None)
        if self.by_key.get(ep.key) is ep:
            del self.by_key[ep.key]

    def queue_of(self, service: str) -> str | None:
        info = self.catalog.services.get(service)
        return info.queue if info else None

    async def recover(self, fragment_size: int) -> list[Endpoint]:
        """Rebuild endpoints, unacknowledged messages and the ready index from the file.

        Returns the endpoints that have messages waiting to be transmitted.
        """
        store = self.store
        for row in await store.fetchall("SELECT * FROM conversation_endpoints"):
            self.add_endpoint(endpoint_from_row(row, self.name))
        waiting: dict[uuid.UUID, Endpoint] = {}
        for row in await store.fetchall(
            "SELECT * FROM transmission_queue ORDER BY conversation_handle, message_sequence_number"
        ):
            ep = self.endpoints.get(uuid.UUID(row["conversation_handle"]))
            if ep is None:
                continue
            body = bytes(row["body"])
            seq = int(row["message_sequence_number"])
            ep.outbox[seq] = OutMessage(
                seq=seq,
                message_type=row["message_type"],
                flags=int(row["flags"]),
                body=body,
                enqueued_at=float(row["enqueued_at"]),
                fragment_count=fragment_count(len(body), fragment_size),
                status="waiting to be sent (recovered after a restart)",
            )
            waiting[ep.handle] = ep
        await self.load_received(store.fetchall)
        for row in await store.fetchall("SELECT conversation_handle, due FROM conversation_timers"):
            timed = self.endpoints.get(uuid.UUID(row["conversation_handle"]))
            if timed is not None:
                timed.timer_due = float(row["due"])
        for ep in self.endpoints.values():
            if ep.accepted.through or ep.accepted.beyond or ep.accepted.fragments:
                ep.mark_ack_needed()
        return [ep for ep in waiting.values() if ep.outbox]

    async def load_received(self, fetch: Fetch) -> None:
        """Set what every endpoint has received, and the ready index, from the file.

        Used by recovery and after a failed receive-side write, when memory may
        claim messages that never committed. Endpoints started by a peer whose
        first message never committed are forgotten (the peer retransmits).
        """
        stored = {
            uuid.UUID(row[0]): int(row[1])
            for row in await fetch(
                "SELECT conversation_handle, receive_sequence FROM conversation_endpoints", ()
            )
        }
        received: dict[uuid.UUID, AckState] = {}
        for ep in list(self.endpoints.values()):
            through = stored.get(ep.handle)
            if through is None:
                if not ep.initiator:
                    self.remove_endpoint(ep)
                continue
            received[ep.handle] = AckState(through)
            ep.held_end_flags.clear()
        for row in await fetch(
            "SELECT conversation_handle, message_sequence_number, message_type "
            "FROM queue_messages WHERE status = 2 AND body IS NOT NULL",
            (),
        ):
            handle, seq = uuid.UUID(row[0]), int(row[1])
            if handle in received:
                received[handle].beyond.add(seq)
                flags = _END_FLAGS.get(row[2], 0)
                if flags:
                    self.endpoints[handle].held_end_flags[seq] = flags
        for row in await fetch(
            "SELECT conversation_handle, message_sequence_number, fragment_index "
            "FROM message_fragments",
            (),
        ):
            handle = uuid.UUID(row[0])
            if handle in received:
                received[handle].fragments.setdefault(int(row[1]), set()).add(int(row[2]))
        for handle, state in received.items():
            ep = self.endpoints[handle]
            ep.accepted, ep.durable = state, state.copy()
        for index in self.ready.values():
            index.clear()
        for row in await fetch(
            "SELECT queue_name, conversation_group_id, conversation_handle, "
            "message_sequence_number FROM queue_messages WHERE status = 1 ORDER BY rowid",
            (),
        ):
            ready = self.ready.get(row[0])
            if ready is not None:
                ready.add(uuid.UUID(row[1]), uuid.UUID(row[2]), int(row[3]))
        low = list(await fetch("SELECT MIN(message_sequence_number) FROM queue_messages", ()))
        if low and low[0][0] is not None and int(low[0][0]) < 0:
            self.next_local_seq = int(low[0][0]) - 1
