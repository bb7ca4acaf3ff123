"""A RECEIVE reply is built once and is the reply a fresh encoding gives (SPEC R-DLG-1:
the budget cuts a batch to one frame before anything is removed)."""

from __future__ import annotations

from typing import Any

from brokerd.server.receive_reply import RECEIVE_META_LIMIT, ReceiveReply, reply_row
from protocol.client_wire import encode_meta


def _rows(n: int, body: bytes = b"<order/>") -> list[dict[str, Any]]:
    return [
        {
            "conversation_handle": "8c2f4a1e-0b7d-4c3a-9e55-0a1f0e3b7c11",
            "message_sequence_number": seq,
            "conversation_group_id": "1d5f7a3e-0b7d-4c3a-9e55-0a1f0e3b7c12",
            "service_name": "//warehouse/Orders",
            "service_contract_name": "//shop/OrderContract",
            "message_type_name": "//shop/Order",
            "message_body": body + str(seq).encode(),
            "message_enqueue_time": 1764000000.25 + seq,
            "queue": "OrderQueue",
        }
        for seq in range(1, n + 1)
    ]


def _fresh(rows: list[dict[str, Any]]) -> tuple[bytes, list[bytes]]:
    return encode_meta({"messages": [reply_row(r) for r in rows]}), [
        r["message_body"] for r in rows
    ]


def test_the_reply_of_the_rows_the_budget_kept_is_a_fresh_encoding() -> None:
    rows = _rows(50)
    reply = ReceiveReply()
    assert reply(rows) == 50
    assert reply.encode(rows[:50]) == _fresh(rows)


def test_a_batch_cut_to_one_frame_replies_with_its_leading_rows() -> None:
    row_size = len(encode_meta(reply_row(_rows(1)[0]))) + 1
    rows = _rows(RECEIVE_META_LIMIT // row_size + 100)
    reply = ReceiveReply()
    keep = reply(rows)
    assert 0 < keep < len(rows)
    meta, bodies = reply.encode(rows[:keep])
    assert (meta, bodies) == _fresh(rows[:keep])
    assert len(meta) <= RECEIVE_META_LIMIT


def test_rows_the_budget_never_saw_are_encoded_as_they_are() -> None:
    reply = ReceiveReply()
    reply(_rows(3))
    other = _rows(3, body=b"<other/>")
    assert reply.encode(other) == _fresh(other)
    assert reply.encode([]) == (b'{"messages":[]}', [])
