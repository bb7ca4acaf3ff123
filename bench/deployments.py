"""The deployments the benchmarks run: daemons on loopback addresses, built with
:mod:`brokerd.tools.launcher` from the example application's databases
(:mod:`brokerd.tools.example`: the shop's //shop/Client sends //shop/Order on
//shop/OrderContract to the warehouse's //warehouse/Orders, queue OrderQueue).

Unlike the launcher's test defaults, these use the daemon's own timings:
``[retry]`` from :class:`brokerd.config.RetryConfig` and the endpoint's reconnect
backoff from :class:`brokerd.config.EndpointConfig`. Encryption and delivery traces
are switched by the caller; everything else is the daemon's default (SQLite WAL with
``synchronous=FULL``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from brokerd.config import EndpointConfig, RetryConfig
from brokerd.sdk.client import BrokerClient
from brokerd.tools import example
from brokerd.tools.launcher import Daemon, Deployment

QUEUE = "OrderQueue"
"""The warehouse's queue, where the consumer receives."""
FROM_SERVICE = example.SHOP_SERVICE
TO_SERVICE = example.WAREHOUSE_SERVICE
CONTRACT = example.CONTRACT
MESSAGE_TYPE = example.ORDER

TOPOLOGIES = ("local", "remote", "forwarder")
DEFAULT_HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


@dataclass
class Topology:
    """A declared deployment and the roles of its daemons."""

    deployment: Deployment
    producer: str
    """The daemon the producer connects to (the shop)."""
    consumer: str
    """The daemon the consumer connects to (the warehouse)."""

    @property
    def daemons(self) -> dict[str, Daemon]:
        return self.deployment.daemons

    def start(self, *names: str) -> None:
        for name in names or tuple(self.daemons):
            self.deployment.start(name)


def daemon_defaults() -> tuple[dict[str, float], tuple[float, float]]:
    """The daemon's default ``[retry]`` table and (reconnect_initial, reconnect_max)."""
    endpoint = EndpointConfig(Path("unused"), Path("unused"), Path("unused"))
    return dataclasses.asdict(RetryConfig()), (endpoint.reconnect_initial, endpoint.reconnect_max)


def local_databases_toml() -> str:
    """Shop and warehouse in one instance, without routes (AutoCreatedLocal applies)."""
    return example.shop_database(None) + example.warehouse_database(None)


def one_database_toml() -> str:
    """Shop and warehouse as two services of one database (``shop``): a SEND goes
    straight into the warehouse's queue (R-DLG-13)."""
    return example.two_services_database("shop")


def _forwarder_msdb(shop_host: str, warehouse_host: str) -> str:
    """msdb of a forwarding broker: each service's traffic goes on to its own broker."""
    return f"""
[[database]]
name = "msdb"
[[database.route]]
name = "ToWarehouse"
remote_service_name = "{TO_SERVICE}"
address = "tcp://{warehouse_host}:4022"
[[database.route]]
name = "ToShop"
remote_service_name = "{FROM_SERVICE}"
address = "tcp://{shop_host}:4022"
"""


def build(
    topology: str,
    root: Path,
    *,
    encryption: bool = True,
    trace: bool = True,
    hosts: tuple[str, ...] = DEFAULT_HOSTS,
    retry: dict[str, float] | None = None,
    databases: int = 2,
) -> Topology:
    """Declare (not start) one of :data:`TOPOLOGIES`:

    * ``local``: one daemon ``solo`` holding the shop and the warehouse (in-process
      delivery by the ``AutoCreatedLocal`` route); with ``databases`` 1, both services
      in one database;
    * ``remote``: ``alpha`` (shop) on hosts[0] and ``beta`` (warehouse) on hosts[1];
    * ``forwarder``: ``alpha`` and ``beta`` route to each other through ``gamma`` on
      hosts[2], which forwards (``message_forwarding = true``) by its msdb routes.

    ``encryption`` False sets ``encryption = "disabled"`` on every endpoint (messages
    are still signed); ``trace`` False disables delivery traces.
    """
    default_retry, reconnect = daemon_defaults()
    deployment = Deployment(root, {**default_retry, **(retry or {})}, reconnect)
    extra = "" if trace else "[trace]\nenabled = false\n"
    endpoint_extra = "" if encryption else 'encryption = "disabled"\n'
    if topology == "local":
        toml = one_database_toml() if databases == 1 else local_databases_toml()
        deployment.add("solo", hosts[0], toml, extra=extra, endpoint_extra=endpoint_extra)
        return Topology(deployment, "solo", "solo")
    if topology == "remote":
        shop, warehouse = example.shop_database(hosts[1]), example.warehouse_database(hosts[0])
    elif topology == "forwarder":
        shop, warehouse = example.shop_database(hosts[2]), example.warehouse_database(hosts[2])
        deployment.add(
            "gamma",
            hosts[2],
            _forwarder_msdb(hosts[0], hosts[1]),
            extra=extra,
            endpoint_extra=endpoint_extra + "message_forwarding = true\n",
        )
    else:
        raise ValueError(f"unknown topology {topology!r}")
    deployment.add("alpha", hosts[0], shop, extra=extra, endpoint_extra=endpoint_extra)
    deployment.add("beta", hosts[1], warehouse, extra=extra, endpoint_extra=endpoint_extra)
    return Topology(deployment, "alpha", "beta")


async def commits_so_far(client: BrokerClient) -> int:
    """Group commits of a daemon's databases since it started (its ``databases`` view):
    one WAL write and one fsync each."""
    return sum(int(row.get("commits", 0)) for row in await client.view("databases"))
