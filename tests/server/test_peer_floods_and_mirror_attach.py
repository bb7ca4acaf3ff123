"""What a hostile authenticated peer on port 4022 can make a live daemon hold or do, and
what the ``broker_connections`` view counts.

The daemons are real, on 127.0.0.114 (the example warehouse, a mirrored database's
principal, or a forwarder) and 127.0.0.115 (the principal's mirror partner); nothing
listens on 127.0.0.119. The peer is a broker with a certificate of the deployment's CA
(``tests.hostile``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from brokerd.sdk.client import BrokerClient
from brokerd.tools.example import warehouse_database
from brokerd.tools.launcher import Deployment
from protocol import dialog, events, mirroring
from tests.daemons import FAST_RETRY, running, wait_until
from tests.hostile import HostileBroker, order_message

BETA = "127.0.0.114"
QUERIES = 300_000
PER_WRITE = 10_000


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def _connection(client: BrokerClient, name: str) -> dict[str, Any]:
    rows = await client.view("broker_connections")
    (row,) = [r for r in rows if r["peer"] == name and r["state"] == "open"]
    return dict(row)


async def _flood_and_check(
    mallory: HostileBroker,
    frame: Callable[[int], bytes],
    client: BrokerClient,
    pid: int,
) -> None:
    """Write :data:`QUERIES` frames (``frame(n)``, the n-th) from a peer that reads nothing,
    wait until the daemon has read them all, and require that it grew by under 20 MB and
    dropped (and counted) most of the answers."""
    assert mallory.writer is not None
    before = _rss_mb(pid)
    for start in range(0, QUERIES, PER_WRITE):
        mallory.writer.write(b"".join(frame(n) for n in range(start, start + PER_WRITE)))
        await mallory.writer.drain()

    async def all_read() -> bool:
        row = await _connection(client, mallory.name)
        return int(row["frames_received"]) >= QUERIES

    await wait_until(all_read, 60)
    grown = _rss_mb(pid) - before
    # unbounded, each query left an answer of about 450 bytes waiting (140 MB)
    assert grown < 20, f"the daemon grew by {grown:.0f} MB"
    row = await _connection(client, mallory.name)
    assert int(row.get("answers_dropped", 0)) > QUERIES // 2, row


async def test_principal_answers_to_a_peer_that_never_reads_are_bounded(tmp_path: Path) -> None:
    """R-PROTO-3, R-ROUTE-10: every principal query is answered on the connection it came
    on; a peer that sends queries and reads nothing must not make the daemon hold an
    answer per query. Past a bound the answers are dropped and counted (the asker asks
    again), and the daemon's memory stays flat however many queries come."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("beta", BETA, warehouse_database(None))
    with running(d):
        daemon = d.daemons["beta"]
        assert daemon.process is not None
        pid = daemon.process.pid
        warehouse = await daemon.client()
        mallory = HostileBroker(d.cert_dir)
        await mallory.connect(BETA, receive_buffer=4096)
        try:
            assert mallory.writer is not None
            unknown = uuid.uuid4()  # answered UNKNOWN: the cheapest answer there is
            service = "//mallory/" + "x" * 200

            def query(n: int) -> bytes:
                return mallory.conn.send(events.PrincipalQuery(n, unknown, service, 0))

            await _flood_and_check(mallory, query, warehouse, pid)
            await warehouse.close()
            assert d.stop("beta") == 0
        finally:
            await mallory.close()


PARTS = "//parts/OrderParts"
PARTS_INSTANCE = uuid.UUID("0b7e1c52-3a9d-4f61-9c2e-5d8a4b1f7e30")
MIRROR_HOST = "127.0.0.115"


def _parts(role: str, partner: str) -> str:
    return f"""
[[database]]
name = "Parts"
broker_instance = "{PARTS_INSTANCE}"
mirror_role = "{role}"
mirror_partner = "tcp://{partner}:4022"
[[database.queue]]
name = "PartsQueue"
[[database.service]]
name = "{PARTS}"
queue = "PartsQueue"
contracts = ["DEFAULT"]
"""


async def _mirroring(d: Deployment, name: str) -> dict[str, Any]:
    client = await d.daemons[name].client()
    try:
        (row,) = await client.view("mirroring")
        return dict(row)
    finally:
        await client.close()


async def test_only_the_configured_partner_may_attach_as_mirror(tmp_path: Path) -> None:
    """R-ROUTE-16, R-DLG-14: a principal ships its units, and a copy of its whole file, to
    its partner only (``mirror_partner``), over a connection whose peer the handshake
    authenticated. Another broker of the deployment (a forwarder, say) that sends an
    ATTACH for the database is refused: it gets no unit and no copy of the file (which
    holds every message, and the dialog keys of secured dialogs), and the partner stays
    attached."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("p1", BETA, _parts("principal", MIRROR_HOST))
    d.add("p2", MIRROR_HOST, _parts("mirror", BETA))
    with running(d):

        async def attached() -> bool:
            return bool((await _mirroring(d, "p1"))["mirror_attached"])

        await wait_until(attached, 30)
        p1 = await d.daemons["p1"].client()
        handle = await p1.begin_dialog(PARTS, PARTS, database="Parts")
        await p1.send(handle, body=b"<order>secret</order>")  # units for the mirror
        await p1.close()
        mallory = HostileBroker(d.cert_dir)
        await mallory.connect(BETA)
        try:
            assert mallory.reader is not None and mallory.writer is not None
            attach = mirroring.Attach(PARTS_INSTANCE, 0, 0, 0)
            mallory.writer.write(mallory.conn.send(events.Mirror(mirroring.encode(attach))))
            await mallory.writer.drain()
            answers: list[mirroring.Message] = []
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 3
            while loop.time() < deadline:
                with contextlib.suppress(TimeoutError):
                    data = await asyncio.wait_for(mallory.reader.read(65536), 0.2)
                    if not data:
                        break
                    answers += [
                        mirroring.decode(ev.payload)
                        for ev in mallory.conn.receive_data(data)
                        if isinstance(ev, events.Mirror)
                    ]
            shipped = [m for m in answers if isinstance(m, mirroring.Chunk)]
            assert not shipped, f"a broker that is not the partner got {len(shipped)} chunks"
            assert any(isinstance(m, mirroring.Refuse) for m in answers), answers
            row = await _mirroring(d, "p1")
            assert row["mirror_attached"] and row["snapshots_sent"] == 0, row
        finally:
            await mallory.close()


async def test_broker_connections_counts_fragments_each_way(tmp_path: Path) -> None:
    """R-PROTO-3: the ``broker_connections`` view shows bytes *and fragments* each way. On
    a version 2 connection one FRAGMENTS frame carries many fragments, so its frame
    counts say nothing of them: ten messages in one frame are ten fragments received."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("beta", BETA, warehouse_database(None))
    with running(d):
        warehouse = await d.daemons["beta"].client()
        mallory = HostileBroker(d.cert_dir)
        await mallory.connect(BETA)
        try:
            assert mallory.writer is not None and mallory.conn.version == 2
            instance = uuid.uuid4()
            messages = [order_message(instance, uuid.uuid4(), 1, b"<order/>") for _ in range(10)]
            payloads = [dialog.encode_fragment(h, b) for h, b in messages]
            written = mallory.conn.send_fragments([((p,), len(p)) for p in payloads])
            assert len(written) == 1  # one FRAGMENTS frame
            mallory.writer.write(b"".join(bytes(frame) for frame in written))
            await mallory.writer.drain()

            async def stored() -> bool:
                (queue,) = [q for q in await warehouse.view("queues") if q["queue"] == "OrderQueue"]
                return int(queue["ready_messages"]) == len(messages)

            await wait_until(stored, 20)
            row = await _connection(warehouse, mallory.name)
            assert row["fragments_received"] == len(messages), row
            assert row["fragments_sent"] == 0, row  # acknowledgements only
            typed = [c for c in await warehouse.broker_connections() if c.peer == mallory.name]
            assert [c.fragments_received for c in typed] == [len(messages)]
            await warehouse.close()
        finally:
            await mallory.close()


async def test_mirroring_refusals_to_a_peer_that_never_reads_are_bounded(tmp_path: Path) -> None:
    """R-PROTO-3, R-ROUTE-16: an ATTACH that is not taken is answered with a refusal on
    its connection; a peer that sends ATTACHes and reads nothing must not make a daemon
    with a mirrored database hold a refusal per ATTACH."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("p1", BETA, _parts("principal", MIRROR_HOST))
    with running(d):
        daemon = d.daemons["p1"]
        assert daemon.process is not None
        pid = daemon.process.pid
        p1 = await daemon.client()
        mallory = HostileBroker(d.cert_dir)
        await mallory.connect(BETA, receive_buffer=4096)
        try:
            assert mallory.writer is not None
            attach = mirroring.encode(mirroring.Attach(uuid.uuid4(), 0, 0, 0))  # no such database
            await _flood_and_check(
                mallory, lambda _: mallory.conn.send(events.Mirror(attach)), p1, pid
            )
            await p1.close()
        finally:
            await mallory.close()


ROUNDS = 20
ADDRESSES = 1000
NOBODY = "127.0.0.119"
"""An address where no broker listens: every dial to it is refused at once."""


async def test_links_to_addresses_nobody_uses_any_more_are_not_kept(tmp_path: Path) -> None:
    """R-ROUTE-9, R-ROUTE-7: a forwarder with a TRANSPORT route dials the address each
    forwarded message's service name gives. A peer that sends messages for ever new
    ``tcp://host:port/...`` services must not make it keep a link for every address it
    ever dialled: once nothing waits to go there and no conversation is routed there,
    the link goes, and the forwarder's memory stays flat however many addresses come."""
    d = Deployment(tmp_path, FAST_RETRY)
    msdb = '\n[[database]]\nname = "msdb"\n[[database.route]]\nname = "T"\naddress = "TRANSPORT"\n'
    d.add("f", BETA, msdb, endpoint_extra="message_forwarding = true\n")
    with running(d):
        daemon = d.daemons["f"]
        assert daemon.process is not None
        pid = daemon.process.pid
        f = await daemon.client()
        mallory = HostileBroker(d.cert_dir)
        await mallory.connect(BETA)
        try:
            assert mallory.writer is not None
            instance = uuid.uuid4()
            sizes: list[float] = []
            for n in range(ROUNDS):
                messages = [
                    order_message(instance, uuid.uuid4(), 1, b"<order/>")[0]._replace(
                        to_service=f"tcp://{NOBODY}:{20000 + n * ADDRESSES + port}/Orders"
                    )
                    for port in range(ADDRESSES)
                ]
                await mallory.send_fragments([(h, b"<order/>") for h in messages])

                async def refused(lost: int = (n + 1) * ADDRESSES) -> bool:
                    (stats,) = await f.view("stats")
                    return int(stats["forward_lost"]) >= lost

                await wait_until(refused, 60)
                sizes.append(_rss_mb(pid))
            # the first rounds fill the routing decisions' cache (10,000 entries, then it
            # starts over); the later ones take nothing more
            grown = sizes[-1] - sizes[ROUNDS // 2 + 1]
            assert grown < 20, f"the forwarder grew by {grown:.0f} MB: {sizes}"
            await f.close()
        finally:
            await mallory.close()


async def test_undecodable_messages_from_a_peer_do_not_flood_the_log(tmp_path: Path) -> None:
    """R-DLG-8: a message that cannot be taken is discarded, not acknowledged, and
    reported as ``corrupted_message`` (counted and traced, each one). A peer that sends
    dialog payloads that do not decode, thousands to a frame, must not write a log line
    for each: as dropped messages are, they are logged at most once a second, with the
    count of those not logged."""
    d = Deployment(tmp_path, FAST_RETRY)
    d.add("beta", BETA, warehouse_database(None))
    with running(d):
        daemon = d.daemons["beta"]
        warehouse = await daemon.client()
        mallory = HostileBroker(d.cert_dir)
        await mallory.connect(BETA)
        try:
            assert mallory.writer is not None
            garbage = b"\x00\x05trash"  # a dialog header length past the payload's end
            total = 0
            for _ in range(20):
                frames = mallory.conn.send_fragments([((garbage,), len(garbage))] * 1000)
                mallory.writer.write(b"".join(bytes(frame) for frame in frames))
                await mallory.writer.drain()
                total += 1000

            async def all_reported() -> bool:
                (stats,) = await warehouse.view("stats")
                return int(stats["corrupted_messages"]) >= total

            await wait_until(all_reported, 30)
            lines = [
                line
                for line in daemon.log_path.read_text().splitlines()
                if "undecodable dialog message" in line
            ]
            assert len(lines) < 50, f"{len(lines)} log lines for {total} corrupted messages"
            await warehouse.close()
        finally:
            await mallory.close()
