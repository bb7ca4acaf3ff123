"""A hostile broker for tests: a valid deployment-CA certificate, the sans-I/O protocol
codecs, and a real TCP connection to a daemon's port 4022.

It completes the adjacent-broker handshake like any broker, then sends whatever dialog
frames the test builds (forged messages, acknowledgements, errors).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from brokerd.tools import certs, example
from protocol import dialog, events
from protocol.connection import BrokerConnection, ConnectionSettings, Role
from protocol.dialog import FLAG_INITIATOR, FLAG_SEQUENCED, DialogHeader


class HostileBroker:
    """An authenticated adjacent-broker connection that sends what it is told to."""

    def __init__(self, cert_dir: Path, name: str = "mallory") -> None:
        ca = certs.read_pair(cert_dir, "ca")
        issued = certs.issue_instance(ca, name, alt_names=["127.0.0.9"])
        self.name = name
        self.conn = BrokerConnection(
            Role.INITIATOR, ConnectionSettings(certs.identity_for(issued, ca)), datetime.now(UTC)
        )
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.received: list[events.Event] = []

    async def connect(
        self,
        host: str,
        port: int = 4022,
        timeout: float = 10.0,
        receive_buffer: int | None = None,
    ) -> None:
        """Connect and complete the handshake. ``receive_buffer`` makes the socket's
        receive buffer that small (and this side's own buffering as small): a peer that
        then stops reading fills the daemon's side after a few kilobytes."""
        if receive_buffer is None:
            self.reader, self.writer = await asyncio.open_connection(host, port)
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
            self.reader, self.writer = await asyncio.open_connection(
                sock=sock, limit=receive_buffer
            )
        self.writer.write(self.conn.start())
        deadline = time.monotonic() + timeout
        while not any(isinstance(e, events.HandshakeComplete) for e in self.received):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("the hostile broker's handshake did not complete")
            data = await asyncio.wait_for(self.reader.read(65536), left)
            if not data:
                raise AssertionError(f"connection closed during the handshake: {self.received}")
            self.received += self.conn.receive_data(data)
            out = self.conn.data_to_send()
            if out:
                self.writer.write(out)
        await self.writer.drain()

    async def send_fragment(self, header: DialogHeader, body: bytes) -> None:
        assert self.writer is not None
        payload = dialog.encode_fragment(header, body)
        self.writer.write(self.conn.send(events.Fragment(payload)))
        await self.writer.drain()

    async def send_fragments(self, fragments: list[tuple[DialogHeader, bytes]]) -> None:
        """Each fragment in a frame of its own, all written at once: on loopback they
        reach the daemon in one read, so it handles them in one turn."""
        assert self.writer is not None
        frames = [
            self.conn.send(events.Fragment(dialog.encode_fragment(header, body)))
            for header, body in fragments
        ]
        self.writer.write(b"".join(frames))
        await self.writer.drain()

    async def send_acks(self, headers: list[DialogHeader]) -> None:
        assert self.writer is not None
        self.writer.write(self.conn.send(events.Ack(dialog.encode_acks(headers))))
        await self.writer.drain()

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()


def order_message(
    instance: uuid.UUID,
    cid: uuid.UUID,
    seq: int,
    body: bytes,
    message_type: str = example.ORDER,
    flags: int = 0,
) -> tuple[DialogHeader, bytes]:
    """Message ``seq`` of dialog ``cid``, whole, as the example shop's broker ``instance``
    sends it to the warehouse (a hostile peer's frames are built from it)."""
    header = DialogHeader(
        cid,
        example.SHOP_SERVICE,
        example.WAREHOUSE_SERVICE,
        instance,
        None,
        example.CONTRACT,
        message_type,
        flags=FLAG_SEQUENCED | FLAG_INITIATOR | flags,
        sequence_number=seq,
        message_length=len(body),
    )
    return header, body


def cut(header: DialogHeader, body: bytes, size: int) -> list[tuple[DialogHeader, bytes]]:
    """A whole message's fragments cut at ``size`` bytes, as a sender with that
    ``limits.fragment_size`` sends them."""
    count = max(1, -(-len(body) // size))
    return [
        (
            header._replace(
                fragment_index=i,
                fragment_count=count,
                fragment_offset=i * size,
                message_length=len(body),
            ),
            body[i * size : (i + 1) * size],
        )
        for i in range(count)
    ]
