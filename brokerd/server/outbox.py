"""What one broker connection has to send, as typed items, drained by its pump.

Owns the order of a connection's outgoing frames (R-DLG-7): single-fragment
messages, acknowledgements, forwarded messages and principal queries go first
(``small``); the fragments of large messages go one per pump round (``bulk``),
so a small message never waits behind a large one. Consecutive acknowledgement
items are merged into one ACK frame when the pump builds them.

May import: ``protocol``, ``brokerd.routing``, ``brokerd.dialogs.transmission.links``.
"""

from __future__ import annotations

from collections import deque

from brokerd.dialogs.transmission.links import SendAcks, SendFragment, SendHeader
from brokerd.routing.forwarding import Forward
from protocol import dialog, events

Item = (
    SendFragment
    | SendAcks
    | SendHeader
    | Forward
    | events.PrincipalQuery
    | events.PrincipalAnswer
    | events.Mirror
)


class Outbox:
    """The two queues of one connection."""

    __slots__ = ("bulk", "small")

    def __init__(self) -> None:
        self.small: deque[Item] = deque()
        self.bulk: deque[SendFragment] = deque()

    def __bool__(self) -> bool:
        return bool(self.small or self.bulk)

    def add(self, item: Item) -> None:
        if type(item) is SendFragment and item.msg.fragment_count > 1:
            self.bulk.append(item)
        else:
            self.small.append(item)

    def add_acks(self, headers: list[dialog.DialogHeader]) -> None:
        step = dialog.MAX_ACKS_PER_FRAME
        for start in range(0, len(headers), step):
            self.small.append(SendAcks(headers[start : start + step]))

    def pop(self) -> Item:
        """The next item: small ones first, then one fragment of a large message."""
        return self.small.popleft() if self.small else self.bulk.popleft()

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
        return headers

    def forwards(self) -> list[Forward]:
        """Forwarded messages not sent yet (handed back when the connection is lost)."""
        return [item for item in self.small if type(item) is Forward]

    def clear(self) -> None:
        self.small.clear()
        self.bulk.clear()
