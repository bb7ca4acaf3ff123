"""TLS on the client listener (R-CLIENT-1: ``[client] tls_certificate``, ``tls_private_key``).

The standard library's ``ssl``, TLS 1.2 or later only; asyncio's ``create_server``
does the handshake before the listener sees the connection, bounded by the login
timeout.
"""

from __future__ import annotations

import ssl

from brokerd.config import BrokerConfig
from brokerd.errors import ConfigError


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
