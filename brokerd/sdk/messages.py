"""What RECEIVE returns (one :class:`ReceivedMessage` per row) and what GET CONVERSATION
GROUP returns (:func:`parse_group`). The admin views' rows are in ``views.py``."""

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
        """The other side ended the conversation (an EndDialog message, R-DLG-10)."""
        return self.message_type_name == END_DIALOG

    @property
    def is_error(self) -> bool:
        """An Error message: the conversation was ended with an error (R-DLG-10)."""
        return self.message_type_name == ERROR

    @property
    def is_timer(self) -> bool:
        """A DialogTimer message: this side's conversation timer fired (R-DLG-11)."""
        return self.message_type_name == DIALOG_TIMER


def parse_received(meta: dict[str, Any], body: bytes | bytearray) -> list[ReceivedMessage]:
    """RECEIVE's rows: the metadata of each, their bodies one after another in ``body``.

    The rows of one RECEIVE share one conversation group, and mostly one conversation:
    each handle's text is parsed into a UUID once per reply. Each body is copied once out
    of the reply (a large reply arrives in a ``bytearray``, read in place).
    """
    out: list[ReceivedMessage] = []
    add = out.append
    uuids: dict[str, uuid.UUID] = {}
    # bytes are sliced as they are; a large reply (a bytearray, read in place) through a
    # view, released before the reply's buffer is given back for the next
    whole: bytes | memoryview = body if isinstance(body, bytes) else memoryview(body)
    offset = 0
    try:
        for row in meta.get("messages", []):
            length = int(row["body_length"])
            end = offset + length
            handle_text = row["conversation_handle"]
            handle = uuids.get(handle_text)
            if handle is None:
                handle = uuids[handle_text] = uuid.UUID(handle_text)
            group_text = row["conversation_group_id"]
            group = uuids.get(group_text)
            if group is None:
                group = uuids[group_text] = uuid.UUID(group_text)
            add(
                ReceivedMessage(
                    conversation_handle=handle,
                    conversation_group_id=group,
                    message_sequence_number=int(row["message_sequence_number"]),
                    service_name=row["service_name"],
                    service_contract_name=row["service_contract_name"],
                    message_type_name=row["message_type_name"],
                    message_body=(
                        whole[offset:end] if isinstance(whole, bytes) else bytes(whole[offset:end])
                    ),
                    queue=row["queue"],
                    message_enqueue_time=float(row["message_enqueue_time"]),
                )
            )
            offset = end
    finally:
        if isinstance(whole, memoryview):
            whole.release()
    return out


def by_group(messages: list[ReceivedMessage]) -> list[list[ReceivedMessage]]:
    """A RECEIVE's messages (of several groups, ``groups``) as one batch per conversation
    group, in the order returned: each group's messages are together and in order."""
    batches: list[list[ReceivedMessage]] = []
    for message in messages:
        if batches and batches[-1][0].conversation_group_id == message.conversation_group_id:
            batches[-1].append(message)
        else:
            batches.append([message])
    return batches


def parse_group(meta: dict[str, Any]) -> uuid.UUID | None:
    """The conversation group a GET CONVERSATION GROUP reply names (None: none came in
    time, SPEC §6)."""
    group = meta.get("conversation_group_id")
    return None if group is None else uuid.UUID(group)


class KeptMessages:
    """Messages a RECEIVE took for a caller that had stopped waiting (its task cancelled
    while the daemon's RECEIVE was taking them, too late to withdraw it), by queue and
    database: the next RECEIVE of that queue returns them first, without asking the
    daemon (R-DLG-1: outside a transaction they have left the queue already, so dropping
    them would lose them). A client closed with messages kept loses them, as a program
    that ends after a RECEIVE outside a transaction does (SPEC §6: at most once)."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str | None], list[ReceivedMessage]] = {}

    def holds(self, queue: str, database: str | None) -> bool:
        """Whether messages of ``queue`` are kept."""
        return (queue, database) in self._kept

    def add(self, queue: str, database: str | None, messages: list[ReceivedMessage]) -> None:
        if messages:
            self._kept.setdefault((queue, database), []).extend(messages)

    def take(
        self,
        queue: str,
        database: str | None,
        top: int,
        handle: uuid.UUID | None,
        group: uuid.UUID | None,
        groups: int,
    ) -> list[ReceivedMessage]:
        """What a RECEIVE of ``queue`` with these limits returns of the kept messages: at
        most ``top``, of at most ``groups`` conversation groups (one conversation's or one
        group's when limited so), group after group as the daemon returns them, each
        group's in the order they were taken."""
        kept = self._kept.get((queue, database))
        if not kept:
            return []
        matching = [
            m
            for m in kept
            if (handle is None or m.conversation_handle == handle)
            and (group is None or m.conversation_group_id == group)
        ]
        chosen = list(dict.fromkeys(m.conversation_group_id for m in matching))[:groups]
        taken: list[ReceivedMessage] = []
        for gid in chosen:
            for message in matching:
                if len(taken) < top and message.conversation_group_id == gid:
                    taken.append(message)
        picked = {id(m) for m in taken}
        left = [m for m in kept if id(m) not in picked]
        if left:
            self._kept[(queue, database)] = left
        else:
            del self._kept[(queue, database)]
        return taken
