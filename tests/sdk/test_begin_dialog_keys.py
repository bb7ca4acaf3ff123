"""A BEGIN DIALOG with an idempotency key begins one dialog, however often it is written
(SPEC §6, outcomes; R-PROTO-4).

* On the client port: the same key, written twice in one write (the second while the
  first commits) and once more after, is answered with the first dialog's handle each
  time, and the daemon holds one endpoint; a key used again with other arguments is
  refused (``KeyReused``), one in a client transaction too (``InvalidRequest``).
* The SDK keys every BEGIN DIALOG outside a transaction (with a daemon whose login
  names the feature): a connection reset after the request was written, before its
  answer, gives the caller its handle (not ``OutcomeUnknown``), and leaves exactly one
  endpoint.
* A key is kept in the BEGIN DIALOG's own commit: it survives a SIGKILL of the daemon;
  it goes with its dialog, and after ``limits.send_key_window``.

Real daemons, each on its own address: in the test's process (on 127.0.25.1, .2 and
.4), or in a process of its own (127.0.25.3) for the SIGKILL.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from brokerd.sdk.client import BrokerClient
from brokerd.sdk.requests import begin_dialog_key
from brokerd.server.daemon import Broker
from protocol.client_wire import (
    BEGIN_DIALOG_KEYS,
    ClientFrame,
    ClientFrameKind,
    ClientFrameReader,
)
from protocol.errors import InvalidRequest, KeyReused, LocalProtocolError
from tests.daemons import client_of, solo_broker, solo_daemon
from tests.raw_client import logged_in, request

BEGIN = {"op": "begin_dialog", "from_service": "//solo/S1", "to_service": "//solo/S2"}


async def _replies(reader: asyncio.StreamReader, ids: set[int]) -> dict[int, ClientFrame]:
    """The replies to requests ``ids`` read from a raw connection, by id."""
    frames = ClientFrameReader()
    got: dict[int, ClientFrame] = {}
    async with asyncio.timeout(5):
        while not ids <= set(got):
            for frame in frames.feed(await reader.read(65536)):
                got[frame.request_id] = frame
    return got


async def _handles(client: BrokerClient) -> list[str]:
    return [str(e.conversation_handle) for e in await client.conversation_endpoints()]


def _keys_in_file(broker: Broker) -> int:
    with sqlite3.connect(broker.databases["Solo"].store.path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM begin_dialog_keys").fetchone()[0])


async def test_a_key_written_again_names_the_first_dialog(tmp_path: Path) -> None:
    """SPEC §6 (outcomes), R-PROTO-4: a repeated key is answered with the first dialog's
    handle and begins nothing, whether the first is still committing or committed."""
    async with solo_broker(tmp_path, "127.0.25.1") as broker:
        reader, writer = await logged_in(broker)
        keyed = {**BEGIN, "key": "order-17"}
        writer.write(request(2, keyed) + request(3, keyed))  # the second while the first commits
        replies = await _replies(reader, {2, 3})
        writer.write(request(4, keyed) + request(5, BEGIN))
        replies |= await _replies(reader, {4, 5})
        assert all(r.kind is ClientFrameKind.RESPONSE for r in replies.values()), replies
        first = replies[2].meta["conversation_handle"]
        assert [replies[n].meta["conversation_handle"] for n in (3, 4)] == [first, first]
        assert replies[5].meta["conversation_handle"] != first  # no key: a dialog of its own
        writer.close()
        client = await client_of(broker)
        try:
            assert sorted(await _handles(client)) == sorted(
                [first, replies[5].meta["conversation_handle"]]
            )
        finally:
            await client.close()


async def test_a_key_used_again_with_other_arguments_is_refused(tmp_path: Path) -> None:
    """SPEC §6 (outcomes): a key is unique per initiating service and database; used again
    by that service for another dialog (another target service, contract or lifetime) it
    is refused, ``KeyReused``, and begins nothing. Keys are for BEGIN DIALOGs outside a
    transaction."""
    async with solo_broker(tmp_path, "127.0.25.2") as broker:
        client = await client_of(broker)
        try:
            first = await client.begin_dialog("//solo/S1", "//solo/S2", key="k")
            assert (await client.begin_dialog("//solo/S1", "//solo/S2", key="k")).handle == (
                first.handle
            )
            for to_service, contract, lifetime in (
                ("//solo/S1", "DEFAULT", 0),
                ("//solo/S2", "//solo/Other", 0),
                ("//solo/S2", "DEFAULT", 60),
            ):
                with pytest.raises(KeyReused, match="key 'k'"):
                    await client.begin_dialog(
                        "//solo/S1", to_service, contract, lifetime=lifetime, key="k"
                    )
            # the same key from another service is its own
            second = await client.begin_dialog("//solo/S2", "//solo/S1", key="k")
            assert second.handle != first.handle
            with pytest.raises(InvalidRequest, match="key"):
                await client.begin_dialog("//solo/S1", "//solo/S2", key="x" * 201)
            async with client.transaction() as tx:
                with pytest.raises(InvalidRequest, match="transaction"):
                    await tx._request({**BEGIN, "key": "t"})
            assert sorted(await _handles(client)) == sorted([str(first.handle), str(second.handle)])
        finally:
            await client.close()


async def test_a_begin_dialog_whose_connection_is_reset_gives_its_handle(tmp_path: Path) -> None:
    """SPEC §6 (outcomes), R-PROTO-4: the connection goes after the BEGIN DIALOG was
    written and read, before its answer. The SDK writes it again on the next connection
    under the same key: the caller gets the handle of the dialog begun, and the daemon
    holds that one endpoint, no other."""
    async with solo_broker(tmp_path, "127.0.25.4") as broker:
        client = await client_of(broker)
        try:
            db = broker.databases["Solo"]
            begun = asyncio.ensure_future(client.begin_dialog("//solo/S1", "//solo/S2"))
            async with asyncio.timeout(5):
                while not db.endpoints:  # read, and the endpoint made: it commits now
                    await asyncio.sleep(0)
            connection = client._keeper.connection
            assert connection is not None and connection.transport is not None
            connection.transport.abort()
            dialog = await asyncio.wait_for(begun, 10)
            assert client.reconnects == 1
            assert await _handles(client) == [str(dialog.handle)]
            assert [ep.handle for ep in db.endpoints.values()] == [dialog.handle]
        finally:
            await client.close()


async def test_a_key_survives_a_kill(tmp_path: Path) -> None:
    """SPEC §6 (outcomes): the key is written in the BEGIN DIALOG's own commit, so after
    a SIGKILL and a restart, within the window, the key still names the first dialog."""
    async with solo_daemon(tmp_path, "127.0.25.3") as (deployment, client):
        first = await client.begin_dialog("//solo/S1", "//solo/S2", key="before-the-kill")
        deployment.kill("solo")
        deployment.start("solo")
        again = await deployment.daemons["solo"].client()
        try:
            repeat = await again.begin_dialog("//solo/S1", "//solo/S2", key="before-the-kill")
            assert repeat.handle == first.handle
            assert await _handles(again) == [str(first.handle)]
        finally:
            await again.close()


async def test_a_key_goes_with_its_dialog_and_after_its_window(tmp_path: Path) -> None:
    """SPEC §6 (outcomes, END CONVERSATION WITH CLEANUP): a key is kept for
    ``limits.send_key_window`` and while its dialog lasts; after either, the same key
    begins a new dialog."""
    extra = "[limits]\nsend_key_window = 60\n"
    async with solo_broker(tmp_path, "127.0.25.5", extra) as broker:
        client = await client_of(broker)
        try:
            db = broker.databases["Solo"]
            first = await client.begin_dialog("//solo/S1", "//solo/S2", key="k")
            assert _keys_in_file(broker) == 1
            keys = broker.engine.begin_keys
            keys.forget_old_keys(time.time() + 30)  # within the window: kept
            assert (await client.begin_dialog("//solo/S1", "//solo/S2", key="k")).handle == (
                first.handle
            )
            keys.forget_old_keys(time.time() + 61)  # past it: gone, here and in the file
            await db.store.wait_idle()
            assert _keys_in_file(broker) == 0
            second = await client.begin_dialog("//solo/S1", "//solo/S2", key="k")
            assert second.handle != first.handle
            assert _keys_in_file(broker) == 1

            await second.end(cleanup=True)  # its key goes with it
            await db.store.wait_idle()
            assert _keys_in_file(broker) == 0
            third = await client.begin_dialog("//solo/S1", "//solo/S2", key="k")
            assert third.handle not in (first.handle, second.handle)
            assert sorted(await _handles(client)) == sorted([str(first.handle), str(third.handle)])
        finally:
            await client.close()


def test_keys_go_only_to_a_daemon_that_takes_them() -> None:
    """SPEC §6 (outcomes): the SDK keys a BEGIN DIALOG only for a daemon whose login names
    the feature (a fresh key each time, or the caller's); a daemon that does not would
    ignore a key, so the caller's is refused before it is written."""
    offered = frozenset({BEGIN_DIALOG_KEYS})
    fresh = {begin_dialog_key(None, offered) for _ in range(3)}
    assert None not in fresh and len(fresh) == 3
    assert begin_dialog_key("mine", offered) == "mine"
    assert begin_dialog_key(None, frozenset()) is None
    with pytest.raises(LocalProtocolError, match=BEGIN_DIALOG_KEYS):
        begin_dialog_key("mine", frozenset())
