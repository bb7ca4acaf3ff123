"""A principal's sessions with its mirror while a copy of the file is being taken, with
an in-process principal on 127.0.35.1:4022, its mirror on 127.0.35.2:4022 and
connections holding the mirror's name.

SPEC ids: R-ROUTE-16 (the principal ships each committed unit to the attached mirror, in
commit order; a mirror that is not in the principal's history gets a copy of the file).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from brokerd.server.daemon import Broker
from brokerd.server.mirroring import DIVERGED, Partner
from brokerd.server.peer_connection import BrokerProtocol
from brokerd.storage import queries
from brokerd.tools.launcher import Deployment
from protocol import events, mirroring
from protocol.mirroring import Attach, Chunk, Kind
from tests.daemons import in_process, wait_until
from tests.hostile import HostileBroker
from tests.routing.deploy import database

P1, P2 = "127.0.35.1", "127.0.35.2"
PARTS = "//parts/OrderParts"
PARTS_INSTANCE = uuid.UUID("0b7c2f64-5a1e-4d39-8e0f-6c2a9d4b7e15")


def parts_database(role: str, partner: str) -> str:
    text = database("Parts", [PARTS], [], PARTS_INSTANCE, mirror_role=role)
    head, sep, tail = text.partition("[[database.queue]]")
    return f'{head}mirror_partner = "tcp://{partner}:4022"\n{sep}{tail}'


def deploy(deployment: Deployment) -> Path:
    """The mirror started; the principal's configuration, to run in this process."""
    deployment.add("p1", P1, parts_database("principal", P2))
    deployment.add("p2", P2, parts_database("mirror", P1))
    deployment.start("p2")
    return deployment.daemons["p1"].config_path


async def session_of(
    broker: Broker, hostile: HostileBroker, known: BrokerProtocol | None = None
) -> BrokerProtocol:
    """The principal's side of ``hostile``'s connection: the one from the mirror's name
    that is not ``known`` (connect one at a time)."""
    await hostile.connect(P1)
    found: list[BrokerProtocol] = []

    async def accepted() -> bool:
        found[:] = [
            p
            for p in broker.transport.connections
            if p.link is None
            and not p.closed
            and p is not known
            and p.conn.peer_instance == hostile.name
        ]
        return len(found) == 1

    await wait_until(accepted, 10)
    return found[0]


async def next_chunk(hostile: HostileBroker, timeout: float) -> Chunk | None:
    """The next UNIT or SNAPSHOT chunk ``hostile`` receives, None if none in ``timeout``."""
    assert hostile.reader is not None and hostile.writer is not None
    deadline = time.monotonic() + timeout
    while True:
        for i, event in enumerate(hostile.received):
            if isinstance(event, events.Mirror):
                message = mirroring.decode(event.payload)
                if isinstance(message, Chunk):
                    del hostile.received[: i + 1]
                    return message
        hostile.received.clear()
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            data = await asyncio.wait_for(hostile.reader.read(65536), left)
        except TimeoutError:
            return None
        if not data:
            return None
        hostile.received += hostile.conn.receive_data(data)
        out = hostile.conn.data_to_send()
        if out:
            hostile.writer.write(out)


async def test_a_mirror_displacing_one_being_copied_gets_the_units_committed_meanwhile(
    deployment: Deployment,
) -> None:
    """R-ROUTE-16: a connection with the mirror's name attaches out of the principal's
    history (a copy of the file is being taken for it), and another displaces it at once
    with the principal's last unit. A unit committed while the first copy is taken is
    shipped to the second session: the copy was the displaced session's. Before, the
    copy in progress held every unit back from the new session, which never got it."""
    config = deploy(deployment)
    async with in_process(config) as broker:
        partner: Partner = broker.mirroring.by_name["Parts"]
        db = partner.db

        async def caught_up() -> bool:
            return partner.session is not None and partner.partner_name == "p2"

        await wait_until(caught_up, 20)
        deployment.kill("p2")

        async def lost() -> bool:
            return partner.session is None

        await wait_until(lost, 15)
        first, second = (
            HostileBroker(deployment.cert_dir, "p2"),
            HostileBroker(deployment.cert_dir, "p2"),
        )
        try:
            s1 = await session_of(broker, first)
            s2 = await session_of(broker, second, s1)
            lsn, lsn_epoch = partner.replica.lsn, partner.replica.lsn_epoch
            inside, go = threading.Event(), threading.Event()

            def gate(_conn: Any) -> None:
                inside.set()
                go.wait(10)

            committed = db.store.submit([queries.meta("probe", "x")], fn=gate, wait=True)
            assert committed is not None
            assert await asyncio.to_thread(inside.wait, 10)
            # The commit is under way: the copy for the first session waits behind it.
            partner.on_attach(s1, Attach(PARTS_INSTANCE, db.mirror_epoch, lsn, DIVERGED))
            partner.on_attach(s2, Attach(PARTS_INSTANCE, db.mirror_epoch, lsn, lsn_epoch))
            assert partner.session is s2
            go.set()
            chunk = await next_chunk(second, 5)
            assert chunk is not None, "the unit committed meanwhile never reached the mirror"
            assert (chunk.kind, chunk.lsn) == (Kind.UNIT, lsn + 1)
        finally:
            go.set()
            await first.close()
            await second.close()
