"""A connection's outbox: what goes first, and acknowledgements merged into few frames (R-DLG-7)."""

from __future__ import annotations

import uuid

from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage
from brokerd.dialogs.endpoints.states import State
from brokerd.dialogs.transmission.links import SendAcks, SendFragment, SendHeader
from brokerd.routing.forwarding import Forward
from brokerd.server.outbox import MAX_QUEUED_ERRORS, Outbox
from protocol.dialog import MAX_ACKS_PER_FRAME, Acknowledgement, DialogHeader


def _endpoint() -> Endpoint:
    return Endpoint(
        handle=uuid.uuid4(),
        conversation_id=uuid.uuid4(),
        initiator=True,
        group_id=uuid.uuid4(),
        database="shop",
        service="//shop/Client",
        far_service="//warehouse/Orders",
        far_broker_instance=None,
        contract="DEFAULT",
        state=State.CONVERSING,
        lifetime=0,
        created_at=0.0,
    )


def _message(seq: int, fragments: int) -> OutMessage:
    return OutMessage(seq, "DEFAULT", 3, b"x" * fragments, fragments, 0.0, fragments)


def _ack(n: int) -> DialogHeader:
    return DialogHeader(uuid.uuid4(), "//a", "//b", uuid.uuid4(), ack=Acknowledgement(n))


def test_small_items_go_before_the_fragments_of_large_messages() -> None:
    ep = _endpoint()
    outbox = Outbox()
    large = _message(1, 3)
    for index in range(3):
        outbox.add(SendFragment(ep, large, index))
    small = SendFragment(ep, _message(2, 1), 0)
    header = SendHeader(_ack(1), b"")
    forward = Forward(b"a relayed fragment", None, 0)
    outbox.add(small)
    outbox.add(header)
    outbox.add(forward)
    order = [outbox.pop() for _ in range(6)]
    assert order[:3] == [small, header, forward]
    assert [item.fragment for item in order[3:] if isinstance(item, SendFragment)] == [0, 1, 2]
    assert not outbox


def test_consecutive_acknowledgements_become_one_frame_up_to_its_limit() -> None:
    outbox = Outbox()
    outbox.add_acks([_ack(n) for n in range(1, 11)])
    outbox.add_acks([_ack(n) for n in range(11, 21)])
    between = SendHeader(_ack(99), b"")
    outbox.add(between)
    outbox.add_acks([_ack(30)])
    first = outbox.pop()
    assert isinstance(first, SendAcks)
    merged = outbox.take_acks(first)
    assert [h.ack.through for h in merged] == list(range(1, 21))
    assert outbox.pop() is between  # acknowledgements never jump over another item
    last = outbox.pop()
    assert isinstance(last, SendAcks)
    assert [h.ack.through for h in outbox.take_acks(last)] == [30]


def test_an_ack_frame_never_carries_more_than_the_protocol_allows() -> None:
    outbox = Outbox()
    outbox.add_acks([_ack(n) for n in range(1, MAX_ACKS_PER_FRAME + 500)])
    frames = []
    while outbox:
        item = outbox.pop()
        assert isinstance(item, SendAcks)
        frames.append(outbox.take_acks(item))
    assert [len(f) for f in frames] == [MAX_ACKS_PER_FRAME, 499]


def test_unsent_forwards_are_handed_back_when_the_connection_goes() -> None:
    ep = _endpoint()
    outbox = Outbox()
    forward = Forward(b"a relayed fragment", None, 0)
    outbox.add(SendFragment(ep, _message(1, 1), 0))
    outbox.add(forward)
    outbox.add_acks([_ack(2)])
    assert outbox.forwards() == [forward]
    outbox.clear()
    assert not outbox


def test_an_endpoint_has_one_acknowledgement_waiting_the_newest() -> None:
    """A peer that does not read keeps acknowledgements waiting: a newer one of the same
    endpoint (conversation and role) replaces the older in its place."""
    outbox = Outbox()
    first, other = _ack(1), _ack(7)
    outbox.add_acks([first, other])
    newer = first._replace(ack=Acknowledgement(5))
    outbox.add_acks([newer])
    assert outbox.queued_acks == 2
    item = outbox.pop()
    assert isinstance(item, SendAcks)
    assert outbox.take_acks(item) == [newer, other]
    outbox.add_acks([first])  # sent: a later one waits again
    assert outbox.queued_acks == 1
    taken = outbox.pop()
    outbox.add_acks([newer])  # taken out, its frame not built yet: a newer one queues anew
    assert outbox.queued_acks == 1 and isinstance(taken, SendAcks)
    assert outbox.take_acks(taken) == [first, newer]  # merged into one frame
    assert not outbox and outbox.queued_acks == 0
    outbox.add_acks([first])
    outbox.clear()
    assert outbox.queued_acks == 0


def test_acknowledgements_of_two_broker_instances_are_never_merged() -> None:
    """R-DLG-5, R-ROUTE-3: two databases of this instance (two broker instances) may each
    hold an endpoint of one conversation id and direction, answering two far instances
    over one connection: each keeps its own acknowledgement waiting, and only a newer one
    of the same sender for the same far instance replaces it."""
    outbox = Outbox()
    east = _ack(1)
    west = east._replace(from_broker_instance=uuid.uuid4(), to_broker_instance=uuid.uuid4())
    to_other = east._replace(to_broker_instance=uuid.uuid4())
    outbox.add_acks([east, west, to_other])
    assert outbox.queued_acks == 3
    newer = west._replace(ack=Acknowledgement(2))
    outbox.add_acks([newer])
    item = outbox.pop()
    assert isinstance(item, SendAcks)
    assert outbox.take_acks(item) == [east, newer, to_other]
    assert outbox.queued_acks == 0


def test_broker_errors_past_the_bound_are_dropped_and_counted() -> None:
    outbox = Outbox()
    for n in range(MAX_QUEUED_ERRORS + 10):
        outbox.add(SendHeader(_ack(n), b""))
    assert outbox.errors_dropped == 10
    kept = [outbox.pop() for _ in range(MAX_QUEUED_ERRORS)]
    assert all(type(item) is SendHeader for item in kept) and not outbox
    outbox.add(SendHeader(_ack(1), b""))  # room again once they went
    assert outbox.errors_dropped == 10 and type(outbox.pop()) is SendHeader
