"""Trace events of durable changes are written at the commit that makes the change, never
before it (R-TRACE-1): a commit that fails leaves no event of a change the file does not
hold, so that the trace says, after a SIGKILL or a failed write, what the database holds.

The broker whose commit fails runs in the test's process, so that the test can make its
database refuse writes: ``PRAGMA query_only`` on the committer's own connection makes
every write fail with SQLITE_READONLY, as a file that cannot be written does.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.server.daemon import Broker
from brokerd.tools import example
from brokerd.traces.writer import read_events, segment_files
from protocol.errors import RemoteError
from tests.daemons import FAST_RETRY, client_of, in_process, running, solo_broker, wait_until
from tests.disks import read_only

SOLO = "127.0.0.15"
ALPHA, BETA = "127.0.0.16", "127.0.0.17"


async def _events(broker: Broker, conversation: uuid.UUID) -> list[dict[str, Any]]:
    """The events of ``conversation`` that ``broker`` has written so far (flushed first)."""
    await broker.trace.flush()
    return [
        e
        for e in read_events(segment_files([broker.trace.config.directory]))
        if e.get("conversation_id") == str(conversation)
    ]


async def _conversation(broker: Broker, handle: uuid.UUID) -> uuid.UUID:
    rows = await broker.databases["Solo"].store.query(
        "SELECT conversation_id FROM conversation_endpoints WHERE conversation_handle = ?",
        (str(handle),),
    )
    return uuid.UUID(str(rows[0][0]))


async def _conversation_of(client: BrokerClient) -> uuid.UUID:
    endpoints = await client.view("conversation_endpoints")
    return uuid.UUID(str(endpoints[0]["conversation_id"]))


async def test_an_end_with_cleanup_that_fails_to_commit_traces_no_end(tmp_path: Path) -> None:
    """R-TRACE-1, R-DLG-10: END CONVERSATION WITH CLEANUP whose commit fails is refused,
    and the file still holds the endpoint and its unsent messages: the trace must not say
    they were discarded or that the dialog ended."""
    async with solo_broker(tmp_path, SOLO) as broker:
        client = await client_of(broker)
        try:
            # No route to this service: its messages wait in the transmission queue.
            handle = await client.begin_dialog("//solo/S1", "//elsewhere/Nobody", "DEFAULT")
            await client.send(handle, "DEFAULT", b"kept")
            conversation = await _conversation(broker, handle)
            store = broker.databases["Solo"].store
            await read_only(store, True)
            try:
                with pytest.raises(RemoteError):
                    await client.end_conversation(handle, cleanup=True)
            finally:
                await read_only(store, False)
            rows = await store.query(
                "SELECT COUNT(*) FROM conversation_endpoints WHERE conversation_handle = ?",
                (str(handle),),
            )
            assert rows[0][0] == 1
            names = [e["event"] for e in await _events(broker, conversation)]
            assert "message_sent" in names
            assert "dialog_ended" not in names, names
            assert "discarded" not in names, names
        finally:
            await client.close()


async def test_an_acknowledgement_whose_deletion_fails_is_not_traced(tmp_path: Path) -> None:
    """R-TRACE-1, R-DLG-5: ``ack_received`` says the acknowledged messages left the
    transmission queue. While that deletion fails to commit, the file still holds them:
    the trace must not say they were acknowledged (it says so once a later try commits,
    ``tests/dialogs/test_failed_commits.py``)."""
    deployment = example.shop_and_warehouse(tmp_path, FAST_RETRY, hosts=(ALPHA, BETA))
    async with in_process(deployment.daemons["alpha"].config_path) as alpha:
        client = await client_of(alpha)
        try:
            handle = await client.begin_dialog(
                example.SHOP_SERVICE, example.WAREHOUSE_SERVICE, example.CONTRACT
            )
            await client.send(handle, example.ORDER, b"1")
            rows = await alpha.databases["shop"].store.query(
                "SELECT conversation_id FROM conversation_endpoints WHERE conversation_handle = ?",
                (str(handle),),
            )
            conversation = uuid.UUID(str(rows[0][0]))
            store = alpha.databases["shop"].store
            await read_only(store, True)
            try:
                deployment.start("beta")
                beta = deployment.daemons["beta"]
                receiver = await beta.client()
                try:
                    got = await receiver.receive("OrderQueue", timeout=20.0)
                    assert [m.message_body for m in got] == [b"1"]
                finally:
                    await receiver.close()
                # Beta acknowledges the delivery at its commit (ack_delay 5 ms); give the
                # acknowledgement time to reach alpha and alpha's deletion time to fail.

                async def acknowledged() -> bool:
                    return alpha.engine.stats.acks_received > 0

                await wait_until(acknowledged, timeout=10.0)
                await store.wait_idle()  # the deletion was tried, and failed
                # While the file refuses writes, the deletion's tries fail: no event.
                names = [e["event"] for e in await _events(alpha, conversation)]
                assert "message_sent" in names
                assert "ack_received" not in names, names
            finally:
                await read_only(store, False)
                deployment.stop_all()
        finally:
            await client.close()


async def test_a_target_begins_at_the_commit_of_its_first_message(tmp_path: Path) -> None:
    """R-TRACE-1: a target's endpoint is made by the first message of its dialog to
    arrive; its ``dialog_begun`` says the file holds it. While that message's commit
    fails, the trace must not say so; once it commits (the sender sends it again),
    ``dialog_begun`` is written once, before the message's ``delivered``."""
    deployment = example.shop_and_warehouse(tmp_path, FAST_RETRY, hosts=(ALPHA, BETA))
    async with in_process(deployment.daemons["beta"].config_path) as beta:
        store = beta.databases["warehouse"].store
        await read_only(store, True)
        try:
            with running(deployment, "alpha"):
                sender = await deployment.daemons["alpha"].client()
                try:
                    handle = await sender.begin_dialog(
                        example.SHOP_SERVICE, example.WAREHOUSE_SERVICE, example.CONTRACT
                    )
                    await sender.send(handle, example.ORDER, b"1")

                    async def arrived() -> bool:
                        return beta.engine.stats.fragments_received > 0

                    await wait_until(arrived, timeout=20.0)
                    await asyncio.sleep(0.5)  # the commit fails; the trace is flushed
                    await beta.trace.flush()
                    begun = [
                        e
                        for e in read_events(segment_files([beta.trace.config.directory]))
                        if e.get("event") == "dialog_begun"
                    ]
                    assert begun == []
                    await read_only(store, False)
                    receiver = await client_of(beta)
                    try:
                        got = await receiver.receive("OrderQueue", timeout=20.0)
                        assert [m.message_body for m in got] == [b"1"]
                        conversation = await _conversation_of(receiver)
                    finally:
                        await receiver.close()
                finally:
                    await sender.close()
        finally:
            await read_only(store, False)
        names = [e["event"] for e in await _events(beta, conversation)]
        assert names.count("dialog_begun") == 1, names
        assert names.index("dialog_begun") < names.index("delivered"), names


async def test_a_rollback_whose_count_is_not_written_traces_no_count(tmp_path: Path) -> None:
    """R-TRACE-1, SPEC §6: ``rolled_back`` says a rollback was counted against the
    message, durably. When the count's write fails, a restart counts from the file, which
    holds no such rollback: neither may the trace."""
    async with solo_broker(tmp_path, SOLO) as broker:
        client = await client_of(broker)
        try:
            handle = await client.begin_dialog("//solo/S1", "//solo/S2", "DEFAULT")
            await client.send(handle, "DEFAULT", b"once")
            conversation = await _conversation(broker, handle)
            tx = await client.begin_transaction()
            got = await tx.receive("Q2", timeout=5.0)
            assert [m.message_body for m in got] == [b"once"]
            store = broker.databases["Solo"].store
            await read_only(store, True)
            try:
                await tx.rollback(reason="the handler failed")
                await asyncio.sleep(0.3)  # the count's write fails meanwhile
            finally:
                await read_only(store, False)
            names = [e["event"] for e in await _events(broker, conversation)]
            assert "delivered" in names
            assert "rolled_back" not in names, names
            rows = await store.query("SELECT COUNT(*) FROM message_rollbacks")
            assert rows[0][0] == 0
        finally:
            await client.close()
