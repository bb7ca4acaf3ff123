"""The daemon's admin views as typed rows: one frozen dataclass per view, read from the
rows the daemon sends (``BrokerClient.view`` gives the same rows as dictionaries).

Handles and ids are ``uuid.UUID``, times ``datetime`` in UTC (None where the daemon
says none), counts ``int``. A column the daemon adds later is ignored; one the row
lacks is a :class:`~protocol.errors.RemoteProtocolError` naming the view and column.
"""

from __future__ import annotations

import dataclasses
import typing
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

from protocol.errors import RemoteProtocolError

Row = TypeVar("Row")


@dataclasses.dataclass(frozen=True, slots=True)
class ConversationEndpoint:
    """A row of ``conversation_endpoints`` (``sys.conversation_endpoints``, R-PROTO-4)."""

    database: str
    conversation_handle: uuid.UUID
    conversation_id: uuid.UUID
    conversation_group_id: uuid.UUID
    is_initiator: bool
    service: str
    far_service: str
    far_broker_instance: uuid.UUID | None
    bound_to: str
    """The adjacent broker the endpoint accepts its far side's frames from (R-DLG-14)."""
    secured: bool
    contract: str
    state: str
    """SPEC §5: SO, SI, CO, DI, DO, ER or CD."""
    lifetime: datetime | None
    """When the dialog's lifetime passes (R-DLG-9)."""
    dialog_timer: datetime | None
    """When this side's conversation timer fires (R-DLG-11)."""
    route: str
    send_sequence: int
    receive_sequence: int
    unacknowledged: int


@dataclasses.dataclass(frozen=True, slots=True)
class TransmissionQueueEntry:
    """A row of ``transmission_queue`` (``sys.transmission_queue``): a message sent and
    not yet acknowledged, or held for a queue that is off (R-DLG-12)."""

    database: str
    conversation_handle: uuid.UUID
    to_service: str
    to_broker_instance: uuid.UUID | None
    message_sequence_number: int
    message_type: str
    is_conversation_error: bool
    is_end_of_dialog: bool
    size: int
    enqueued_at: datetime | None
    attempts: int
    transmission_status: str
    """Why it waits, in words (R-ROUTE-13)."""


@dataclasses.dataclass(frozen=True, slots=True)
class QueueInfo:
    """A row of ``queues``."""

    database: str
    queue: str
    status: str
    """``on`` or ``off`` (R-DLG-12)."""
    retention: bool
    ready_messages: int
    readers: int
    """RECEIVEs and GET CONVERSATION GROUPs waiting on it, and groups held by a reader."""
    poison_message_handling: str
    poison_rollbacks: int
    quarantined_conversations: int


@dataclasses.dataclass(frozen=True, slots=True)
class RouteInfo:
    """A row of ``routes`` (``sys.routes``, R-OBJ-5)."""

    database: str
    name: str
    remote_service_name: str
    broker_instance: uuid.UUID | None
    address: str
    mirror_address: str
    lifetime: datetime | None
    expired: bool
    source: str
    """Where the route comes from: the configuration, the store, or the broker itself."""


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerConnection:
    """A row of ``broker_connections``: one adjacent-broker connection."""

    peer: str
    address: str
    direction: str
    state: str
    encrypted: bool
    login_time: datetime | None
    last_activity: datetime | None
    frames_sent: int
    frames_received: int
    bytes_sent: int
    bytes_received: int
    fragments_sent: int
    """Dialog message fragments sent (R-PROTO-3; a frame may carry several)."""
    fragments_received: int
    """Dialog message fragments received (R-PROTO-3; a frame may carry several)."""
    corrupted_messages: int
    acknowledgements_waiting: int
    """Acknowledgements queued for the peer and not written yet (one at most per endpoint)."""
    broker_errors_dropped: int
    """Answers to refused messages dropped while the peer read nothing (R-PROTO-3)."""
    answers_dropped: int
    """Answers to the peer's principal queries and mirroring messages dropped while the
    peer read nothing (R-PROTO-3, R-ROUTE-10)."""
    retransmit_timeout: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class QueueMessage:
    """A row of ``queue_messages``: one message stored in a queue, with SQL Server's
    queue ``status`` (0 received and retained, 1 ready, 2 not yet complete, 3 sent and
    retained; R-OBJ-3)."""

    database: str
    queue: str
    conversation_handle: uuid.UUID
    conversation_group_id: uuid.UUID
    message_sequence_number: int
    status: int
    status_text: str
    service: str
    message_type: str
    size: int
    enqueued_at: datetime | None
    quarantined: bool
    """Set aside by poison-message handling: ``status`` stays 1 (ready), as SQL Server's
    would, but no RECEIVE hands the message out until the quarantine is released."""


@dataclasses.dataclass(frozen=True, slots=True)
class EndpointAge:
    """A row of ``endpoint_ages``: how many endpoints of one state are how old."""

    database: str
    state: str
    age_rank: int
    age: str
    endpoints: int
    oldest_created_at: datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class OldestWaiting:
    """A row of ``oldest_waiting``: a conversation's oldest message still waiting."""

    database: str
    conversation_handle: uuid.UUID
    waiting_in: str
    waiting: int
    oldest_sequence_number: int
    oldest_enqueued_at: datetime | None
    age_seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class QuarantinedConversation:
    """A row of ``quarantined`` (SPEC §6): a conversation set aside because one of its
    messages was rolled back ``rollbacks`` times, the last time for ``last_error``."""

    database: str
    queue: str
    conversation_handle: uuid.UUID
    conversation_id: uuid.UUID
    conversation_group_id: uuid.UUID
    service: str
    far_service: str
    state: str
    message_sequence_number: int
    message_type: str
    rollbacks: int
    last_error: str
    quarantined_at: datetime | None
    messages_set_aside: int


def _uuid(value: Any) -> uuid.UUID:
    return uuid.UUID(str(value))


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: convert(value) if value not in (None, "") else None


_CONVERTERS: dict[Any, Callable[[Any], Any]] = {
    str: str,
    int: int,
    float: float,
    bool: bool,
    uuid.UUID: _uuid,
    uuid.UUID | None: _optional(_uuid),
    datetime | None: _time,
    float | None: _optional(float),
}


_FIELDS: dict[type[Any], tuple[tuple[str, Callable[[Any], Any]], ...]] = {}


def _fields(cls: type[Any]) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    """Each field's name and converter, worked out once per class."""
    fields = _FIELDS.get(cls)
    if fields is None:
        hints = typing.get_type_hints(cls)
        fields = tuple((f.name, _CONVERTERS[hints[f.name]]) for f in dataclasses.fields(cls))
        _FIELDS[cls] = fields
    return fields


def typed(cls: type[Row], view: str, rows: Iterable[dict[str, Any]]) -> list[Row]:
    """The rows of ``view`` as ``cls``; RemoteProtocolError if a row lacks a column or
    holds a value of the wrong kind."""
    fields = _fields(cls)
    out = []
    for row in rows:
        try:
            out.append(cls(**{name: convert(row[name]) for name, convert in fields}))
        except KeyError as exc:
            raise RemoteProtocolError(f"view {view!r}: a row lacks column {exc}") from None
        except (TypeError, ValueError) as exc:
            raise RemoteProtocolError(f"view {view!r}: a row holds a bad value: {exc}") from None
    return out
