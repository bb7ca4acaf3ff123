"""TLS on the client listener (R-CLIENT-1: ``[client] tls_certificate``, ``tls_private_key``).

The standard library's ``ssl``, TLS 1.2 or later only. A TLS port accepts its
connections in the clear and upgrades each (``loop.start_tls``, :class:`TlsAccept`), so
that a connection is counted among those waiting for their login from its TCP accept,
its handshake included (``client_listener.MAX_PENDING_LOGINS``): a flood of
connections that never finish a handshake churns among itself as one that never logs in
does. The handshake is bounded by the login timeout.

May import: ``brokerd.config``, ``brokerd.errors``; ``brokerd.server.client_listener``
for its types only.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING, cast

from brokerd.config import BrokerConfig
from brokerd.errors import ConfigError

if TYPE_CHECKING:
    from brokerd.server.client_listener import ClientSession

log = logging.getLogger("brokerd.server.client_tls")

EARLY_MOST = 64 * 1024
"""Bytes of a handshake read before the TLS layer takes the connection over, at most."""


def server_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """The listener's TLS context; None when the client port is plain TCP (loopback)."""
    client = config.client
    if client.tls_certificate is None or client.tls_private_key is None:
        return None
    for key, path in (
        ("client.tls_certificate", client.tls_certificate),
        ("client.tls_private_key", client.tls_private_key),
    ):
        if not path.is_file():
            raise ConfigError(config.path, key, f"file {path} does not exist")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(client.tls_certificate, client.tls_private_key)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(
            config.path, "client.tls_certificate", f"cannot load the certificate and key: {exc}"
        ) from None
    return context


class TlsAccept(asyncio.BufferedProtocol):
    """A connection to a TLS client port until its handshake is done: its session counts
    it from the TCP accept (``ClientSession.accepted``, which may abort it), and gets
    the TLS transport once the handshake is done (``connection_made``), or
    ``connection_lost`` when it failed, took over ``timeout`` seconds or was cut."""

    def __init__(self, session: ClientSession, context: ssl.SSLContext, timeout: float) -> None:
        self.session = session
        self.context = context
        self.timeout = timeout
        self._buffer = bytearray(EARLY_MOST)
        self._early = 0
        """Bytes read into :attr:`_buffer` before the TLS layer took the connection over."""
        self._lost = False
        self._raw: asyncio.Transport | None = None
        self._handshake: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw = self._raw = cast(asyncio.Transport, transport)
        raw.pause_reading()  # asyncio's loop reads nothing until the TLS layer resumes it
        self.session.accepted(raw.abort)
        self._handshake = asyncio.get_running_loop().create_task(self._upgrade(raw))

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self._buffer)[self._early :]

    def buffer_updated(self, nbytes: int) -> None:
        """uvloop starts reading a connection after ``connection_made``, before the TLS
        layer can take it over: what comes then is kept for it (:meth:`_replay`)."""
        self._early += nbytes
        if self._raw is not None:
            self._raw.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        """Lost before the TLS layer took the connection over."""
        self._lost = True
        self.session.connection_lost(exc)

    async def _upgrade(self, raw: asyncio.Transport) -> None:
        if self._lost:
            return
        loop = asyncio.get_running_loop()
        if self._early:  # runs once start_tls has put its TLS layer on the connection
            loop.call_soon(self._replay, raw, bytes(self._buffer[: self._early]))
        try:
            tls = await loop.start_tls(
                raw,
                self.session,
                self.context,
                server_side=True,
                ssl_handshake_timeout=self.timeout,
            )
        except Exception as exc:  # a bad handshake, one too slow, a connection cut
            log.debug("client connection closed in its TLS handshake: %r", exc)
            tls = None
        if tls is None:  # the TLS layer tells the session nothing of a failed handshake
            self.session.connection_lost(None)
            return
        self.session.connection_made(tls)

    @staticmethod
    def _replay(raw: asyncio.Transport, data: bytes) -> None:
        """Give the TLS layer, before it starts its handshake, the bytes read before it
        took the connection over."""
        # asyncio's and uvloop's TLS layers are both buffered protocols (uvloop's is
        # not an asyncio.BufferedProtocol by class)
        layer = cast(asyncio.BufferedProtocol, raw.get_protocol())
        while data:
            buffer = memoryview(layer.get_buffer(len(data)))
            n = min(len(buffer), len(data))
            buffer[:n] = data[:n]
            layer.buffer_updated(n)
            data = data[n:]
