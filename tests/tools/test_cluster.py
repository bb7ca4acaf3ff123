"""``brokerd cluster up|status|down`` (R-OPS-4) with the whole local topology, as a user runs it:
each command a process of its own, six daemons on 127.0.0.171 to 127.0.0.176.

An order from the shop goes through the forwarding hub to the load-balanced warehouse
pair (R-ROUTE-5: each conversation to one of the two broker instances, both used;
R-ROUTE-7: the hub relays both ways and keeps no dialog), one to the mirrored parts
database's principal (R-ROUTE-10, R-ROUTE-16), and a reply comes back through the hub.
``status`` shows every broker ready and the queues' depths; ``down`` leaves no process.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import urllib.request
from pathlib import Path

from brokerd.sdk.client import BrokerClient
from brokerd.tools.cluster import Member, read_members
from brokerd.tools.topology import (
    CONTRACT,
    ORDER,
    PARTS_SERVICE,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
)
from tests.commands import brokerd
from tests.daemons import drain

FIRST = "127.0.0.171"
CONVERSATIONS = 16


def cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return brokerd("cluster", *args, timeout=180, env=dict(os.environ, COLUMNS="200"))


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, exited and waiting for its reaper to
    collect its status, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def client_of(member: Member, root: Path) -> BrokerClient:
    token = root / member.name / "data" / "client.token"
    return await BrokerClient.connect(member.host, member.client_port, token_file=token)


def console(member: Member) -> dict[str, object]:
    with urllib.request.urlopen(f"{member.admin_url}/console.json", timeout=10) as reply:
        data: dict[str, object] = json.loads(reply.read())
        return data


async def test_the_local_cluster_up_status_down(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    started = cluster("up", str(root), "--first-address", FIRST)
    assert started.returncode == 0, started.stdout + started.stderr
    members = {m.name: m for m in read_members(root)}
    assert list(members) == [
        "shop",
        "hub",
        "warehouse-1",
        "warehouse-2",
        "parts-principal",
        "parts-mirror",
    ]
    assert members["shop"].host == FIRST and members["parts-mirror"].host == "127.0.0.176"
    for name in members:
        assert name in started.stdout
    try:
        shop = await client_of(members["shop"], root)
        handles = [
            await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT, database="shop")
            for _ in range(CONVERSATIONS)
        ]
        for n, handle in enumerate(handles):
            await shop.send(handle, ORDER, f"order {n}".encode())
        parts = await shop.begin_dialog(SHOP_SERVICE, PARTS_SERVICE, CONTRACT, database="shop")
        await shop.send(parts, ORDER, b"parts for order 0")

        # status while the orders wait in the warehouses' queues
        warehouses = [await client_of(members[f"warehouse-{i}"], root) for i in (1, 2)]

        async def depths() -> list[int]:
            return [
                int(q["ready_messages"])
                for w in ("warehouse-1", "warehouse-2")
                for q in console(members[w])["queues"]  # type: ignore[union-attr]
            ]

        for _ in range(600):
            if sum(await depths()) == CONVERSATIONS:
                break
            await asyncio.sleep(0.1)
        per_warehouse = await depths()
        assert sum(per_warehouse) == CONVERSATIONS
        assert all(n > 0 for n in per_warehouse), per_warehouse  # both instances used
        shown = cluster("status", str(root))
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert shown.stdout.count("ready") == len(members), shown.stdout
        for n in per_warehouse:
            assert f"warehouse.OrderQueue={n}" in shown.stdout, shown.stdout

        got = [
            m
            for w, n in zip(warehouses, per_warehouse, strict=True)
            for m in await drain(w, "OrderQueue", n)
        ]
        assert sorted(m.message_body for m in got) == sorted(
            f"order {n}".encode() for n in range(CONVERSATIONS)
        )
        principal = await client_of(members["parts-principal"], root)
        (part,) = await drain(principal, "PartsQueue", 1)
        assert part.message_body == b"parts for order 0"

        # a reply from a warehouse comes back through the hub
        first = got[0]  # warehouse-1 received it (both received some)
        await warehouses[0].send(first.conversation_handle, ORDER, b"confirmed")
        (reply,) = await drain(shop, "ClientQueue", 1)
        assert reply.message_body == b"confirmed"
        assert console(members["hub"])["endpoints"] == []  # a forwarder keeps no dialog
        for client in (shop, principal, *warehouses):
            await client.close()
    finally:
        stopped = cluster("down", str(root))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert stopped.stdout.count("stopped") == len(members), stopped.stdout
    for member in members.values():
        assert not running(member.pid), f"{member.name} (pid {member.pid}) still runs"
    assert not (root / "cluster.json").exists()
    again = cluster("status", str(root))
    assert again.returncode == 1 and "no cluster" in again.stdout
