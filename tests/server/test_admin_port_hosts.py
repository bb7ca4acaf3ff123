"""The admin port on a loopback address answers only requests that name it as such
(R-OPS-1): a web page whose own name is made to resolve to 127.0.0.1 (DNS rebinding)
must not read the port's pages from an operator's browser.

A real daemon on 127.0.0.18, its admin port on 127.0.0.18:8022 (the default on
loopback); requests are written by hand on a socket, so that the ``Host`` header is
exactly the test's.
"""

from __future__ import annotations

import asyncio
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
