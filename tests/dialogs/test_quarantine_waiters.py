"""A RECEIVE that waits on one conversation when poison-message handling quarantines it
(SPEC §6, Decision on poison messages): RECEIVE naming a quarantined conversation fails
with ``conversation_quarantined`` rather than wait for messages that cannot come, also
when the quarantine comes while it waits.

One daemon (a subprocess on 127.0.24.10:4022, real TCP and SQLite) of ``Solo``: the
initiator ``//solo/S1`` (queue Q1) sends to ``//solo/S2`` (queue Q2), whose
``poison_rollbacks`` is 2.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient
from protocol.errors import ConversationQuarantined
from tests.daemons import solo_daemon, wait_until

HOST = "127.0.24.10"


async def _target(client: BrokerClient) -> uuid.UUID:
    """A dialog S1 -> S2 with one message ready in Q2; the target's handle."""
    initiator = await client.begin_dialog("//solo/S1", "//solo/S2")
    await client.send(initiator, "DEFAULT", b"poison")

    async def ready() -> bool:
        rows = await client.view("queues")
        return next(r["ready_messages"] for r in rows if r["queue"] == "Q2") == 1

    await wait_until(ready)
    rows = await client.view("conversation_endpoints")
    return uuid.UUID(next(r["conversation_handle"] for r in rows if not r["is_initiator"]))


async def test_a_receive_waiting_on_a_conversation_fails_when_it_is_quarantined(
    tmp_path: Path,
) -> None:
    """A transaction holds the conversation's message (its group locked) while another
    client's RECEIVE of that conversation waits; the transaction's rollback is the
    message's second and quarantines the conversation: the waiting RECEIVE fails with
    ``conversation_quarantined`` at once, not after its WAITFOR, nor never."""
    async with solo_daemon(tmp_path, HOST, "poison_rollbacks = 2") as (deployment, client):
        target = await _target(client)
        tx = await client.begin_transaction()
        assert len(await tx.receive("Q2", timeout=5)) == 1
        await tx.rollback(reason="first")
        tx = await client.begin_transaction()
        assert len(await tx.receive("Q2", timeout=5)) == 1
        async with await deployment.daemons["solo"].client() as other:
            waiting = asyncio.create_task(
                other.receive("Q2", conversation_handle=target, timeout=30)
            )

            async def waits() -> bool:
                rows = await client.view("queues")
                return next(r["readers"] for r in rows if r["queue"] == "Q2") == 2

            await wait_until(waits)
            await tx.rollback(reason="second")
            with pytest.raises(ConversationQuarantined):
                await asyncio.wait_for(waiting, 10)
