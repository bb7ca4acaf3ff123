"""A client of the daemon's client port without the SDK: the wire's frames as a test
writes them, to send what the SDK never would."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from brokerd.server.daemon import Broker
from protocol.client_wire import (
    ClientFrame,
    ClientFrameKind,
    ClientFrameReader,
    auth_proof,
    encode_frame,
)


async def logged_in(broker: Broker) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection to ``broker``'s client port, logged in with the daemon's token
    (request 1 was the login)."""
    config = broker.config.client
    reader, writer = await asyncio.open_connection(config.host, config.port)
    frames = ClientFrameReader()
    challenge: list[ClientFrame] = []
    while not challenge:
        challenge = frames.feed(await reader.read(4096))
    nonce = bytes.fromhex(challenge[0].meta["nonce"])
    token = Path(config.token_file).read_text().strip().encode()
    login = {"op": "login", "user": "app", "proof": auth_proof(token, nonce, "app")}
    writer.write(encode_frame(ClientFrame(ClientFrameKind.REQUEST, 1, login)))
    answer: list[ClientFrame] = []
    while not answer:
        answer = frames.feed(await reader.read(4096))
    assert answer[0].kind is ClientFrameKind.RESPONSE, answer[0]
    return reader, writer


def request(request_id: int, meta: dict[str, Any], body: bytes = b"") -> bytes:
    """A REQUEST frame's bytes, as the wire carries them."""
    return encode_frame(ClientFrame(ClientFrameKind.REQUEST, request_id, meta, body))
