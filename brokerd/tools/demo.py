"""The protocol demonstration (the README's main job until the daemon exists).

Two in-memory brokers, ``alpha`` and ``beta``, with certificates from a fresh
deployment CA: they run the handshake, then alpha sends a small message and a
200 KiB message that travels as fragments with another small message interleaved;
beta reassembles, acknowledges, and rejects a frame altered in flight. Finally a
broker with a certificate from another CA is refused. Every frame is printed.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable

from brokerd.tools.certs import create_ca, identity_for, issue_instance
from protocol import BrokerConnection, ConnectionSettings, EncryptionMode, Role, frames
from protocol.dialog import (
    Acknowledgement,
    DialogHeader,
    MessageFlags,
    decode_acks,
    decode_fragment,
    encode_acks,
    encode_fragment,
)
from protocol.errors import CloseCode, HandshakeRefused
from protocol.events import Ack, Event, Fragment, IntegrityFailure
from protocol.fragments import Reassembler, split_message

Printer = Callable[[str], None]


def _describe(data: bytes) -> str:
    parts = []
    for h in frames.iter_frame_headers(data):
        kind = frames.FrameType(h.frame_type).name
        protection = (
            "encrypted+signed"
            if h.flags & frames.FrameFlags.ENCRYPTED
            else "signed"
            if h.flags
            else "clear"
        )
        parts.append(f"{kind}#{h.counter} {h.length}B {protection}")
    return ", ".join(parts)


def _wire(out: Printer, direction: str, data: bytes) -> bytes:
    if data:
        out(f"  {direction}  {_describe(data)}")
    return data


def _events(out: Printer, who: str, events: list[Event]) -> list[Event]:
    for e in events:
        text = repr(e) if not isinstance(e, Fragment | Ack) else f"{type(e).__name__}(...)"
        out(f"  {who} event: {text}")
    return events


def run_demo(
    out: Printer = print,
    encryption: EncryptionMode = EncryptionMode.REQUIRED,
    fragment_size: int = 64 * 1024,
) -> dict[str, int]:
    """Run the demonstration; returns counts the tests check."""
    now = dt.datetime.now(dt.UTC)
    ca = create_ca("demo deployment CA")
    alpha = identity_for(issue_instance(ca, "alpha"), ca)
    beta = identity_for(issue_instance(ca, "beta"), ca)
    out(
        "deployment CA and certificates for 'alpha' and 'beta' created "
        f"(encryption {encryption.name.lower()})"
    )

    i = BrokerConnection(Role.INITIATOR, ConnectionSettings(alpha, encryption=encryption), now)
    a = BrokerConnection(Role.ACCEPTOR, ConnectionSettings(beta, encryption=encryption), now)
    out("\nhandshake:")
    _events(out, "beta", a.receive_data(_wire(out, "alpha -> beta", i.start())))
    _events(out, "alpha", i.receive_data(_wire(out, "beta -> alpha", a.data_to_send())))
    _events(out, "beta", a.receive_data(_wire(out, "alpha -> beta", i.data_to_send())))
    _events(out, "alpha", i.receive_data(_wire(out, "beta -> alpha", a.data_to_send())))

    alpha_db, beta_db, conversation = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    def message(seq: int, body: bytes) -> list[Fragment]:
        """The dialog fragments of one message (sealed into frames only when sent)."""
        fragments_out = []
        for piece in split_message(body, fragment_size):
            header = DialogHeader(
                conversation_id=conversation,
                from_service="//demo/Expenses",
                to_service="//demo/Accounting",
                from_broker_instance=alpha_db,
                contract="//demo/ExpenseSubmission",
                message_type="//demo/SubmitExpense",
                flags=MessageFlags.SEQUENCED | MessageFlags.INITIATOR,
                sequence_number=seq,
                fragment_index=piece.index,
                fragment_count=piece.count,
                fragment_offset=piece.offset,
                message_length=len(body),
            )
            fragments_out.append(Fragment(encode_fragment(header, piece.data)))
        return fragments_out

    big = bytes(range(256)) * 800  # 200 KiB
    first = message(1, b"<expense>42.00</expense>")
    large = message(2, big)
    third = message(3, b"<expense>7.50</expense>")
    # Interleave: the small message 3 travels between the fragments of message 2
    # (R-DLG-7). Frames are sealed in sending order: their counters only go up.
    order = [first[0], large[0], third[0], *large[1:]]
    out(
        f"\nalpha sends 3 messages as {len(order)} fragments "
        "(message 3 travels between message 2's fragments):"
    )
    reassembler = Reassembler()
    delivered: dict[int, bytes] = {}
    acked_through = 0
    for fragment in order:
        for event in a.receive_data(_wire(out, "alpha -> beta", i.send(fragment))):
            assert isinstance(event, Fragment)
            header, body = decode_fragment(event.payload)
            whole = reassembler.add(
                (header.conversation_id, header.sequence_number),
                header.fragment_index,
                header.fragment_count,
                header.fragment_offset,
                header.message_length,
                body,
            )
            if whole is not None:
                delivered[header.sequence_number] = whole
                out(f"  beta: message {header.sequence_number} complete, {len(whole)} bytes")
    while acked_through + 1 in delivered:
        acked_through += 1
    ack = DialogHeader(
        conversation_id=conversation,
        from_service="//demo/Accounting",
        to_service="//demo/Expenses",
        from_broker_instance=beta_db,
        to_broker_instance=alpha_db,
        flags=MessageFlags.NONE,
        ack=Acknowledgement(through=acked_through),
    )
    out("\nbeta acknowledges every message up to its highest in-order one:")
    (ack_event,) = i.receive_data(_wire(out, "beta -> alpha", a.send(Ack(encode_acks([ack])))))
    assert isinstance(ack_event, Ack)
    (received_ack,) = decode_acks(ack_event.payload)
    out(f"  alpha: acknowledged through sequence {received_ack.ack.through}")

    out("\na frame altered in flight (one byte flipped) is detected and not handed up:")
    tampered = bytearray(i.send(message(4, b"<expense>1000.00</expense>")[0]))
    tampered[-20] ^= 0x40
    failures = [
        e
        for e in _events(out, "beta", a.receive_data(bytes(tampered)))
        if isinstance(e, IntegrityFailure)
    ]

    out("\na broker whose certificate another CA issued is refused:")
    rogue_ca = create_ca("rogue CA")
    mallory = identity_for(issue_instance(rogue_ca, "mallory"), ca)
    m = BrokerConnection(Role.INITIATOR, ConnectionSettings(mallory), now)
    b2 = BrokerConnection(Role.ACCEPTOR, ConnectionSettings(beta), now)
    refused = 0
    try:
        b2.receive_data(_wire(out, "mallory -> beta", m.start()))
    except HandshakeRefused as exc:
        refused = 1
        out(f"  beta refuses: {exc}")
        _events(out, "mallory", m.receive_data(_wire(out, "beta -> mallory", b2.data_to_send())))

    out("\nalpha closes the connection:")
    closing = i.close(CloseCode.NORMAL, "demo finished")
    _events(out, "beta", a.receive_data(_wire(out, "alpha -> beta", closing)))
    ok = delivered.get(2) == big and len(delivered) == 3
    out(
        f"\nresult: {len(delivered)} messages delivered intact={ok}, "
        f"{len(failures)} corrupted message detected, {refused} peer refused"
    )
    return {
        "delivered": len(delivered),
        "intact": int(ok),
        "corrupted_messages": len(failures),
        "refused": refused,
        "closed": int(a.closed),
    }
