"""The databases of one instance and the lookups every part of the engine needs.

Owns the map of databases by name and by broker instance, and finds a database by
name, service or queue, an endpoint by conversation handle, and the endpoint a header
from a link is for. Every other part is handed this one object instead of the
dictionaries.
"""

from __future__ import annotations

import uuid

from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.errors import (
    ConversationNotFound,
    DatabaseNotFound,
    DialogError,
    NotPrincipal,
    QueueNotFound,
    ServiceNotFound,
)
from protocol.dialog import DialogHeader


class Directory:
    """The databases of an instance, and lookups over them."""

    def __init__(self, databases: dict[str, Database]) -> None:
        self.databases = databases
        self.msdb = databases["msdb"]
        self.by_instance: dict[uuid.UUID, Database] = {}
        """Each database by its broker instance (filled by :meth:`start`)."""

    def start(self) -> None:
        """Index the databases by broker instance (their identities are read at open)."""
        for db in self.databases.values():
            self.by_instance[db.broker_instance] = db

    def database(self, name: str) -> Database:
        db = self.databases.get(name)
        if db is None:
            raise DatabaseNotFound(f"database {name!r} does not exist on this broker")
        return db

    def endpoint(self, handle: uuid.UUID) -> tuple[Database, Endpoint]:
        """The endpoint of conversation handle ``handle`` and its database."""
        for db in self.databases.values():
            ep = db.endpoints.get(handle)
            if ep is not None:
                return db, ep
        mirrors = [db.name for db in self.databases.values() if db.mirror_role == "mirror"]
        if mirrors:  # R-ROUTE-15: a mirror keeps no image of its conversations
            raise NotPrincipal(
                f"conversation handle {handle} is not known here, and this broker is the "
                f"mirror partner of {', '.join(repr(n) for n in mirrors)}: use the principal"
            )
        raise ConversationNotFound(f"conversation handle {handle} does not exist on this broker")

    def endpoint_for(self, header: DialogHeader) -> Endpoint | None:
        """The endpoint here that ``header``, from the far side, is for (None: none)."""
        key = (header.conversation_id, not header.initiator)
        if header.to_broker_instance is not None:
            db = self.by_instance.get(header.to_broker_instance)
            return db.by_key.get(key) if db else None
        for db in self.databases.values():
            ep = db.by_key.get(key)
            if ep is not None:
                return ep
        return None

    def database_of_service(self, service: str) -> Database:
        found = [db for db in self.databases.values() if service in db.catalog.services]
        if not found:
            raise ServiceNotFound(f"service {service!r} does not exist on this broker")
        if len(found) > 1:
            raise DialogError(
                f"service {service!r} exists in several databases "
                f"({', '.join(db.name for db in found)}); name the database"
            )
        return found[0]

    def database_of_queue(self, queue: str, database: str | None) -> Database:
        """The database of queue ``queue`` (in ``database`` if named)."""
        if database is not None:
            db = self.database(database)
            if queue not in db.catalog.queues:
                raise QueueNotFound(f"queue {queue!r} does not exist in database {db.name!r}")
            return db
        found = [db for db in self.databases.values() if queue in db.catalog.queues]
        if len(found) != 1:
            raise QueueNotFound(
                f"queue {queue!r} does not exist on this broker"
                if not found
                else f"queue {queue!r} exists in several databases; name the database"
            )
        return found[0]

    def inbound_backlog(self) -> int:
        """Bytes received from peers and not yet committed, over every database: the
        transport stops reading broker connections while it is high."""
        return sum(db.store.pending_weight for db in self.databases.values())

    def outbound_counts(self) -> dict[str, int]:
        """Where the unacknowledged messages are: objects in memory, or only numbers (a
        backlog paged in as links have room, R-DLG-13)."""
        in_memory = in_file = 0
        for db in self.databases.values():
            for ep in db.endpoints.values():
                in_memory += len(ep.outbox)
                in_file += ep.backlog.count
        return {"outbound_in_memory": in_memory, "outbound_in_file_only": in_file}
