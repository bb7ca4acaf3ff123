"""The client protocol's requests: one handler per op, dispatched through :data:`OPERATIONS`.

Operations (``meta["op"]``; the login is the listener's, ``brokerd.server.client_listener``):
``begin_dialog`` (an optional ``key``, as a SEND's: SPEC §6), ``send`` (the body is the
message), ``send_many`` (several messages, their bodies concatenated), ``receive``
(message bodies concatenated in the response body, their lengths in meta; for one
``conversation_handle`` or one ``conversation_group_id``), ``get_conversation_group``,
``end_conversation``, ``begin_conversation_timer`` (R-DLG-11), ``move_conversation``,
``begin_transaction``, ``commit`` and ``rollback`` (the verbs above take ``transaction``:
``brokerd.dialogs.verbs.transactions``; at most :data:`MAX_OPEN_TRANSACTIONS` are open
per connection; a rollback may give a ``reason``), ``release_quarantine`` and
``end_quarantined`` (poison-message handling, SPEC §6), ``alter_queue``, the routing
administration ``create_route``, ``alter_route``, ``drop_route`` (R-OBJ-5, persisted),
``explain`` (why a route is chosen, SPEC §2) and ``set_mirror_role`` (failover,
R-ROUTE-10), ``view`` (one page of an admin view: ``brokerd.server.client_views``)
and ``ping``. ``withdraw`` (``request``: the id of a waiting ``receive`` or
``get_conversation_group`` whose caller stopped waiting) is the listener's too: the
request, if it has taken nothing yet, ends at once with nothing.

A handler takes the :class:`Session` (what it uses of a client connection: its daemon,
its access, its open transactions) and the request frame, and returns the reply's meta
and body; what it raises becomes the ERROR reply.

May import: ``protocol``, ``brokerd.dialogs``, ``brokerd.server.client_meta``,
``brokerd.server.client_access``, ``brokerd.server.receive_reply``; the daemon's parts
(``brokerd.server.transport``, ``brokerd.server.mirroring``) for their types only.
Never ``brokerd.server.client_listener``.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.config import INT_MAX
from brokerd.dialogs.verbs.receive import Withdrawal
from brokerd.dialogs.verbs.transactions import Transaction, TxState
from brokerd.server import client_views
from brokerd.server.client_access import Access
from brokerd.server.client_meta import meta_bool, meta_database, meta_key, meta_str, meta_uuid
from brokerd.server.receive_reply import ReceiveReply
from protocol.client_wire import BEGIN_DIALOG_KEYS, MAX_ROLLBACK_REASON, ClientFrame
from protocol.errors import BrokerError, InvalidRequest, TransactionError

if TYPE_CHECKING:
    from brokerd.dialogs.engine import DialogEngine
    from brokerd.server.activation import ExternalActivation
    from brokerd.server.mirroring_service import Mirroring
    from brokerd.server.transport import Transport


class Broker(Protocol):
    """What the handlers need of the daemon (``brokerd.server.daemon.Broker``)."""

    engine: DialogEngine
    transport: Transport
    mirroring: Mirroring
    activation: ExternalActivation
    instance_name: str
    client_reads_held: int
    client_sends_held: int


class Session(Protocol):
    """What the handlers use of a client connection (``ClientSession`` in
    ``brokerd.server.client_listener``)."""

    transactions: dict[int, Transaction]
    """The connection's open transactions, by id."""

    @property
    def broker(self) -> Broker: ...

    @property
    def allowed(self) -> Access:
        """What the logged-in client may do."""
        ...

    @property
    def tx_ids(self) -> Iterator[int]:
        """The ids of the connection's transactions, one after the other."""
        ...

    def check_own(self, handle: uuid.UUID) -> None:
        """Refuse an application a conversation of a service that is not its own."""
        ...

    def withdrawal(self, request_id: int) -> Withdrawal | None:
        """What takes the waiting request ``request_id`` back when its client withdraws it
        (a RECEIVE's or GET CONVERSATION GROUP's running as a task)."""
        ...


ReplyMeta = dict[str, Any] | bytes
"""A reply's meta: a dict, or JSON already encoded by ``encode_meta`` (RECEIVE's)."""
ReplyBody = bytes | list[bytes]
"""A reply's body: bytes, or pieces written one after the other (RECEIVE's bodies)."""

MAX_OPEN_TRANSACTIONS = 16
"""Transactions one client connection may hold open at once."""
MAX_SEND_MANY = 2_000
"""Messages in one send_many request (their entries must fit the 1 MiB meta limit)."""

Handler = Callable[[Session, ClientFrame], Awaitable[tuple[ReplyMeta, ReplyBody]]]


def _transaction(session: Session, m: dict[str, Any]) -> Transaction | None:
    """The open transaction a request names with ``transaction``, if it names one."""
    tx_id = m.get("transaction")
    if tx_id is None:
        return None
    if not isinstance(tx_id, int) or isinstance(tx_id, bool):
        raise InvalidRequest("transaction must be the id begin_transaction returned")
    tx = session.transactions.get(tx_id)
    if tx is None:
        raise TransactionError(f"transaction {tx_id} is not open on this connection")
    return tx


def _check_own(session: Session, handle: uuid.UUID, tx: Transaction | None) -> None:
    """Refuse an application a conversation that is not its own (R-CLIENT-2); one that
    ``tx`` began is checked there, since no one else sees it before COMMIT (SPEC §6: the
    handle may be used in the transaction at once)."""
    begun = tx.new_endpoints.get(handle) if tx is not None else None
    if begun is not None:
        session.allowed.check_conversation(begun)
    else:
        session.check_own(handle)


async def _begin_transaction(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    if len(session.transactions) >= MAX_OPEN_TRANSACTIONS:
        raise TransactionError(
            f"this connection has {MAX_OPEN_TRANSACTIONS} open transactions, the most it may; "
            "commit or roll one back"
        )
    tx = session.broker.engine.transaction(next(session.tx_ids))
    session.transactions[tx.id] = tx
    return {"transaction": tx.id}, b""


async def _commit(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    tx = _transaction(session, frame.meta)
    if tx is None:
        raise InvalidRequest("commit needs the transaction's id")
    try:
        seqs = await tx.commit()
    finally:
        session.transactions.pop(tx.id, None)
    return {"sequence_numbers": seqs}, b""


async def _rollback(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    """ROLLBACK; answered once the rollback counts of the messages put back are written
    (SPEC §6), so that a restart cannot forget them."""
    tx = _transaction(session, frame.meta)
    if tx is None:
        raise InvalidRequest("rollback needs the transaction's id")
    if tx.state is TxState.COMMITTING:
        # its COMMIT is under way: the outcome is the COMMIT's, never a rollback's
        raise TransactionError(f"transaction {tx.id} is {tx.state.value}; cannot roll back")
    reason = meta_str(frame.meta, "reason", "")
    if len(reason) > MAX_ROLLBACK_REASON:
        raise InvalidRequest(
            f"reason must be at most {MAX_ROLLBACK_REASON} characters, not {len(reason)}"
        )
    session.transactions.pop(tx.id, None)
    for written in tx.rollback(reason):
        with contextlib.suppress(BrokerError):  # logged; the rollback itself took effect
            await written
    return {}, b""


async def _begin_dialog(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    m = frame.meta
    lifetime = m.get("lifetime", 0)
    if not isinstance(lifetime, int) or isinstance(lifetime, bool) or not 0 <= lifetime <= INT_MAX:
        raise InvalidRequest(f"lifetime must be a whole number of seconds, 0 to {INT_MAX}")
    args = (
        meta_str(m, "from_service"),
        meta_str(m, "to_service"),
        meta_str(m, "contract", "DEFAULT"),
    )
    session.allowed.check_service(args[0])
    related = meta_uuid(m, "related_conversation", required=False)
    related_group = meta_uuid(m, "related_conversation_group", required=False)
    if related is not None:
        session.check_own(related)
    options: dict[str, Any] = {
        "database": meta_database(m),
        "to_broker_instance": meta_uuid(m, "to_broker_instance", required=False),
        "lifetime": lifetime,
        "related_conversation": related,
        "related_group": related_group,
    }
    tx = _transaction(session, m)
    key = meta_key(m)
    if tx is not None:
        if key is not None:
            raise InvalidRequest("idempotency keys are for BEGIN DIALOGs outside a transaction")
        ep = tx.begin_dialog(*args, **options)
    elif key is not None:  # SPEC §6: a repeated key names the dialog it began
        ep = await session.broker.engine.begin_keys.begin_dialog(key, *args, **options)
    else:
        ep = await session.broker.engine.conversation_verbs.begin_dialog(*args, **options)
    return {
        "conversation_handle": str(ep.handle),
        "conversation_id": str(ep.conversation_id),
        "database": ep.database,
    }, b""


async def _send(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    """SEND in a transaction (outside one, ``ClientSession._send_now`` runs it, no task)."""
    m = frame.meta
    handle = meta_uuid(m, "conversation_handle")
    assert handle is not None
    tx = _transaction(session, m)
    assert tx is not None, "buffer_updated hands SENDs without a transaction to _send_now"
    _check_own(session, handle, tx)
    if meta_key(m) is not None:
        raise InvalidRequest("idempotency keys are for SENDs outside a transaction")
    tx.send(handle, meta_str(m, "message_type", "DEFAULT"), bytes(frame.body))
    return {"sequence_number": None}, b""


async def _send_many(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    """Several SENDs in one request: ``messages`` lists each one's conversation handle,
    message type and body length; the bodies follow one another in the frame's body."""
    items = frame.meta.get("messages")
    if not isinstance(items, list) or not items:
        raise InvalidRequest("messages must be a non-empty list")
    if len(items) > MAX_SEND_MANY:
        raise InvalidRequest(f"at most {MAX_SEND_MANY} messages per send_many")
    tx = _transaction(session, frame.meta)
    body = memoryview(frame.body)
    offset = 0
    messages: list[tuple[uuid.UUID, str, bytes]] = []
    keys: list[str | None] = []
    for item in items:
        if not isinstance(item, dict):
            raise InvalidRequest("each message must be an object")
        length = item.get("body_length")
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise InvalidRequest("body_length must be a whole number >= 0")
        if offset + length > len(body):
            raise InvalidRequest("the body lengths exceed the frame's body")
        handle = meta_uuid(item, "conversation_handle")
        assert handle is not None
        _check_own(session, handle, tx)
        messages.append(
            (
                handle,
                meta_str(item, "message_type", "DEFAULT"),
                bytes(body[offset : offset + length]),
            )
        )
        keys.append(meta_key(item))
        offset += length
    if offset != len(body):
        raise InvalidRequest("the body lengths do not add up to the frame's body")
    if tx is not None:
        if any(keys):
            raise InvalidRequest("idempotency keys are for SENDs outside a transaction")
        for handle, message_type, data in messages:
            tx.send(handle, message_type, data)
        return {"sequence_numbers": None}, b""
    sending = session.broker.engine.send_verbs
    return {"sequence_numbers": await sending.send_many(messages, keys)}, b""


def receive_args(
    session: Session, m: dict[str, Any]
) -> tuple[tuple[str, str | None, int, float], uuid.UUID | None, uuid.UUID | None, int]:
    """A RECEIVE's (queue, database, top, timeout), the conversation or conversation
    group it is limited to, and how many groups it may return, checked
    (``ReceiveVerbs`` refuses a handle and a group at once, or either with more groups
    than one, SPEC §6)."""
    top = _whole(m, "top")
    groups = _whole(m, "groups")  # its upper bound is ReceiveVerbs' (MAX_GROUPS)
    queue, database, timeout = _queue_args(session, m)
    handle = meta_uuid(m, "conversation_handle", required=False)
    group = meta_uuid(m, "conversation_group_id", required=False)
    return (queue, database, top, timeout), handle, group, groups


def _whole(m: dict[str, Any], key: str) -> int:
    """A whole number >= 1 of the meta (1 when absent)."""
    value = m.get(key, 1)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"{key} must be a whole number >= 1")
    return value


def _queue_args(session: Session, m: dict[str, Any]) -> tuple[str, str | None, float]:
    """The queue (one of the client's own, R-CLIENT-2), database and WAITFOR timeout of a
    RECEIVE or GET CONVERSATION GROUP, checked."""
    timeout = m.get("timeout", 0)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool):
        raise InvalidRequest("timeout must be a number of seconds")
    try:
        seconds = float(timeout)
    except OverflowError:  # an integer of hundreds of digits
        raise InvalidRequest("timeout must be a number of seconds a float holds") from None
    queue = meta_str(m, "queue")
    session.allowed.check_queue(queue)
    return queue, meta_database(m), seconds


async def _receive(session: Session, frame: ClientFrame) -> tuple[ReplyMeta, ReplyBody]:
    m = frame.meta
    args, handle, group, groups = receive_args(session, m)
    tx = _transaction(session, m)
    reply = ReceiveReply()
    withdrawal = session.withdrawal(frame.request_id)
    if tx is not None:
        rows = await tx.receive(
            *args, handle=handle, budget=reply, group=group, groups=groups, withdrawal=withdrawal
        )
    else:
        receiving = session.broker.engine.receive_verbs
        rows = await receiving.receive(
            *args, handle=handle, budget=reply, group=group, groups=groups, withdrawal=withdrawal
        )
    return reply.encode(rows)


async def _get_group(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    """GET CONVERSATION GROUP (SPEC §6): the group's id, or null when none came in time."""
    m = frame.meta
    args = _queue_args(session, m)
    tx = _transaction(session, m)
    withdrawal = session.withdrawal(frame.request_id)
    if tx is not None:
        group = await tx.get_conversation_group(*args, withdrawal=withdrawal)
    else:
        receiving = session.broker.engine.receive_verbs
        group = await receiving.get_conversation_group(*args, withdrawal=withdrawal)
    return {"conversation_group_id": None if group is None else str(group)}, b""


async def _end(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    m = frame.meta
    handle = meta_uuid(m, "conversation_handle")
    assert handle is not None
    code = _error_code(m)
    description = meta_str(m, "description", "")
    cleanup = meta_bool(m, "cleanup")
    tx = _transaction(session, m)
    _check_own(session, handle, tx)
    engine = session.broker.engine
    if tx is not None:
        tx.end_conversation(handle, code, description, cleanup)
    elif code is not None and not cleanup and engine.poison.holds(handle):
        # SPEC §6: END CONVERSATION WITH ERROR of a quarantined conversation ends its
        # quarantine, as end_quarantined does
        await engine.poison.end(handle, code, description)
    else:
        await engine.conversation_verbs.end_conversation(handle, code, description, cleanup)
    return {}, b""


def _error_code(m: dict[str, Any]) -> int | None:
    """END CONVERSATION's optional ``error_code``: an integer (its sign is checked by the
    verb, SPEC §6)."""
    code = m.get("error_code")
    if code is not None and (not isinstance(code, int) or isinstance(code, bool)):
        raise InvalidRequest("error_code must be an integer")
    return code


async def _release_quarantine(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    """A quarantined conversation's messages become receivable again (SPEC §6)."""
    handle = meta_uuid(frame.meta, "conversation_handle")
    assert handle is not None
    session.check_own(handle)
    released = await session.broker.engine.poison.release(handle)
    return {"released": released}, b""


async def _end_quarantined(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    """END CONVERSATION WITH ERROR of a quarantined conversation (SPEC §6)."""
    m = frame.meta
    handle = meta_uuid(m, "conversation_handle")
    assert handle is not None
    code = _error_code(m)
    if code is None:
        raise InvalidRequest("end_quarantined needs an error_code (greater than 0)")
    session.check_own(handle)
    await session.broker.engine.poison.end(handle, code, meta_str(m, "description", ""))
    return {}, b""


async def _begin_timer(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    m = frame.meta
    handle = meta_uuid(m, "conversation_handle")
    assert handle is not None
    timeout = m.get("timeout")
    if (
        not isinstance(timeout, int | float)
        or isinstance(timeout, bool)
        or not 0 <= timeout <= INT_MAX
    ):
        raise InvalidRequest(f"timeout must be a number of seconds, 0 to {INT_MAX}")
    tx = _transaction(session, m)
    _check_own(session, handle, tx)
    if tx is not None:
        tx.begin_conversation_timer(handle, float(timeout))
    else:
        await session.broker.engine.conversation_verbs.begin_conversation_timer(
            handle, float(timeout)
        )
    return {}, b""


async def _move(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    m = frame.meta
    handle = meta_uuid(m, "conversation_handle")
    group = meta_uuid(m, "conversation_group_id")
    assert handle is not None and group is not None
    tx = _transaction(session, m)
    _check_own(session, handle, tx)
    if tx is not None:
        tx.move_conversation(handle, group)
    else:
        await session.broker.engine.conversation_verbs.move_conversation(handle, group)
    return {}, b""


async def _alter_queue(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    broker = session.broker
    m = frame.meta
    status = m.get("status")
    if not isinstance(status, bool):
        raise InvalidRequest("status must be true (on) or false (off)")
    await broker.engine.poison.alter_queue(meta_str(m, "queue"), status, meta_database(m))
    return {}, b""


_ROUTE_FIELDS = (
    "name",
    "address",
    "remote_service_name",
    "broker_instance",
    "mirror_address",
    "lifetime",
)


def _route_fields(m: dict[str, Any], only_given: bool) -> dict[str, Any]:
    """The route's fields from a request; with ``only_given``, just those present (ALTER)."""
    fields = m.get("route")
    if not isinstance(fields, dict):
        raise InvalidRequest("route must be an object with the route's fields")
    unknown = set(fields) - set(_ROUTE_FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown route field(s): {', '.join(sorted(unknown))}")
    for key, value in fields.items():
        if value is not None and not isinstance(value, str | int | float):
            raise InvalidRequest(f"route field {key} must be a string or a number")
    return dict(fields) if only_given else {k: fields.get(k) for k in _ROUTE_FIELDS}


async def _create_route(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    broker = session.broker
    route = await broker.engine.router.create_route(
        meta_str(frame.meta, "database"), _route_fields(frame.meta, only_given=False)
    )
    return {"name": route.name}, b""


async def _alter_route(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    broker = session.broker
    m = frame.meta
    route = await broker.engine.router.alter_route(
        meta_str(m, "database"), meta_str(m, "name"), _route_fields(m, only_given=True)
    )
    return {"name": route.name}, b""


async def _drop_route(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    broker = session.broker
    await broker.engine.router.drop_route(
        meta_str(frame.meta, "database"), meta_str(frame.meta, "name")
    )
    return {}, b""


async def _explain(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    broker = session.broker
    m = frame.meta
    from_outside = meta_bool(m, "from_outside")
    database = (meta_database(m) or "msdb") if from_outside else meta_str(m, "database")
    result = broker.engine.router.explain(
        database,
        meta_str(m, "service"),
        meta_uuid(m, "broker_instance", required=False),
        from_outside,
    )
    return result, b""


async def _set_mirror_role(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    broker = session.broker
    m = frame.meta
    await broker.engine.router.set_mirror_role(meta_str(m, "database"), meta_str(m, "role"))
    return {}, b""


async def _view(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    return await client_views.view(session.broker, frame.meta)


async def _ping(session: Session, frame: ClientFrame) -> tuple[dict[str, Any], bytes]:
    broker = session.broker
    return {"instance": broker.instance_name, "pid": os.getpid()}, b""


FEATURES = (BEGIN_DIALOG_KEYS,)
"""What this daemon's requests offer beyond the first client protocol, named in the login's
answer (``features``) so that an SDK uses them only with a daemon that has them."""

OPERATIONS: dict[str, Handler] = {
    "begin_transaction": _begin_transaction,
    "commit": _commit,
    "rollback": _rollback,
    "begin_dialog": _begin_dialog,
    "send": _send,
    "send_many": _send_many,
    "move_conversation": _move,
    "receive": _receive,
    "get_conversation_group": _get_group,
    "end_conversation": _end,
    "begin_conversation_timer": _begin_timer,
    "release_quarantine": _release_quarantine,
    "end_quarantined": _end_quarantined,
    "alter_queue": _alter_queue,
    "create_route": _create_route,
    "alter_route": _alter_route,
    "drop_route": _drop_route,
    "explain": _explain,
    "set_mirror_role": _set_mirror_role,
    "view": _view,
    "ping": _ping,
}
