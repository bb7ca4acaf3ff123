"""The meta (and body) of each verb's request on the client wire, built in one place
for the plain verbs of ``BrokerClient`` and those of a ``Transaction``."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from brokerd.sdk.dialog import Handle, handle_of
from protocol.client_wire import BEGIN_DIALOG_KEYS, MAX_ROLLBACK_REASON, encode_meta
from protocol.errors import LocalProtocolError

Request = tuple[dict[str, Any], bytes]


def _text(value: Handle | str | None) -> str | None:
    return str(value) if value else None


def begin_dialog_request(
    from_service: str,
    to_service: str,
    contract: str,
    database: str | None,
    to_broker_instance: uuid.UUID | str | None,
    lifetime: int,
    related_conversation: Handle | None,
    related_conversation_group: uuid.UUID | None = None,
    key: str | None = None,
) -> Request:
    meta: dict[str, Any] = {
        "op": "begin_dialog",
        "from_service": from_service,
        "to_service": to_service,
        "contract": contract,
        "database": database,
        "to_broker_instance": _text(to_broker_instance),
        "lifetime": lifetime,
        "related_conversation": _text(related_conversation),
        "related_conversation_group": _text(related_conversation_group),
    }
    if key is not None:
        meta["key"] = key
    return meta, b""


def begin_dialog_key(key: str | None, features: frozenset[str]) -> str | None:
    """The idempotency key of a BEGIN DIALOG outside a transaction (SPEC §6, outcomes):
    the caller's ``key``, or a fresh one, so that one whose connection is lost before its
    answer is written again and begins one dialog; None from a daemon whose login names
    no :data:`~protocol.client_wire.BEGIN_DIALOG_KEYS` in its ``features`` (it would
    ignore the key: a caller's is refused, ``LocalProtocolError``, before it is written)."""
    if BEGIN_DIALOG_KEYS not in features:
        if key is not None:
            raise LocalProtocolError(
                "this daemon's BEGIN DIALOG takes no idempotency key (its login names no "
                f"{BEGIN_DIALOG_KEYS!r} feature): not sent"
            )
        return None
    return key if key is not None else fresh_key()


def fresh_key() -> str:
    """An idempotency key the SDK makes: the time first (nanoseconds, 16 hex digits),
    then 64 random bits. The daemon keeps keys in a B-tree ordered by key, so keys made
    in time order join it at its end, a few pages a commit; random keys (a uuid4) land
    on a page of their own each, and a run of many dialogs rewrites a page per dialog."""
    return f"{time.time_ns():016x}-{os.urandom(8).hex()}"


def send_request(
    conversation_handle: Handle, message_type: str, body: bytes, key: str | None = None
) -> Request:
    meta = {
        "op": "send",
        "conversation_handle": str(conversation_handle),
        "message_type": message_type,
    }
    if key is not None:
        meta["key"] = key
    return meta, bytes(body)


_SEND_METAS: dict[tuple[uuid.UUID, str], bytes] = {}
_SEND_METAS_KEPT = 4096


def send_meta(
    conversation_handle: Handle, message_type: str, idempotency_key: str | None = None
) -> bytes:
    """:func:`send_request`'s meta, encoded: a producer's SENDs on one dialog share it,
    so it is encoded once (the last few thousand dialogs' are kept); a SEND with an
    idempotency key has a meta of its own."""
    if idempotency_key is not None:
        request, _ = send_request(conversation_handle, message_type, b"", idempotency_key)
        return encode_meta(request)
    key = (handle_of(conversation_handle), message_type)
    meta = _SEND_METAS.get(key)
    if meta is None:
        if len(_SEND_METAS) >= _SEND_METAS_KEPT:
            _SEND_METAS.clear()
        request, _ = send_request(conversation_handle, message_type, b"")
        meta = _SEND_METAS[key] = encode_meta(request)
    return meta


def send_many_request(
    messages: Sequence[tuple[Handle, str, bytes]], keys: list[str | None] | None = None
) -> Request:
    """Each message's handle, type, body length (and idempotency key, if any) in meta; the
    bodies one after another."""
    items: list[dict[str, Any]] = [
        {"conversation_handle": str(h), "message_type": t, "body_length": len(b)}
        for h, t, b in messages
    ]
    if keys is not None:
        if len(keys) != len(messages):
            raise ValueError("send_many: one key (or None) per message")
        for item, key in zip(items, keys, strict=True):
            if key is not None:
                item["key"] = key
    meta = {"op": "send_many", "messages": items}
    return meta, b"".join(bytes(b) for _, _, b in messages)


def receive_request(
    queue: str,
    database: str | None,
    top: int,
    timeout: float,
    conversation_handle: Handle | None,
    conversation_group_id: uuid.UUID | None = None,
    groups: int = 1,
) -> Request:
    meta: dict[str, Any] = {
        "op": "receive",
        "queue": queue,
        "database": database,
        "top": top,
        "timeout": timeout,
        "conversation_handle": _text(conversation_handle),
        "conversation_group_id": _text(conversation_group_id),
    }
    if groups != 1:
        meta["groups"] = groups
    return meta, b""


def get_group_request(queue: str, database: str | None, timeout: float) -> Request:
    return {
        "op": "get_conversation_group",
        "queue": queue,
        "database": database,
        "timeout": timeout,
    }, b""


def end_conversation_request(
    conversation_handle: Handle, error_code: int | None, description: str, cleanup: bool
) -> Request:
    return {
        "op": "end_conversation",
        "conversation_handle": str(conversation_handle),
        "error_code": error_code,
        "description": description,
        "cleanup": cleanup,
    }, b""


def timer_request(conversation_handle: Handle, timeout: float) -> Request:
    return {
        "op": "begin_conversation_timer",
        "conversation_handle": str(conversation_handle),
        "timeout": timeout,
    }, b""


def move_request(conversation_handle: Handle, conversation_group_id: uuid.UUID) -> Request:
    return {
        "op": "move_conversation",
        "conversation_handle": str(conversation_handle),
        "conversation_group_id": str(conversation_group_id),
    }, b""


def view_request(
    name: str,
    after: str | None = None,
    limit: int | None = None,
    params: Mapping[str, str] | None = None,
) -> Request:
    """One page of an admin view: the rows after the cursor ``after`` (the previous page's
    ``next``), at most ``limit`` of them (the daemon's default if None); ``params`` are the
    view's own (``queue`` for ``queue_messages``)."""
    meta: dict[str, Any] = {**(params or {}), "op": "view", "name": name}
    if after:
        meta["after"] = after
    if limit is not None:
        meta["limit"] = limit
    return meta, b""


def rollback_request(tx_id: int, reason: str) -> Request:
    """ROLLBACK, with the reason kept as the last error of the messages it puts back (cut
    to what the daemon accepts)."""
    meta: dict[str, Any] = {"op": "rollback", "transaction": tx_id}
    if reason:
        meta["reason"] = reason[:MAX_ROLLBACK_REASON]
    return meta, b""


def release_quarantine_request(conversation_handle: uuid.UUID) -> Request:
    return {"op": "release_quarantine", "conversation_handle": str(conversation_handle)}, b""


def end_quarantined_request(
    conversation_handle: uuid.UUID, error_code: int, description: str
) -> Request:
    return {
        "op": "end_quarantined",
        "conversation_handle": str(conversation_handle),
        "error_code": error_code,
        "description": description,
    }, b""
