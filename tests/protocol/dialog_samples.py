"""Dialog headers for the dialog codec's tests: a user message, a dedicated
acknowledgement, and their payloads built with ``construct`` directly (bypassing the
codec's checks)."""

from __future__ import annotations

import uuid
from typing import Any

from protocol import dialog
from protocol.dialog import (
    DIALOG_HEADER,
    FRAGMENT_PAYLOAD,
    Acknowledgement,
    DialogHeader,
    MessageFlags,
    to_construct_value,
)

U64 = 2**64 - 1
U32 = 2**32 - 1

CONV = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
BROKER_A = uuid.UUID("11111111-2222-3333-4444-555555555555")
BROKER_B = uuid.UUID("66666666-7777-8888-9999-aaaaaaaaaaaa")
SEQ = MessageFlags.SEQUENCED
INIT = MessageFlags.INITIATOR


def user_message(body: bytes = b"<order id='1'/>", **kw: Any) -> DialogHeader:
    """A plain, single-fragment, sequenced user message from the initiator."""
    fields: dict[str, Any] = dict(
        conversation_id=CONV,
        from_service="//alpha/Initiator",
        to_service="//beta/Target",
        from_broker_instance=BROKER_A,
        contract="//brokerd/Contract",
        message_type="//brokerd/Request",
        flags=INIT | SEQ,
        sequence_number=1,
        message_length=len(body),
    )
    fields.update(kw)
    return DialogHeader(**fields)


def ack_header(ack: Acknowledgement, **kw: Any) -> DialogHeader:
    """A dedicated acknowledgement (unsequenced, no content), target -> initiator."""
    fields: dict[str, Any] = dict(
        conversation_id=CONV,
        from_service="//beta/Target",
        to_service="//alpha/Initiator",
        from_broker_instance=BROKER_B,
        to_broker_instance=BROKER_A,
        flags=MessageFlags.NONE,
        ack=ack,
    )
    fields.update(kw)
    return DialogHeader(**fields)


def raw_fragment(h: DialogHeader, body: bytes) -> bytes:
    """A FRAGMENT payload built with construct directly, bypassing validate_header."""
    header = DIALOG_HEADER.build(to_construct_value(h))
    return FRAGMENT_PAYLOAD.build(dict(header=header, body=body))


def raw_acks(headers: list[DialogHeader]) -> bytes:
    return dialog.ACK_PAYLOAD.build(
        dict(headers=[DIALOG_HEADER.build(to_construct_value(h)) for h in headers])
    )
