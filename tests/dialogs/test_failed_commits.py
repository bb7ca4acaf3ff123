"""What the engine keeps in memory after a commit of the dialog engine fails, against what
the file holds: memory must come back in line with the file, and what it keeps for a
commit that never happened must go.

The broker whose commit fails runs in the test's process, so that the test can make its
database refuse writes: ``PRAGMA query_only`` on the committer's own connection makes
every write fail with SQLITE_READONLY, as a file that cannot be written does.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

from brokerd.tools import example
from brokerd.traces.writer import read_events, segment_files
from tests.daemons import FAST_RETRY, client_of, in_process, wait_until
from tests.disks import read_only
from tests.hostile import HostileBroker, order_message

ALPHA, BETA = "127.0.16.1", "127.0.16.2"
SHOP_HOST, WAREHOUSE_HOST = "127.0.16.3", "127.0.16.4"


async def test_a_target_whose_first_message_fails_to_commit_is_forgotten(
    tmp_path: Path,
) -> None:
    """R-TRACE-1, R-DLG-5: a target endpoint made by the first message of its dialog waits
    for that message's commit to write its ``dialog_begun``. When the commit fails, the
    reload that follows drops the endpoint (the file does not hold it; the sender sends
    the message again): nothing may stay waiting for it, or every failed first message
    leaves a little memory behind for the life of the process."""
    deployment = example.shop_and_warehouse(tmp_path, FAST_RETRY, hosts=(ALPHA, BETA))
    async with in_process(deployment.daemons["beta"].config_path) as beta:
        warehouse = beta.databases["warehouse"]
        await read_only(warehouse.store, True)
        mallory = HostileBroker(deployment.cert_dir)
        try:
            await mallory.connect(BETA)
            shop = uuid.uuid4()
            firsts = [order_message(shop, uuid.uuid4(), 1, b"<order/>") for _ in range(3)]
            await mallory.send_fragments(firsts)

            async def failed() -> bool:
                return beta.engine.stats.fragments_received >= len(firsts) and (
                    warehouse.rx_suspended
                )

            await wait_until(failed, timeout=10.0)
            await read_only(warehouse.store, False)  # the reload reads the file again

            async def reloaded() -> bool:
                return not warehouse.rx_suspended and not warehouse.endpoints

            await wait_until(reloaded, timeout=10.0)
            assert beta.engine.events.unbegun == 0
        finally:
            await mallory.close()
            await read_only(warehouse.store, False)


async def test_an_acknowledgement_whose_deletion_fails_deletes_them_later(
    tmp_path: Path,
) -> None:
    """R-DLG-5, R-TRACE-1: the messages an acknowledgement releases leave the transmission
    queue in memory at once and in the file by a commit of their own. When that commit
    fails, memory has forgotten them while the file still holds them: the deletion is
    tried again (as the broker's own messages are, after a second, then longer), so that
    the file agrees with memory without a restart, and ``ack_received`` is traced once,
    when it commits."""
    deployment = example.shop_and_warehouse(tmp_path, FAST_RETRY, hosts=(SHOP_HOST, WAREHOUSE_HOST))
    async with in_process(deployment.daemons["alpha"].config_path) as alpha:
        client = await client_of(alpha)
        store = alpha.databases["shop"].store
        try:
            handle = await client.begin_dialog(
                example.SHOP_SERVICE, example.WAREHOUSE_SERVICE, example.CONTRACT
            )
            await client.send(handle, example.ORDER, b"1")

            async def queued() -> int:  # a read between two commits: also when refused
                def count(conn: sqlite3.Connection) -> int:
                    return int(
                        conn.execute(
                            "SELECT COUNT(*) FROM transmission_queue WHERE conversation_handle = ?",
                            (str(handle),),
                        ).fetchone()[0]
                    )

                return await store.read(count)

            assert await queued() == 1
            await read_only(store, True)
            try:
                deployment.start("beta")
                receiver = await deployment.daemons["beta"].client()
                try:
                    got = await receiver.receive("OrderQueue", timeout=20.0)
                    assert [m.message_body for m in got] == [b"1"]
                finally:
                    await receiver.close()

                async def acknowledged() -> bool:
                    return alpha.engine.stats.acks_received > 0

                await wait_until(acknowledged, timeout=10.0)
                await store.wait_idle()  # the deletion was tried, and failed
                assert await queued() == 1
            finally:
                await read_only(store, False)
                deployment.stop_all()
            assert alpha.databases["shop"].endpoints[handle].outbox == {}

            async def deleted() -> bool:
                return await queued() == 0

            await wait_until(deleted, timeout=5.0)
            await alpha.trace.flush()
            acks = [
                e
                for e in read_events(segment_files([alpha.trace.config.directory]))
                if e.get("event") == "ack_received"
            ]
            assert [(e["through"], e["seqs"]) for e in acks] == [(1, "1")], acks
        finally:
            await client.close()
