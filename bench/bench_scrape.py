"""What one scrape of the admin port costs a daemon that holds a backlog (R-OPS-1).

A shop daemon whose warehouse is down queues ``--messages`` messages of 200 bytes on
``--dialogs`` dialogs, is restarted (so its backlog is in its file, recovered as
numbers, as after a crash), and its ``/metrics`` and ``/console.json`` are fetched
``--scrapes`` times each (and with ``--pages`` the whole ``transmission_queue`` view is
read a page of 1,000 rows at a time, as ``brokerctl`` pages). Each line gives the wall
time of the request and the
daemon's CPU seconds during it (from ``/proc``), and checks the transmission queue's
depth against what was sent. A Prometheus server scrapes every 15 s, an open console
refreshes every 2 s: what a scrape costs is taken that often.

Runs daemons on 127.0.0.171 and 127.0.0.172:4022 (and 8022): run it in a network
namespace of its own (``ip netns exec bench python -m bench.bench_scrape``).

Usage: python -m bench.bench_scrape [--messages 100000] [--dialogs 100] [--scrapes 3] [--pages]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.system import cpu_model, cpu_seconds
from brokerd.tools.example import (
    CONTRACT,
    ORDER,
    SHOP_SERVICE,
    WAREHOUSE_SERVICE,
    shop_and_warehouse,
)

HOSTS = ("127.0.0.171", "127.0.0.172")
BATCH = 1000


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=300) as response:
        body: bytes = response.read()
        return body


async def run(
    messages: int, dialogs: int, scrapes: int, pages: bool, root: Path
) -> list[dict[str, object]]:
    d = shop_and_warehouse(root, hosts=HOSTS)
    d.start("alpha")
    try:
        shop = await d.daemons["alpha"].client()
        handles = [
            await shop.begin_dialog(SHOP_SERVICE, WAREHOUSE_SERVICE, CONTRACT)
            for _ in range(dialogs)
        ]
        for first in range(0, messages, BATCH):
            await shop.send_many(
                [
                    (handles[n % dialogs], ORDER, b"x" * 200)
                    for n in range(first, min(messages, first + BATCH))
                ]
            )
        await shop.close()
        d.stop("alpha")
        d.start("alpha")
        process = d.daemons["alpha"].process
        assert process is not None
        out: list[dict[str, object]] = []
        for page in ("/metrics", "/console.json"):
            for _ in range(scrapes):
                cpu, began = cpu_seconds(process.pid), time.perf_counter()
                body = await asyncio.to_thread(fetch, f"http://{HOSTS[0]}:8022{page}")
                wall = time.perf_counter() - began
                if page == "/metrics":
                    (depth,) = (
                        float(line.split()[-1])
                        for line in body.decode().splitlines()
                        if line.startswith("brokerd_transmission_queue_depth ")
                    )
                else:
                    depth = float(json.loads(body)["transmission_queue_total"])
                if depth != messages:
                    raise SystemExit(f"{page}: depth {depth}, {messages} queued")
                out.append(
                    {
                        "page": page,
                        "messages": messages,
                        "dialogs": dialogs,
                        "wall_s": round(wall, 3),
                        "daemon_cpu_s": round(cpu_seconds(process.pid) - cpu, 3),
                        "cpu": cpu_model(),
                    }
                )
        if pages:
            client = await d.daemons["alpha"].client()
            cpu, began = cpu_seconds(process.pid), time.perf_counter()
            rows = [r async for r in client.view_rows("transmission_queue", page_size=1000)]
            wall = time.perf_counter() - began
            await client.close()
            if len(rows) != messages:
                raise SystemExit(f"the paged view listed {len(rows)} rows, {messages} queued")
            out.append(
                {
                    "page": "view transmission_queue, every page of 1,000 rows",
                    "messages": messages,
                    "dialogs": dialogs,
                    "wall_s": round(wall, 3),
                    "daemon_cpu_s": round(cpu_seconds(process.pid) - cpu, 3),
                    "cpu": cpu_model(),
                }
            )
        return out
    finally:
        d.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--dialogs", type=int, default=100)
    parser.add_argument("--scrapes", type=int, default=3)
    parser.add_argument(
        "--pages", action="store_true", help="also page through the whole transmission_queue view"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-scrape-") as root:
        for line in asyncio.run(
            run(args.messages, args.dialogs, args.scrapes, args.pages, Path(root))
        ):
            print(json.dumps(line))


if __name__ == "__main__":
    main()
