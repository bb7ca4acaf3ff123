"""What RECEIVE returns: one :class:`ReceivedMessage` per row."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from protocol.dialog import DIALOG_TIMER, END_DIALOG, ERROR


@dataclass(frozen=True)
class ReceivedMessage:
    """One row of RECEIVE's result set."""

    conversation_handle: uuid.UUID
    conversation_group_id: uuid.UUID
    message_sequence_number: int
    service_name: str
    service_contract_name: str
    message_type_name: str
    message_body: bytes
    queue: str
    message_enqueue_time: float

    @property
    def is_end_dialog(self) -> bool:
        return self.message_type_name == END_DIALOG

    @property
    def is_error(self) -> bool:
        return self.message_type_name == ERROR

    @property
    def is_timer(self) -> bool:
        return self.message_type_name == DIALOG_TIMER


def parse_received(meta: dict[str, Any], body: bytes) -> list[ReceivedMessage]:
    """RECEIVE's rows: the metadata of each, their bodies one after another in ``body``."""
    out: list[ReceivedMessage] = []
    offset = 0
    for row in meta.get("messages", []):
        length = int(row["body_length"])
        out.append(
            ReceivedMessage(
                conversation_handle=uuid.UUID(row["conversation_handle"]),
                conversation_group_id=uuid.UUID(row["conversation_group_id"]),
                message_sequence_number=int(row["message_sequence_number"]),
                service_name=row["service_name"],
                service_contract_name=row["service_contract_name"],
                message_type_name=row["message_type_name"],
                message_body=body[offset : offset + length],
                queue=row["queue"],
                message_enqueue_time=float(row["message_enqueue_time"]),
            )
        )
        offset += length
    return out
