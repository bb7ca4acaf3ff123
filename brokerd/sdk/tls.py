"""TLS for the SDK's connection to a client listener that has ``[client] tls_certificate``.

The standard library's ``ssl``: the daemon's certificate must chain to the given CA
(for a deployment made with ``brokerd certs``, its ``ca.pem``) and name the host
dialled (a subject alternative name, ``brokerd certs instance --san HOST``); TLS 1.2
or later only.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from protocol.errors import ClientError


def client_context(ca_file: str | Path) -> ssl.SSLContext:
    """A context that trusts the CA in ``ca_file`` and checks the server's host name."""
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise ClientError(f"cannot load the CA certificate {ca_file}: {exc}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def describe_failure(exc: BaseException) -> str | None:
    """A readable reason for a TLS failure while connecting; None if it is not one."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"the daemon's TLS certificate is not trusted ({exc.verify_message}): "
            "pass the CA that issued it (tls_ca_file=) and dial a host name or address "
            "the certificate names"
        )
    if isinstance(exc, ssl.SSLError):
        return f"the TLS handshake failed ({exc.reason or exc}): is the client port using TLS?"
    return None
