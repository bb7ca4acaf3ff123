"""The soak's deployment: A and B exchange dialogs through the forwarder F, and every
hop goes through a fault proxy of its own.

    A --(proxy a>f)--> F --(proxy f>b)--> B
    A <--(proxy f>a)-- F <--(proxy b>f)-- B

Each daemon and each proxy has a loopback address of its own (127.0.0.x, port 4022;
the daemons' client ports are 4023 on their own addresses). F holds no services: its
``msdb`` routes relay both services (R-ROUTE-7). Retransmission, heartbeats and
redial are set short (R-DLG-6, R-PROTO-5), so faults heal in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from brokerd.tools.launcher import Deployment

SERVICE_A = "//soak/A"
SERVICE_B = "//soak/B"
QUEUE_A = "SoakQueueA"
QUEUE_B = "SoakQueueB"
DATABASE_A = "SoakA"
DATABASE_B = "SoakB"
DAEMONS = ("a", "f", "b")
HOPS = ("a>f", "f>b", "b>f", "f>a")
"""The proxied hops, named sender>receiver."""

RETRY = {"initial": 0.5, "maximum": 2.0, "ack_delay": 0.005, "delayed_retry": 0.5}
ENDPOINT = (
    "heartbeat_interval = 1.0\nheartbeat_deadline = 6.0\nconnect_timeout = 5.0\n"
    "handshake_timeout = 5.0\n"
)
"""Short enough to find a blackholed connection in seconds, long enough for a host whose
CPUs are busy: with a 2 s deadline and a 2 s connect timeout, daemons starved of CPU
closed their own healthy connections for missed heartbeats again and again, and the
queues hardly drained."""


@dataclass(frozen=True)
class Hosts:
    """Loopback addresses: daemons at ``prefix.base+1..3``, proxies at ``prefix.base+11..14``."""

    prefix: str = "127.0.0"
    base: int = 200

    def _at(self, offset: int) -> str:
        return f"{self.prefix}.{self.base + offset}"

    def daemon(self, name: str) -> str:
        return self._at(1 + DAEMONS.index(name))

    def proxy(self, hop: str) -> str:
        return self._at(11 + HOPS.index(hop))


def _endpoint_database(name: str, service: str, queue: str, route: tuple[str, str]) -> str:
    remote, address = route
    return f"""
[[database]]
name = "{name}"
[[database.queue]]
name = "{queue}"
[[database.service]]
name = "{service}"
queue = "{queue}"
contracts = ["DEFAULT"]
[[database.route]]
name = "Via forwarder"
remote_service_name = "{remote}"
address = "tcp://{address}:4022"
"""


def _forwarder_database(hosts: Hosts) -> str:
    return f"""
[[database]]
name = "msdb"
[[database.route]]
name = "To B"
remote_service_name = "{SERVICE_B}"
address = "tcp://{hosts.proxy("f>b")}:4022"
[[database.route]]
name = "To A"
remote_service_name = "{SERVICE_A}"
address = "tcp://{hosts.proxy("f>a")}:4022"
"""


def proxy_target(hosts: Hosts, hop: str) -> str:
    """The daemon a hop's proxy forwards to."""
    return hosts.daemon(hop.split(">")[1])


def build(root: Path, hosts: Hosts) -> Deployment:
    """Declare the three daemons (certificates and configurations; nothing started)."""
    deployment = Deployment(root, RETRY)
    deployment.add(
        "a",
        hosts.daemon("a"),
        _endpoint_database(DATABASE_A, SERVICE_A, QUEUE_A, (SERVICE_B, hosts.proxy("a>f"))),
        endpoint_extra=ENDPOINT,
    )
    deployment.add(
        "f",
        hosts.daemon("f"),
        _forwarder_database(hosts),
        endpoint_extra=ENDPOINT + "message_forwarding = true\nmessage_forward_size = 64\n",
    )
    deployment.add(
        "b",
        hosts.daemon("b"),
        _endpoint_database(DATABASE_B, SERVICE_B, QUEUE_B, (SERVICE_A, hosts.proxy("b>f"))),
        endpoint_extra=ENDPOINT,
    )
    return deployment
