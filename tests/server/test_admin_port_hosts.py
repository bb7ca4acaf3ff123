"""The admin port on a loopback address answers only requests that name it as such
(R-OPS-1): a web page whose own name is made to resolve to 127.0.0.1 (DNS rebinding)
must not read the port's pages from an operator's browser.

A real daemon on 127.0.0.18, its admin port on 127.0.0.18:8022 (the default on
loopback); requests are written by hand on a socket, so that the ``Host`` header is
exactly the test's.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from tests.daemons import solo_broker

HOST = "127.0.0.18"


async def _status(host_header: str | None, path: str = "/healthz") -> int:
    reader, writer = await asyncio.open_connection(HOST, 8022)
    try:
        head = f"GET {path} HTTP/1.1\r\n" if host_header is not None else f"GET {path} HTTP/1.0\r\n"
        if host_header is not None:
            head += f"Host: {host_header}\r\n"
        writer.write((head + "Connection: close\r\n\r\n").encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 10)
        return int(line.split()[1])
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("host_header", "status"),
    [
        ("127.0.0.18:8022", 200),
        ("127.0.0.1:8022", 200),
        ("localhost:8022", 200),
        ("LOCALHOST", 200),
        ("[::1]:8022", 200),
        (None, 200),  # HTTP/1.0 names no host
        ("attacker.example:8022", 421),
        ("attacker.example", 421),
        ("127.0.0.18.attacker.example", 421),
    ],
)
async def test_a_loopback_admin_port_answers_only_to_its_own_names(
    tmp_path: Path, host_header: str | None, status: int
) -> None:
    """R-OPS-1: pages are read by IP address or ``localhost``; a request naming another
    host (a rebinding page's) is refused with 421 and nothing of the page."""
    async with solo_broker(tmp_path, HOST):
        assert await _status(host_header) == status
        assert await _status(host_header, "/console.json") == status


WILDCARD_ADMIN = """
[admin]
listen = "0.0.0.0:8122"
names = ["Broker.Example.org."]
"""


async def _status_on(port: int, host_header: str) -> int:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(
            f"GET /healthz HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 10)
        return int(line.split()[1])
    finally:
        writer.close()


async def test_an_admin_port_on_any_address_answers_only_to_its_names(tmp_path: Path) -> None:
    """R-OPS-1: the check holds on every address, not only on loopback (a rebinding page
    can resolve its name to an address of the operator's network as well): an admin port
    on the wildcard address answers an IP address, ``localhost``, this machine's host
    name and the names of ``[admin] names`` (any case, a final dot or not), and refuses
    another with 421."""
    machine = socket.gethostname()
    async with solo_broker(tmp_path, HOST, WILDCARD_ADMIN):
        for name in (f"{HOST}:8122", "localhost", machine, "broker.example.ORG:8122"):
            assert await _status_on(8122, name) == 200, name
        for name in ("attacker.example", "example.org", "broker.example.org.attacker.example"):
            assert await _status_on(8122, name) == 421, name


async def test_an_admin_port_told_any_name_answers_any(tmp_path: Path) -> None:
    """R-OPS-1: ``names = ["*"]`` turns the check off (a proxy in front checks names)."""
    extra = '[admin]\nlisten = "0.0.0.0:8122"\nnames = ["*"]\n'
    async with solo_broker(tmp_path, HOST, extra):
        assert await _status_on(8122, "attacker.example") == 200
