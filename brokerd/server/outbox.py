"""What one broker connection has to send, as typed items, drained by its pump.

Owns the order of a connection's outgoing frames (R-DLG-7): single-fragment
messages, acknowledgements, forwarded messages and principal queries go first
(``small``); the fragments of large messages go one per pump round (``bulk``),
so a small message never waits behind a large one. Consecutive acknowledgement
items are merged into one ACK frame when the pump builds them. A fragment of a large
message waits there once: a retransmission of its message due while it waits (its
retry clock started when its first fragments were written) queues only the
fragments that are not waiting (R-DLG-6), or each would go on the wire twice.

What the peer's own frames make us send is bounded while the peer does not read
(its socket full, the pump stopped): an endpoint has at most one acknowledgement
waiting for the far broker instance it names, the newest (it says what the older said,
except what falls beyond a header's bounds on acknowledged ranges, which costs a
retransmission); at most
:data:`MAX_QUEUED_ERRORS` broker errors wait, and at most :data:`MAX_QUEUED_ANSWERS`
answers (principal answers, to its principal queries or telling it that a mirror got
its message, and :class:`MirrorAnswer` refusals of its mirroring messages); one more of
either is dropped and counted (``errors_dropped``, ``answers_dropped``). None of it
loses anything: one acknowledgement may cover several fragments (R-DLG-5), a sender
retransmits what it has no acknowledgement of (R-DLG-6), a sender asks a mirrored pair
again while it uses it (R-ROUTE-15), and a mirror attaches again; each is answered
again.

May import: ``protocol``, ``brokerd.routing``, ``brokerd.dialogs.transmission.links``.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass

from brokerd.dialogs.transmission.links import SendAcks, SendFragment, SendHeader
from brokerd.routing.forwarding import Forward
from protocol import dialog, events


@dataclass(frozen=True, slots=True)
class MirrorAnswer:
    """A MIRROR frame that answers one of the peer's (a refusal), sent as
    ``events.Mirror(payload)``: it waits under the bound of answers, where a Mirror the
    daemon sends of its own (units, a copy of a file) is never dropped."""

    payload: bytes


Item = (
    SendFragment
    | SendAcks
    | SendHeader
    | Forward
    | events.PrincipalQuery
    | events.PrincipalAnswer
    | events.Mirror
    | MirrorAnswer
)


MAX_QUEUED_ERRORS = 1024
"""Broker errors (answers to refused messages) that may wait for one connection."""

MAX_QUEUED_ANSWERS = 1024
"""Answers (principal answers, mirroring refusals) that may wait for one connection."""


_ANSWERS = (events.PrincipalAnswer, MirrorAnswer)

AckKey = tuple[uuid.UUID, bool, uuid.UUID, uuid.UUID | None]
"""An acknowledgement's endpoint on the connection: its conversation, whether it is the
initiator's, the broker instance that sends it and the far broker instance it is for
(R-ROUTE-3). Two databases of this instance may each hold an endpoint of one conversation
id and direction (two broker instances of one service), talking to two far instances over
one connection: their acknowledgements are never merged."""


def ack_key(header: dialog.DialogHeader) -> AckKey:
    """The endpoint and far broker instance an acknowledgement is of (:data:`AckKey`)."""
    return (
        header.conversation_id,
        header.initiator,
        header.from_broker_instance,
        header.to_broker_instance,
    )


class Outbox:
    """The two queues of one connection."""

    __slots__ = (
        "_acks",
        "_answers",
        "_errors",
        "_waiting",
        "answers_dropped",
        "bulk",
        "errors_dropped",
        "small",
    )

    def __init__(self) -> None:
        self.small: deque[Item] = deque()
        self.bulk: deque[SendFragment] = deque()
        self._waiting: set[tuple[int, int]] = set()
        """The fragments ``bulk`` holds, by their message's id and index (an item holds its
        message, so the id is not reused while it waits)."""
        self._acks: dict[AckKey, tuple[list[dialog.DialogHeader], int]] = {}
        """Each acknowledgement waiting: the list of the item it is in, and its place there."""
        self._errors = 0
        self.errors_dropped = 0
        self._answers = 0
        self.answers_dropped = 0

    def __bool__(self) -> bool:
        return bool(self.small or self.bulk)

    @property
    def queued_acks(self) -> int:
        """Acknowledgements waiting to be sent (one at most per endpoint)."""
        return len(self._acks)

    def add(self, item: Item) -> bool:
        """Queue ``item``; False if it is a fragment of a large message that waits here
        already, or an error or answer beyond its bound (nothing queued)."""
        if type(item) is SendFragment and item.msg.fragment_count > 1:
            key = (id(item.msg), item.fragment)
            if key in self._waiting:
                return False
            self._waiting.add(key)
            self.bulk.append(item)
            return True
        if type(item) is SendHeader:
            if self._errors >= MAX_QUEUED_ERRORS:
                self.errors_dropped += 1
                return False
            self._errors += 1
        elif type(item) in _ANSWERS:
            if self._answers >= MAX_QUEUED_ANSWERS:
                self.answers_dropped += 1
                return False
            self._answers += 1
        self.small.append(item)
        return True

    def add_acks(self, headers: list[dialog.DialogHeader]) -> None:
        """Queue acknowledgements; one replaces the acknowledgement of the same endpoint
        for the same far broker instance still waiting, in its place (:func:`ack_key`)."""
        small = self.small
        waiting = self._acks
        for header in headers:
            key = ack_key(header)
            place = waiting.get(key)
            if place is not None:
                place[0][place[1]] = header
                continue
            tail = small[-1] if small else None
            if type(tail) is not SendAcks or len(tail.headers) >= dialog.MAX_ACKS_PER_FRAME:
                tail = SendAcks([])
                small.append(tail)
            waiting[key] = (tail.headers, len(tail.headers))
            tail.headers.append(header)

    def pop(self) -> Item:
        """The next item: small ones first, then one fragment of a large message."""
        if not self.small:
            fragment = self.bulk.popleft()
            self._waiting.discard((id(fragment.msg), fragment.fragment))
            return fragment
        item = self.small.popleft()
        if type(item) is SendHeader:
            self._errors -= 1
        elif type(item) in _ANSWERS:
            self._answers -= 1
        elif isinstance(item, SendAcks):  # no longer waiting: a newer one queues anew
            self._forget(item.headers)
        return item

    def take_acks(self, first: SendAcks) -> list[dialog.DialogHeader]:
        """``first`` and the acknowledgement items right behind it, up to one frame's worth."""
        headers = list(first.headers)
        small = self.small
        while small and type(small[0]) is SendAcks:
            more = small[0]
            assert isinstance(more, SendAcks)
            if len(headers) + len(more.headers) > dialog.MAX_ACKS_PER_FRAME:
                break
            headers += more.headers
            small.popleft()
            self._forget(more.headers)
        return headers

    def _forget(self, headers: list[dialog.DialogHeader]) -> None:
        waiting = self._acks
        for header in headers:
            del waiting[ack_key(header)]

    def forwards(self) -> list[Forward]:
        """Forwarded messages not sent yet (handed back when the connection is lost)."""
        return [item for item in self.small if type(item) is Forward]

    def clear(self) -> None:
        self.small.clear()
        self.bulk.clear()
        self._waiting.clear()
        self._acks.clear()
        self._errors = 0
        self._answers = 0
