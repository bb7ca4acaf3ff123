"""An example dynamic routing service (SPEC R-ROUTE-14): answers MissingRoute requests.

When a conversation finds no route and a route to the service
``SQL/ServiceBroker/BrokerConfiguration`` exists, the broker marks it DELAYED
and sends that service a ``MissingRoute`` message naming the service (R-ROUTE-4
step 4). This program is such a service. It RECEIVEs the requests from its
queue, looks the service up in a table, creates the route through the admin
API in the database that asked, and ends the request dialog. The broker then
routes the waiting conversation again. A service missing from the table gets
no route: the dialog is ended all the same, the conversation stays DELAYED and
the broker asks again later.

The broker it serves hosts, in some database, the service
``SQL/ServiceBroker/BrokerConfiguration`` on the contract
``http://schemas.microsoft.com/SQL/ServiceBroker/BrokerConfigurationNotice``
(both message type and contract exist in every database), and each database
that should use it has a route to that service (for example ``address = "LOCAL"``).
``config/dynamic-routing.toml`` shows such a configuration.

The table is a TOML file::

    [[route]]
    service = "//remote/Orders"
    address = "tcp://127.0.0.2:4022"
    # broker_instance = "..."   (optional)
    # lifetime = 3600           (optional, seconds)

Run it beside the broker::

    .venv/bin/python examples/dynamic_router.py --config brokerd.toml \\
        --queue RoutingQueue --table routes.toml
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from brokerd.config import load_config
from brokerd.sdk.client import BrokerClient, ReceivedMessage
from protocol.dialog import MISSING_ROUTE
from protocol.errors import BrokerError, RemoteError

log = logging.getLogger("dynamic_router")


@dataclass(frozen=True)
class TableEntry:
    address: str
    broker_instance: str | None = None
    lifetime: float | None = None


@dataclass(frozen=True)
class MissingRoute:
    service: str
    broker_instance: str | None
    database: str


def load_table(path: Path) -> dict[str, TableEntry]:
    """service name -> where its route should point."""
    data = tomllib.loads(path.read_text())
    table: dict[str, TableEntry] = {}
    for i, row in enumerate(data.get("route", [])):
        if "service" not in row or "address" not in row:
            raise ValueError(f"{path}: route[{i}] needs service and address")
        table[str(row["service"])] = TableEntry(
            str(row["address"]), row.get("broker_instance"), row.get("lifetime")
        )
    return table


def parse_request(body: bytes) -> MissingRoute:
    """The MissingRoute body: SERVICE_NAME, BROKER_INSTANCE (may be empty), DATABASE."""
    root = ET.fromstring(body)

    def text(tag: str) -> str:
        for element in root.iter():
            if element.tag.rsplit("}", 1)[-1] == tag:
                return element.text or ""
        return ""

    return MissingRoute(text("SERVICE_NAME"), text("BROKER_INSTANCE") or None, text("DATABASE"))


def route_name(service: str) -> str:
    return "Dynamic_" + re.sub(r"[^A-Za-z0-9_-]+", "_", service).strip("_")


async def answer(
    client: BrokerClient, message: ReceivedMessage, table: dict[str, TableEntry]
) -> str:
    """Handle one received message; returns what was done (for the log and the tests)."""
    if message.message_type_name != MISSING_ROUTE:
        await client.end_conversation(message.conversation_handle)
        return f"ended {message.message_type_name}"
    try:
        request = parse_request(message.message_body)
    except ET.ParseError as exc:
        await client.end_conversation(
            message.conversation_handle, error_code=1, description=f"not a MissingRoute: {exc}"
        )
        return f"refused a malformed request: {exc}"
    entry = table.get(request.service)
    outcome = f"no entry for {request.service!r}; the conversation stays DELAYED"
    if entry is not None:
        name = route_name(request.service)
        try:
            await client.create_route(
                request.database,
                name,
                entry.address,
                remote_service_name=request.service,
                broker_instance=entry.broker_instance or request.broker_instance,
                lifetime=entry.lifetime,
            )
            outcome = f"created route {name} to {entry.address} in {request.database}"
        except RemoteError as exc:
            if "already exists" not in exc.remote_message:
                raise
            await client.alter_route(request.database, name, address=entry.address)
            outcome = f"altered route {name} to {entry.address} in {request.database}"
    await client.end_conversation(message.conversation_handle)
    return outcome


async def serve(
    client: BrokerClient,
    queue: str,
    table: dict[str, TableEntry],
    stop: asyncio.Event,
    outcomes: list[str] | None = None,
) -> None:
    """Answer requests from ``queue`` until ``stop`` is set."""
    while not stop.is_set():
        for message in await client.receive(queue, top=10, timeout=0.5):
            outcome = await answer(client, message, table)
            log.info("%s", outcome)
            if outcomes is not None:
                outcomes.append(outcome)


async def _main(args: argparse.Namespace) -> None:
    config = load_config(args.config)
    table = load_table(Path(args.table))
    client = await BrokerClient.connect(
        config.client.host, config.client.port, token_file=config.client.token_file
    )
    stop = asyncio.Event()
    try:
        await serve(client, args.queue, table, stop)
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--config", required=True, help="the broker's configuration file")
    parser.add_argument("--queue", required=True, help="the routing service's queue")
    parser.add_argument("--table", required=True, help="TOML table of routes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 0
    except (BrokerError, OSError, ValueError) as exc:
        print(f"dynamic_router: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
