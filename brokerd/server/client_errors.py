"""What an ERROR frame of the client port says of an exception: its class name, its code
(``protocol.errors.for_code``, docs/errors.md), its message and whether a retry may
succeed.

May import: ``protocol``, ``brokerd.errors``.
"""

from __future__ import annotations

from typing import Any

from brokerd.errors import StoreError
from protocol.errors import BrokerError, InternalError, RemoteError, StorageFailure


def error_meta(exc: BaseException) -> dict[str, Any]:
    """The ERROR frame's meta: the class name, its code (``protocol.errors.for_code``),
    the message and whether a retry may succeed."""
    if isinstance(exc, RemoteError):
        code = exc.code
    elif isinstance(exc, StoreError):
        code = StorageFailure.code
    elif isinstance(exc, BrokerError):
        code = RemoteError.code
    else:
        code = InternalError.code
    return {
        "error": type(exc).__name__,
        "code": code,
        "message": str(exc),
        "retriable": bool(getattr(exc, "retriable", False)),
    }
