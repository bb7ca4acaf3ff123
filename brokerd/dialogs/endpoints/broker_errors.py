"""The Error messages the broker makes itself (SPEC §6): their codes and their XML body.

Pure: no I/O, no engine state.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

ERROR_NS = "http://schemas.microsoft.com/SQL/ServiceBroker/Error"
CODE_SERVICE_NOT_FOUND = -8425
CODE_CONTRACT_NOT_SUPPORTED = -8408
CODE_CONVERSATION_NOT_FOUND = -8426
"""A message for a conversation whose endpoint on this side is gone (SPEC §5)."""
CODE_MESSAGE_TYPE_REFUSED = -8457
CODE_LIFETIME_EXPIRED = -8489
CODE_VALIDATION_FAILED = -9615
CODE_MESSAGE_TOO_LARGE = -9617
CODE_DIALOG_SECURITY = -28000
"""The target cannot take a dialog under dialog security (R-DLG-14): brokerd's own code."""


def error_body(code: int, description: str) -> bytes:
    """The XML body of an Error message (SPEC §6)."""
    return (
        f'<?xml version="1.0"?><Error xmlns="{ERROR_NS}"><Code>{code}</Code>'
        f"<Description>{escape(description)}</Description></Error>"
    ).encode()
