"""Requests at the edges of what the client port takes: numbers past what a field can
hold, a field of the wrong type, an application token in a transaction of its own,
requests pipelined in one write, and a transaction's state (SPEC §6, R-CLIENT-2,
docs/errors.md).

Each request is written as raw frames (``protocol.client_wire``) to a daemon run in the
test's process on 127.0.0.187, logged in with the admin token or an application token.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from brokerd.server.client_listener import WRITE_HIGH
from brokerd.server.daemon import Broker
from brokerd.tools.launcher import Deployment
from protocol.client_wire import (
    ClientFrame,
    ClientFrameKind,
    ClientFrameReader,
    auth_proof,
    encode_frame,
)
from tests.daemons import SOLO_DATABASE, in_process

HOST = "127.0.0.187"
TOKENS = """
[[client.token]]
name = "one"
file = "tokens/one.token"
role = "application"
services = ["//solo/S1"]
queues = ["Q1"]
"""


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    daemon = Deployment(tmp_path).add("solo", HOST, SOLO_DATABASE, client_extra=TOKENS)
    async with in_process(daemon.config_path) as running:
        yield running


class Raw:
    """A logged-in connection that writes frames as they are and reads every answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.wire = ClientFrameReader()
        self.answers: dict[int, ClientFrame] = {}
        self.next_id = 2

    @classmethod
    async def login(cls, broker: Broker, user: str = "admin") -> Raw:
        config = broker.config.client
        reader, writer = await asyncio.open_connection(config.host, config.port)
        raw = cls(reader, writer)
        (challenge,) = await raw._frames()
        nonce = bytes.fromhex(challenge.meta["nonce"])
        path = config.token_file
        for token in config.tokens:
            if token.name == user:
                path = token.file
        secret = Path(path).read_text().strip().encode()
        login = {"op": "login", "user": user, "proof": auth_proof(secret, nonce, user)}
        writer.write(encode_frame(ClientFrame(ClientFrameKind.REQUEST, 1, login)))
        (answer,) = await raw._frames()
        assert answer.kind is ClientFrameKind.RESPONSE, answer
        return raw

    async def _frames(self) -> list[ClientFrame]:
        frames: list[ClientFrame] = []
        while not frames:
            data = await asyncio.wait_for(self.reader.read(1 << 20), 10)
            assert data, "the daemon closed the connection"
            frames = self.wire.feed(data)
        return frames

    async def pipeline(self, *requests: tuple[dict[str, Any], bytes]) -> list[ClientFrame]:
        """Write ``requests`` in one write; their answers, in the requests' order."""
        ids = list(range(self.next_id, self.next_id + len(requests)))
        self.next_id += len(requests)
        self.writer.write(
            b"".join(
                encode_frame(ClientFrame(ClientFrameKind.REQUEST, i, meta, body))
                for i, (meta, body) in zip(ids, requests, strict=True)
            )
        )
        while not all(i in self.answers for i in ids):
            for frame in await self._frames():
                assert frame.request_id not in self.answers, f"answered twice: {frame}"
                self.answers[frame.request_id] = frame
        return [self.answers[i] for i in ids]

    async def call(self, meta: dict[str, Any], body: bytes = b"") -> ClientFrame:
        (answer,) = await self.pipeline((meta, body))
        return answer

    async def ok(self, meta: dict[str, Any], body: bytes = b"") -> dict[str, Any]:
        answer = await self.call(meta, body)
        assert answer.kind is ClientFrameKind.RESPONSE, (meta, answer.meta)
        return answer.meta

    def close(self) -> None:
        self.writer.close()


def code(answer: ClientFrame) -> str:
    assert answer.kind is ClientFrameKind.ERROR, answer
    return str(answer.meta["code"])


DIALOG = {"op": "begin_dialog", "from_service": "//solo/S1", "to_service": "//solo/S2"}


@pytest.mark.parametrize("op", ["receive", "get_conversation_group"])
@pytest.mark.parametrize("timeout", [10**309, -(10**400)], ids=["huge", "huge_negative"])
async def test_a_wait_past_a_float_is_invalid_not_internal(
    broker: Broker, op: str, timeout: int
) -> None:
    """SPEC §6: a RECEIVE's or GET CONVERSATION GROUP's timeout is a number of seconds; an
    integer no float holds is ``invalid_request``, not an ``internal_error``, in a
    transaction or not; the connection goes on."""
    raw = await Raw.login(broker)
    tx = (await raw.ok({"op": "begin_transaction"}))["transaction"]
    plain, in_tx = await raw.pipeline(
        ({"op": op, "queue": "Q1", "timeout": timeout}, b""),
        ({"op": op, "queue": "Q1", "timeout": timeout, "transaction": tx}, b""),
    )
    assert (code(plain), code(in_tx)) == ("invalid_request", "invalid_request")
    assert (await raw.ok({"op": op, "queue": "Q1", "timeout": 0})) is not None
    raw.close()


async def test_top_past_any_count_is_taken_as_everything(broker: Broker) -> None:
    """SPEC §6: RECEIVE TOP of a number far past any queue's size returns what is ready
    (a typed answer, never an ``internal_error``)."""
    raw = await Raw.login(broker)
    handle = (await raw.ok(DIALOG))["conversation_handle"]
    await raw.ok({"op": "send", "conversation_handle": handle}, b"m")
    for top in (2**63, 10**30):
        answer = await raw.call({"op": "receive", "queue": "Q2", "top": top})
        assert answer.kind is ClientFrameKind.RESPONSE or code(answer) == "invalid_request"
    raw.close()


async def test_an_application_uses_a_dialog_it_began_in_its_transaction(broker: Broker) -> None:
    """R-CLIENT-2 and SPEC §6: a dialog begun in a transaction may be used in it at once;
    an application token that began it from its own service may SEND (alone or in a
    send_many), set its timer, move it and end it there, as an admin token may."""
    raw = await Raw.login(broker, "one")
    tx = (await raw.ok({"op": "begin_transaction"}))["transaction"]
    handle = (await raw.ok({**DIALOG, "transaction": tx}))["conversation_handle"]
    one = {"conversation_handle": handle, "transaction": tx}
    many = {"conversation_handle": handle, "message_type": "DEFAULT", "body_length": 1}
    answers = await raw.pipeline(
        ({"op": "send", **one}, b"a"),
        ({"op": "send_many", "messages": [many], "transaction": tx}, b"b"),
        ({"op": "begin_conversation_timer", "timeout": 60, **one}, b""),
        ({"op": "move_conversation", "conversation_group_id": str(uuid.uuid4()), **one}, b""),
        ({"op": "end_conversation", **one}, b""),
        ({"op": "commit", "transaction": tx}, b""),
    )
    assert [a.kind for a in answers] == [ClientFrameKind.RESPONSE] * 6, [a.meta for a in answers]
    assert answers[-1].meta["sequence_numbers"] == [1, 2]
    raw.close()


async def test_a_rollback_of_a_transaction_committing_is_refused(broker: Broker) -> None:
    """docs/errors.md (``transaction_invalid``): a ROLLBACK that reaches a transaction while
    its COMMIT is under way is refused; the COMMIT's outcome stands, and no answer says the
    transaction was rolled back when it committed."""
    raw = await Raw.login(broker)
    handle = (await raw.ok(DIALOG))["conversation_handle"]
    tx = (await raw.ok({"op": "begin_transaction"}))["transaction"]
    await raw.ok({"op": "send", "conversation_handle": handle, "transaction": tx}, b"a")
    committed, rolled_back = await raw.pipeline(
        ({"op": "commit", "transaction": tx}, b""),
        ({"op": "rollback", "transaction": tx}, b""),
    )
    assert committed.kind is ClientFrameKind.RESPONSE, committed.meta
    assert code(rolled_back) == "transaction_invalid"
    received = await raw.ok({"op": "receive", "queue": "Q2", "timeout": 5})
    assert [m["body_length"] for m in received["messages"]] == [1]
    raw.close()


@pytest.mark.parametrize("cleanup", ["false", "no", 0, 1, [], {}])
async def test_cleanup_must_be_a_boolean(broker: Broker, cleanup: object) -> None:
    """SPEC §6: END CONVERSATION WITH CLEANUP ends a conversation without telling the far
    side, so ``cleanup`` is true or false: anything else (the text "false", a number) is
    ``invalid_request`` and the conversation goes on."""
    raw = await Raw.login(broker)
    handle = (await raw.ok(DIALOG))["conversation_handle"]
    answer = await raw.call(
        {"op": "end_conversation", "conversation_handle": handle, "cleanup": cleanup}
    )
    assert code(answer) == "invalid_request"
    await raw.ok({"op": "send", "conversation_handle": handle}, b"still open")
    raw.close()


async def test_pipelined_sends_are_numbered_in_the_order_written(broker: Broker) -> None:
    """R-DLG-1 and SPEC §6: a send_many and a SEND on one conversation, written in that
    order in one write, are numbered in that order."""
    raw = await Raw.login(broker)
    handle = (await raw.ok(DIALOG))["conversation_handle"]
    item = {"conversation_handle": handle, "message_type": "DEFAULT", "body_length": 5}
    many, one = await raw.pipeline(
        ({"op": "send_many", "messages": [item]}, b"first"),
        ({"op": "send", "conversation_handle": handle}, b"second"),
    )
    assert (many.meta["sequence_numbers"], one.meta["sequence_number"]) == ([1], 2)
    raw.close()


async def test_a_send_pipelined_after_end_conversation_is_refused(broker: Broker) -> None:
    """SPEC §6: after a local END CONVERSATION the application cannot send on it; a SEND
    written right after the END, in the same write, is refused, and the far side gets
    nothing after the EndDialog."""
    raw = await Raw.login(broker)
    handle = (await raw.ok(DIALOG))["conversation_handle"]
    ended, sent = await raw.pipeline(
        ({"op": "end_conversation", "conversation_handle": handle}, b""),
        ({"op": "send", "conversation_handle": handle}, b"late"),
    )
    assert ended.kind is ClientFrameKind.RESPONSE, ended.meta
    assert sent.kind is ClientFrameKind.ERROR, sent.meta
    raw.close()


async def test_views_pipelined_and_never_read_hold_a_bounded_backlog(broker: Broker) -> None:
    """A client that pipelines page after page of a view and reads none of the replies
    holds about WRITE_HIGH of the daemon's memory and one page more, not a page per
    request: each view waits for the replies before it to drain. Every page is answered
    once the client reads."""
    raw = await Raw.login(broker)
    handle = (await raw.ok({**DIALOG, "to_service": "//nowhere/S"}))["conversation_handle"]
    item = {"conversation_handle": handle, "message_type": "DEFAULT", "body_length": 1}
    await raw.ok({"op": "send_many", "messages": [item] * 1000}, b"x" * 1000)
    page = await raw.call({"op": "view", "name": "transmission_queue", "limit": 1000})
    assert page.meta["rows_in_body"] == 1000 and len(page.body) > 200_000
    request = {"op": "view", "name": "transmission_queue", "limit": 1000}
    raw.writer.write(
        b"".join(
            encode_frame(ClientFrame(ClientFrameKind.REQUEST, 1000 + n, request))
            for n in range(100)
        )
    )
    (session,) = broker.client_sessions
    most = 0
    for _ in range(200):
        await asyncio.sleep(0.01)
        assert session.transport is not None
        most = max(most, session.transport.get_write_buffer_size() + session._out_bytes)
    answered: list[ClientFrame] = []
    while len(answered) < 100:
        answered += await raw._frames()
    raw.close()
    assert most < WRITE_HIGH + 2 * len(page.body), most
    assert sorted(a.request_id for a in answered) == list(range(1000, 1100))
    assert {a.meta["rows_in_body"] for a in answered} == {1000}
