"""Numbers a client sends are bounded at the client port.

The design's security defaults: every size and count read from the wire is bounded. A
dialog's lifetime (R-DLG-9) and a conversation timer's timeout (R-DLG-11) are whole or
fractional seconds that the daemon adds to the clock and keeps in the endpoint; SQL
Server takes both as an INT of seconds. A value past that is refused with
``InvalidRequest``, and takes no effect: it must not become a storage failure, nor an
endpoint that breaks the ``conversation_endpoints`` view (R-PROTO-4) for every admin,
even after a restart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.errors import InvalidErrorCode, InvalidRequest
from tests.daemons import client_of, solo_broker


@pytest.mark.parametrize("lifetime", [2**31, 2**62, 10**30])
async def test_a_lifetime_past_an_int_of_seconds_is_refused(tmp_path: Path, lifetime: int) -> None:
    """R-DLG-9: BEGIN DIALOG with LIFETIME beyond 2**31 - 1 s is InvalidRequest; the
    endpoints view still reads, and 2**31 - 1 itself is taken."""
    async with solo_broker(tmp_path, "127.0.0.1") as broker:
        client = await client_of(broker)
        with pytest.raises(InvalidRequest, match="lifetime"):
            await client.begin_dialog("//solo/S1", "//solo/S2", lifetime=lifetime)
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2", lifetime=2**31 - 1)
        (endpoint,) = await client.conversation_endpoints()
        assert endpoint.conversation_handle == dialog.handle
        await client.close()


@pytest.mark.parametrize("timeout", [2.0**31, 1e20, 1e308])
async def test_a_timer_past_an_int_of_seconds_is_refused(tmp_path: Path, timeout: float) -> None:
    """R-DLG-11: BEGIN CONVERSATION TIMER with TIMEOUT beyond 2**31 - 1 s is
    InvalidRequest, in a transaction or not; the endpoints view still reads."""
    async with solo_broker(tmp_path, "127.0.0.1") as broker:
        client = await client_of(broker)
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        with pytest.raises(InvalidRequest, match="timeout"):
            await client.begin_conversation_timer(dialog.handle, timeout)
        with pytest.raises(InvalidRequest, match="timeout"):
            async with client.transaction() as tx:
                await tx.begin_conversation_timer(dialog.handle, timeout)
        await client.begin_conversation_timer(dialog.handle, 2**31 - 1)
        (endpoint,) = await client.conversation_endpoints()
        assert endpoint.dialog_timer is not None
        await client.close()


@pytest.mark.parametrize("code", [2**31, 10**30])
async def test_an_error_code_past_an_int_is_refused(tmp_path: Path, code: int) -> None:
    """SPEC §6 (END CONVERSATION WITH ERROR): a code beyond 2**31 - 1 is refused and the
    conversation is not ended; 2**31 - 1 itself ends it, and the far side's Error message
    carries it."""
    async with solo_broker(tmp_path, "127.0.0.1") as broker:
        client = await client_of(broker)
        dialog = await client.begin_dialog("//solo/S1", "//solo/S2")
        await dialog.send("DEFAULT", b"first")
        with pytest.raises(InvalidErrorCode, match="at most 2147483647"):
            await client.end_conversation(dialog.handle, error_code=code, description="x")
        (first,) = await client.receive("Q2", timeout=5)
        await client.end_conversation(dialog.handle, error_code=2**31 - 1, description="max")
        (error,) = await client.receive("Q2", timeout=5)
        await client.close()
        assert first.message_body == b"first"
        assert error.is_error and b"<Code>2147483647</Code>" in error.message_body
