"""The send window of a link (R-DLG-6, R-DLG-13), without I/O."""

from __future__ import annotations

from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage
from brokerd.dialogs.transmission.window import (
    BACKLOG_WINDOW_MESSAGES,
    WINDOW_BYTES,
    WINDOW_MESSAGES,
    SendWindow,
)
from tests.dialogs.endpoints import conversing_endpoint


class FakeLink:
    """Only what the window reads of a link: its name."""

    name = "tcp://127.0.0.2:4022"


LINK = FakeLink()


def endpoint() -> Endpoint:
    return conversing_endpoint()


def message(ep: Endpoint, seq: int, length: int = 100) -> OutMessage:
    msg = OutMessage(seq, "DEFAULT", 0, b"x" * length, length, 0.0, 1)
    msg.sent_via = LINK.name
    ep.outbox[seq] = msg
    return msg


def test_beyond_the_window_messages_wait_in_order_and_go_as_acknowledgements_return() -> None:
    window = SendWindow()
    ep = endpoint()
    sent: list[int] = []
    messages = [message(ep, seq) for seq in range(1, WINDOW_MESSAGES + 11)]
    for msg in messages:
        window.offer(ep, msg, LINK, lambda _e, m, _l: sent.append(m.seq))  # type: ignore[arg-type]
    assert sent == list(range(1, WINDOW_MESSAGES + 1))
    assert len(window.waiting) == 10
    for msg in messages[:3]:
        del ep.outbox[msg.seq]
        window.release(msg)
    assert sent[-3:] == [WINDOW_MESSAGES + 1, WINDOW_MESSAGES + 2, WINDOW_MESSAGES + 3]
    assert window.count == WINDOW_MESSAGES


def test_a_backlog_fills_the_larger_window_and_a_new_send_waits_beyond_the_smaller() -> None:
    """R-DLG-13: messages paged in from a backlog go while fewer than
    BACKLOG_WINDOW_MESSAGES are in flight; a message SENT since the link opened waits once
    WINDOW_MESSAGES are, whatever is in flight, and goes when acknowledgements bring the
    count under that again."""
    window = SendWindow()
    backlog, live = endpoint(), endpoint()
    sent: list[tuple[int, int]] = []

    def send(e: Endpoint, m: OutMessage, _link: object) -> None:
        sent.append((id(e), m.seq))

    paged = [message(backlog, seq) for seq in range(1, BACKLOG_WINDOW_MESSAGES + 2)]
    for msg in paged:
        msg.paged = True
    for msg in paged[:WINDOW_MESSAGES]:
        assert window.offer(backlog, msg, LINK, send)  # type: ignore[arg-type]
    fresh = message(live, 1)
    assert not window.offer(live, fresh, LINK, send)  # type: ignore[arg-type]
    del live.outbox[1]  # acknowledged meanwhile: the waiting entry is dropped by feed
    window.feed()
    assert not window.waiting
    for msg in paged[WINDOW_MESSAGES:BACKLOG_WINDOW_MESSAGES]:
        assert window.offer(backlog, msg, LINK, send)  # type: ignore[arg-type]
    assert window.count == BACKLOG_WINDOW_MESSAGES
    assert not window.offer(backlog, paged[-1], LINK, send)  # type: ignore[arg-type]
    fresh = message(live, 2)
    assert not window.offer(live, fresh, LINK, send)  # type: ignore[arg-type]
    for msg in paged[: BACKLOG_WINDOW_MESSAGES - WINDOW_MESSAGES + 2]:
        del backlog.outbox[msg.seq]
        window.release(msg)
    assert sent[-2:] == [(id(backlog), BACKLOG_WINDOW_MESSAGES + 1), (id(live), 2)]
    assert window.count == WINDOW_MESSAGES


def test_a_retransmission_is_not_counted_twice_and_one_large_message_always_fits() -> None:
    window = SendWindow()
    ep = endpoint()
    sent: list[int] = []
    big = message(ep, 1, WINDOW_BYTES * 2)
    window.offer(ep, big, LINK, lambda _e, m, _l: sent.append(m.seq))  # type: ignore[arg-type]
    window.offer(ep, big, LINK, lambda _e, m, _l: sent.append(m.seq))  # type: ignore[arg-type]
    assert sent == [1, 1] and window.count == 1
    small = message(ep, 2)
    window.offer(ep, small, LINK, lambda _e, m, _l: sent.append(m.seq))  # type: ignore[arg-type]
    assert sent == [1, 1] and len(window.waiting) == 1  # over the bytes: it waits
    del ep.outbox[1]
    window.release(big)
    assert sent == [1, 1, 2]


def test_what_was_acknowledged_or_moved_while_waiting_is_skipped() -> None:
    window = SendWindow()
    ep = endpoint()
    sent: list[int] = []
    first = message(ep, 1, WINDOW_BYTES)
    window.offer(ep, first, LINK, lambda _e, m, _l: sent.append(m.seq))  # type: ignore[arg-type]
    gone, moved, kept = message(ep, 2), message(ep, 3), message(ep, 4)
    for msg in (gone, moved, kept):
        window.offer(ep, msg, LINK, lambda _e, m, _l: sent.append(m.seq))  # type: ignore[arg-type]
    del ep.outbox[2]
    moved.sent_via = "tcp://127.0.0.9:4022"
    del ep.outbox[1]
    window.release(first)
    assert sent == [1, 4]
    assert window.forget_waiting() == []


def test_a_full_window_holds_one_entry_per_blocked_endpoint_and_resumes_it() -> None:
    """A backlog beyond the window is not queued message by message: the endpoint that
    found the window full is blocked, and offered again once nothing waits and there is
    room (a million waiting messages would cost a million entries, and stop the loop)."""
    window = SendWindow()
    ep, other = endpoint(), endpoint()
    sent: list[int] = []
    messages = [message(ep, seq) for seq in range(1, WINDOW_MESSAGES + 2)]
    for msg in messages[:-1]:
        assert window.offer(ep, msg, LINK, lambda _e, m, _l: sent.append(m.seq))  # type: ignore[arg-type]
    assert not window.offer(ep, messages[-1], LINK, lambda _e, m, _l: sent.append(m.seq))  # type: ignore[arg-type]
    window.block(ep)
    window.block(other)
    assert window.unblocked() == []  # a message still waits
    del ep.outbox[1]
    window.release(messages[0])
    assert sent[-1] == WINDOW_MESSAGES + 1 and not window.waiting
    assert window.unblocked() == []  # the window is full again
    del ep.outbox[2]
    window.release(messages[1])
    assert window.unblocked() == [ep, other]
    assert window.unblocked() == []
    window.block(ep)
    assert window.forget_waiting() == [ep]


def test_between_the_bounds_only_endpoints_blocked_by_a_backlog_resume() -> None:
    """With WINDOW_MESSAGES or more in flight (and fewer than BACKLOG_WINDOW_MESSAGES),
    endpoints blocked by messages paged in from their backlogs are offered again, in the
    order they blocked; an endpoint blocked by a message kept in memory waits until
    fewer than WINDOW_MESSAGES are, and an endpoint blocked again by such a message is
    no longer counted as a backlog's."""
    window = SendWindow()
    first, second, filler = endpoint(), endpoint(), endpoint()
    messages = [message(filler, seq) for seq in range(1, WINDOW_MESSAGES + 1)]
    for msg in messages:
        msg.paged = True
        assert window.offer(filler, msg, LINK, lambda _e, _m, _l: None)  # type: ignore[arg-type]
    window.block(second, paged=True)
    window.block(first, paged=True)
    assert window.unblocked() == [second, first]
    assert window.unblocked() == []
    window.block(first, paged=True)
    window.block(first)  # its next message is one kept in memory
    assert window.unblocked() == []
    del filler.outbox[1]
    window.release(messages[0])
    assert window.unblocked() == [first]


def test_a_backlog_never_starves_an_endpoint_blocked_by_a_new_send() -> None:
    """While an endpoint blocked by a message kept in memory since its SEND waits, the
    messages of backlogs get the smaller bound too: the window drains under
    WINDOW_MESSAGES instead of backlogs refilling it to BACKLOG_WINDOW_MESSAGES as
    acknowledgements return, and the blocked endpoint resumes (R-DLG-6)."""
    window = SendWindow()
    backlog, live = endpoint(), endpoint()
    paged = [message(backlog, seq) for seq in range(1, WINDOW_MESSAGES + 3)]
    for msg in paged:
        msg.paged = True
    for msg in paged[: WINDOW_MESSAGES + 1]:
        assert window.offer(backlog, msg, LINK, lambda _e, _m, _l: None)  # type: ignore[arg-type]
    window.block(live)
    assert not window.offer(backlog, paged[-1], LINK, lambda _e, _m, _l: None)  # type: ignore[arg-type]
    window.waiting.clear()
    for msg in paged[:2]:
        del backlog.outbox[msg.seq]
        window.release(msg)
    assert window.count == WINDOW_MESSAGES - 1
    assert window.unblocked() == [live]


def test_a_forgotten_message_leaves_the_count_without_sending_what_waits() -> None:
    """A database that stops being principal forgets its image (R-ROUTE-16): its
    messages in flight leave their window's count, so the link's other databases keep
    their whole window; nothing waiting is sent by the window then (the transmission
    feeds it in a later turn of the loop)."""
    window = SendWindow()
    ep, other = endpoint(), endpoint()
    sent: list[int] = []
    forgotten = [message(ep, seq) for seq in range(1, WINDOW_MESSAGES + 1)]
    for msg in forgotten:
        window.offer(ep, msg, LINK, lambda _e, m, _l: sent.append(m.seq))  # type: ignore[arg-type]
    waiting = message(other, 1)
    assert not window.offer(other, waiting, LINK, lambda _e, m, _l: sent.append(-m.seq))  # type: ignore[arg-type]
    for msg in forgotten:
        window.uncount(msg)
    assert window.count == 0 and window.bytes == 0 and -1 not in sent
    window.release(forgotten[0])  # not counted any more: counted once only
    assert window.count == 1 and sent[-1] == -1


def test_a_message_counted_by_a_lost_connection_s_window_is_counted_by_the_next() -> None:
    """R-DLG-13: a connection lost drops its link's window, and the next connection has a
    new one, empty. A message the old one counted and whose mark was not cleared (its
    body was being read back when the connection was lost: no fragment of its endpoint
    was queued on the link yet, so the link's lost connection did not name the endpoint)
    is sent again on the new connection: the new window counts it, and its
    acknowledgement frees exactly that place. Taken for a retransmission already
    counted, it was sent uncounted and its acknowledgement took the count below zero:
    the link's window grew by one at each such loss."""
    ep = endpoint()
    sent: list[int] = []
    lost = SendWindow()
    msg = message(ep, 1)
    lost.offer(ep, msg, LINK, lambda _e, m, _l: sent.append(m.seq))  # type: ignore[arg-type]
    assert lost.count == 1
    new = SendWindow()  # the next connection's
    new.offer(ep, msg, LINK, lambda _e, m, _l: sent.append(m.seq))  # type: ignore[arg-type]
    assert sent == [1, 1]
    assert new.count == 1 and new.bytes == msg.length
    del ep.outbox[1]
    new.release(msg)
    assert new.count == 0 and new.bytes == 0
