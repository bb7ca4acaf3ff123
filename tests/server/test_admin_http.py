"""The admin HTTP port of live daemons (R-OPS-1, R-OPS-2): ``/metrics`` moves with real
traffic, health and readiness answer, and what is not a GET of a known page is refused
clearly.

Two real daemons (alpha, the shop, on 127.0.0.151; beta, the warehouse, on
127.0.0.152), each with its admin port on its own address, port 8022 (the default on
loopback). The metrics are scraped with ``urllib`` and parsed by ``prometheus_client``'s
own parser.
"""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)
from protocol.errors import BrokerError
from tests.daemons import FAST_RETRY, drain, running, solo_broker, wait_until

HOSTS = ("127.0.0.151", "127.0.0.152")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def scrape(host: str) -> Samples:
    status, body = await asyncio.to_thread(get, f"http://{host}:8022/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_move_with_real_traffic(tmp_path: Path) -> None:
    """R-DLG-1 traffic seen from outside: counters of messages in and out, queue depth,
    the transmission queue emptied by acknowledgements, commit latencies, connections."""
    d = shop_and_warehouse(tmp_path, FAST_RETRY, hosts=HOSTS)
    with running(d):
        alpha, beta = HOSTS
        for host in HOSTS:
            assert await asyncio.to_thread(get, f"http://{host}:8022/healthz") == (200, b"ok\n")
            assert await asyncio.to_thread(get, f"http://{host}:8022/readyz") == (200, b"ready\n")
        before_a, before_b = await scrape(alpha), await scrape(beta)
        assert value(before_a, "brokerd_ready") == 1
        shop = await d.daemons["alpha"].client()
        warehouse = await d.daemons["beta"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        for n in range(12):
            await shop.send(handle, ORDER, f"order {n}".encode())

        async def queued() -> bool:
            b = await scrape(beta)
            return (
                value(b, "brokerd_queue_messages", database="warehouse", queue="OrderQueue") == 12
            )

        await wait_until(queued, 30)
        after_a, after_b = await scrape(alpha), await scrape(beta)
        sent = "brokerd_messages_sent_total"
        delivered = "brokerd_messages_delivered_total"
        assert value(after_a, sent) - value(before_a, sent) == 12
        assert value(after_b, delivered) - value(before_b, delivered) == 12
        commits = "brokerd_commit_latency_seconds_count"
        assert value(after_a, commits, database="shop") > value(before_a, commits, database="shop")
        assert value(
            after_b, "brokerd_commit_latency_seconds_bucket", database="warehouse", le="+Inf"
        ) == value(after_b, commits, database="warehouse")
        assert value(after_b, "brokerd_commit_latency_seconds_sum", database="warehouse") > 0
        assert value(after_a, "brokerd_broker_connections", state="open") >= 1
        assert value(after_b, "brokerd_client_connections") == 1
        assert (
            value(after_b, "brokerd_conversation_endpoints", database="warehouse", state="CO") == 1
        )

        async def acknowledged() -> bool:
            return value(await scrape(alpha), "brokerd_transmission_queue_depth") == 0

        await wait_until(acknowledged, 30)
        await drain(warehouse, "OrderQueue", 12)
        done = await scrape(beta)
        assert value(done, "brokerd_queue_messages", database="warehouse", queue="OrderQueue") == 0
        received = "brokerd_messages_received_total"
        assert value(done, received) - value(before_b, received) == 12
        assert (
            value(
                done, "brokerd_quarantined_conversations", database="warehouse", queue="OrderQueue"
            )
            == 0
        )
        await shop.close()
        await warehouse.close()


async def test_a_peer_that_is_down_shows_in_the_transmission_queue(tmp_path: Path) -> None:
    """Messages for a broker that does not answer wait in the transmission queue: their
    number and the oldest one's age, per peer, and the console's JSON gives the status."""
    d = shop_and_warehouse(tmp_path, FAST_RETRY, hosts=HOSTS)
    with running(d, "alpha"):
        shop = await d.daemons["alpha"].client()
        handle = await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
        for n in range(3):
            await shop.send(handle, ORDER, f"order {n}".encode())
        await asyncio.sleep(1.2)
        samples = await scrape(HOSTS[0])
        peer = f"service {WAREHOUSE_SERVICE}"
        assert value(samples, "brokerd_transmission_queue_messages", peer=peer) == 3
        assert value(samples, "brokerd_transmission_queue_oldest_age_seconds", peer=peer) >= 1.0
        status, body = await asyncio.to_thread(get, f"http://{HOSTS[0]}:8022/console.json")
        assert status == 200 and b'"peers":[{"peer":"service //warehouse/Orders"' in body
        await shop.close()


async def test_a_backlog_in_the_file_is_summed_without_being_listed(tmp_path: Path) -> None:
    """The admin port sums the transmission queue up (R-DLG-12, R-OPS-1) instead of reading
    every row of it at each scrape and console refresh: after a restart, with the messages
    of some dialogs only in the file (the backlog recovered as numbers), the depth and the
    count per peer are the full view's, and the console lists the view's 50 oldest rows,
    oldest first, with the total. Paged, the view lists every row once, in key order."""
    d = shop_and_warehouse(tmp_path, FAST_RETRY, hosts=HOSTS)
    with running(d, "alpha"):
        shop = await d.daemons["alpha"].client()
        handles = [
            await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT) for _ in range(4)
        ]
        batch = [(handles[n % 4], ORDER, f"order {n}".encode()) for n in range(300)]
        for n in range(0, 300, 60):
            await shop.send_many(batch[n : n + 60])
        await shop.close()
        d.stop("alpha")
        d.start("alpha")
        shop = await d.daemons["alpha"].client()
        full = await shop.view("transmission_queue")
        assert len(full) == 300
        samples = await scrape(HOSTS[0])
        assert value(samples, "brokerd_transmission_queue_depth") == 300
        peer = f"service {WAREHOUSE_SERVICE}"
        assert value(samples, "brokerd_transmission_queue_messages", peer=peer) == 300
        status, body = await asyncio.to_thread(get, f"http://{HOSTS[0]}:8022/console.json")
        assert status == 200
        console = orjson.loads(body)
        assert console["transmission_queue_total"] == 300
        listed = [
            (r["enqueued_at"], r["message_sequence_number"]) for r in console["transmission_queue"]
        ]
        oldest = sorted((r["enqueued_at"], r["message_sequence_number"]) for r in full)[:50]
        assert listed == oldest
        # the view a page at a time (R-PROTO-4): each page reads the rows of the endpoints
        # it lists, and the pages hold every row once, in key order
        paged = [
            (r["conversation_handle"], r["message_sequence_number"])
            async for r in shop.view_rows("transmission_queue", page_size=7)
        ]
        expected = sorted((str(handles[n % 4]), n // 4 + 1) for n in range(300))
        assert paged == expected
        await shop.close()


def raw(host: str, request: bytes) -> bytes:
    with socket.create_connection((host, 8022), timeout=10) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


async def test_only_gets_of_known_pages(tmp_path: Path) -> None:
    """405 for other methods, 404 for other paths, 413 for a body, 431 for an
    over-long head, 400 for what is not HTTP; the port goes on serving."""
    d = shop_and_warehouse(tmp_path, FAST_RETRY, hosts=HOSTS)
    with running(d, "alpha"):
        host = HOSTS[0]

        def ask(request: bytes) -> bytes:
            return raw(host, request)

        cases = [
            (
                b"POST /metrics HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
                b"Connection: close\r\n\r\n",
                b"405",
                b"allow: GET, HEAD",
            ),
            (
                b"DELETE / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
                b"405",
                b"GET only",
            ),
            (
                b"GET /nowhere HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
                b"404",
                b"/metrics",
            ),
            (
                b"GET / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello",
                b"413",
                b"no body",
            ),
            (
                b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n",
                b"431",
                b"",
            ),
            (b"\x16\x03\x01 not http\r\n\r\n", b"400", b"bad request"),
        ]
        for request, status, text in cases:
            reply = await asyncio.to_thread(ask, request)
            assert reply.startswith(b"HTTP/1.1 " + status), reply[:200]
            assert text in reply.lower() if text.islower() else text in reply, reply[:300]
        # keep-alive: two requests on one connection
        two = await asyncio.to_thread(
            ask,
            b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
            b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        )
        assert two.count(b"HTTP/1.1 200") == 2 and b"ready\n" in two
        assert await asyncio.to_thread(get, f"http://{host}:8022/healthz") == (200, b"ok\n")


async def test_an_admin_port_that_cannot_be_bound_stops_start_up(tmp_path: Path) -> None:
    """R-OPS-1: a taken admin address is a clear start-up error naming it and the key."""
    host = "127.0.0.153"
    with socket.create_server((host, 8022)), pytest.raises(BrokerError) as info:
        async with solo_broker(tmp_path, host):
            pass
    message = str(info.value)
    assert f"the admin port http://{host}:8022 ([admin] listen" in message, message
    async with solo_broker(tmp_path, host):  # free again: it starts, and nothing was lost
        status, _ = await asyncio.to_thread(get, f"http://{host}:8022/readyz")
        assert status == 200
