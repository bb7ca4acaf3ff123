"""The project's one error tree.

Every error brokerd raises on purpose derives from :class:`BrokerError`. The
protocol layer splits its own failures the way h11 does:

* :class:`LocalProtocolError`: *we* asked for something illegal (sending before
  the handshake finished, a value that does not fit its field). A bug on our side.
* :class:`RemoteProtocolError`: the *peer* sent something illegal (bad magic, a
  frame over the size limit, an untrusted certificate). Raised by the
  connection, it means the connection is dead and ``close_code`` says what was
  told to the peer; raised by a dialog codec (``protocol/dialog.py``) over an
  authenticated payload, it concerns that one payload and the caller decides.

construct's own exceptions never leave ``protocol/``: the codecs wrap them.
Later layers (configuration, store, dialogs, SDK) add their subclasses of
:class:`BrokerError` next to their code, all under this one root.
"""

from __future__ import annotations

import enum
from typing import Any


class CloseCode(enum.IntEnum):
    """Why a connection is closed or refused; carried in CLOSE frames."""

    NORMAL = 0
    IDLE = 1
    SHUTDOWN = 2
    PROTOCOL_ERROR = 10
    FRAME_TOO_LARGE = 11
    VERSION_MISMATCH = 12
    UNTRUSTED_CERTIFICATE = 13
    AUTHENTICATION_FAILED = 14
    ENCRYPTION_MISMATCH = 15
    PEER_NAME_MISMATCH = 16
    INTEGRITY = 17


class BrokerError(Exception):
    """Root of every error brokerd raises deliberately."""

    retriable: bool = False
    """True when the same request may succeed later without any change."""


class ProtocolError(BrokerError):
    """A wire-protocol failure (adjacent-broker or dialog layer)."""


class LocalProtocolError(ProtocolError):
    """This side tried to do something the protocol forbids."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids; the connection cannot go on."""

    def __init__(self, message: str, close_code: CloseCode = CloseCode.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.close_code = close_code
        self.events: list[Any] = []
        """Events decoded, in the same receive_data call, before the failure."""


class HandshakeRefused(RemoteProtocolError):
    """This side refused the peer during the handshake (certificate, proof, mode, version)."""


class ReassemblyError(ProtocolError):
    """Fragments that cannot belong to one message, or a message over the size limit."""


class ReassemblyFull(ReassemblyError):
    """The reassembler's memory bounds are reached; refuse the fragment unacknowledged."""

    retriable = True


class ClientError(BrokerError):
    """The SDK's connection to a daemon failed or was closed."""

    retriable = True


class AuthenticationFailed(ClientError):
    """The daemon's client listener refused the credentials."""

    retriable = False


class RemoteError(BrokerError):
    """An error the daemon reported to the SDK; ``kind`` is the daemon-side class name."""

    def __init__(self, kind: str, message: str, retriable: bool = False) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.remote_message = message
        self.retriable = retriable
