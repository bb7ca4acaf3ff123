"""The soak's deployment: A and B exchange dialogs through the forwarder F, and every
hop goes through a fault proxy of its own.

    A --(proxy a>f)--> F --(proxy f>b)--> B   (and --(proxy f>b2)--> B2)
    A <--(proxy f>a)-- F <--(proxy b>f)-- B   (and <--(proxy b2>f)-- B2)

A also holds a second database, ``SoakLocal``, with two services ``//soak/L1`` and
``//soak/L2`` (queues ``SoakQueueL1`` and ``SoakQueueL2``): dialogs between them stay
inside one database of one daemon, so after a dialog's first message a SEND outside
a transaction goes straight into the target queue (direct delivery, R-DLG-13), with
no transmission queue, link or acknowledgement; no proxy is involved, but A is among
the daemons the soak SIGKILLs.

B is a mirrored pair (R-ROUTE-10, R-ROUTE-15, R-ROUTE-16): daemons ``b`` and ``b2``
hold the same database (one broker instance identifier), ``b`` starts as principal
and ``b2`` as its mirror, and they replicate over a direct connection (no proxy: the
pair's own link is not among the faults). F's route to B names both partners
(``mirror_address``) and follows the principal. Without mirroring (``mirror=False``)
B is the one daemon ``b``.

Each daemon and each proxy has a loopback address of its own (127.0.0.x, port 4022;
the daemons' client ports are 4023 on their own addresses). F holds no services: its
``msdb`` routes relay both services (R-ROUTE-7). Retransmission, heartbeats and
redial are set short (R-DLG-6, R-PROTO-5), so faults heal in seconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from brokerd.tools.launcher import Deployment

SERVICE_A = "//soak/A"
SERVICE_B = "//soak/B"
QUEUE_A = "SoakQueueA"
QUEUE_B = "SoakQueueB"
DATABASE_A = "SoakA"
DATABASE_B = "SoakB"
SERVICE_L1 = "//soak/L1"
SERVICE_L2 = "//soak/L2"
QUEUE_L1 = "SoakQueueL1"
QUEUE_L2 = "SoakQueueL2"
DATABASE_LOCAL = "SoakLocal"
"""A's second database: both services of the local stream (direct delivery, R-DLG-13)."""
DATABASE_B_INSTANCE = "8f4e2a61-3b7d-4c59-a0e2-6d1f9b3c7e45"
DAEMONS = ("a", "f", "b", "b2")
PARTNERS = ("b", "b2")
"""The mirrored pair holding B's database; ``b`` starts as principal."""
HOPS = ("a>f", "f>b", "b>f", "f>a", "f>b2", "b2>f")
"""The proxied hops, named sender>receiver."""


def daemons(mirror: bool) -> tuple[str, ...]:
    return DAEMONS if mirror else DAEMONS[:3]


def hops(mirror: bool) -> tuple[str, ...]:
    return HOPS if mirror else HOPS[:4]


RETRY = {"initial": 0.5, "maximum": 2.0, "ack_delay": 0.005, "delayed_retry": 0.5}
ENDPOINT = (
    "heartbeat_interval = 1.0\nheartbeat_deadline = 6.0\nconnect_timeout = 5.0\n"
    "handshake_timeout = 5.0\n"
)
"""Short enough to find a blackholed connection in seconds, long enough for a host whose
CPUs are busy: with a 2 s deadline and a 2 s connect timeout, daemons starved of CPU
closed their own healthy connections for missed heartbeats again and again, and the
queues hardly drained."""

FRAGMENT_SIZES = (16 * 1024, 32 * 1024, 64 * 1024)
"""The ``limits.fragment_size`` values a daemon runs with. B's mirror starts with another
than its principal, and every restart picks one at random, so a restarted sender or a
promoted mirror cuts again a message its receiver holds part of (R-DLG-7)."""
_FRAGMENT_SIZE = re.compile(r"(?m)^fragment_size = \d+$")


SEGMENTS = "body_segment_mb = 1\nbody_compact_after = 2\n"
"""The segments of large bodies of every daemon: small, and compacted 2 s after they are
closed, so that the bodies a soak's faults hold back (a partner down, a retransmission
awaited, a consumer stalled) are moved between segments while daemons are killed and
restarted."""


def _limits(fragment_size: int) -> str:
    return f"[limits]\nfragment_size = {fragment_size}\n{SEGMENTS}"


def set_fragment_size(config: Path, fragment_size: int) -> None:
    """Give a declared daemon another fragment size (it takes it when it starts)."""
    text = config.read_text()
    config.write_text(_FRAGMENT_SIZE.sub(f"fragment_size = {fragment_size}", text))


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


def _endpoint_database(
    name: str, service: str, queue: str, route: tuple[str, str], mirror: str = ""
) -> str:
    remote, address = route
    return f"""
[[database]]
name = "{name}"
{mirror}[[database.queue]]
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


def _local_database() -> str:
    """Both local services and their queues in one database (no route: the services are
    found in the instance, R-ROUTE-12)."""
    parts = [f'\n[[database]]\nname = "{DATABASE_LOCAL}"\n']
    for queue in (QUEUE_L1, QUEUE_L2):
        parts.append(f'[[database.queue]]\nname = "{queue}"\n')
    for service, queue in ((SERVICE_L1, QUEUE_L1), (SERVICE_L2, QUEUE_L2)):
        parts.append(
            f'[[database.service]]\nname = "{service}"\nqueue = "{queue}"\n'
            'contracts = ["DEFAULT"]\n'
        )
    return "".join(parts)


def _mirror_keys(hosts: Hosts, role: str, partner: str) -> str:
    # "stall" (R-ROUTE-16): nothing is released that the mirror does not hold, so a
    # failover may lose nothing. In "exposed" mode a failover after the mirror was lost
    # loses, by design, what only the old principal held: not what the soak checks.
    return (
        f'broker_instance = "{DATABASE_B_INSTANCE}"\nmirror_role = "{role}"\n'
        f'mirror_partner = "tcp://{hosts.daemon(partner)}:4022"\n'
        'mirror_when_lost = "stall"\n'
    )


def _forwarder_database(hosts: Hosts, mirror: bool) -> str:
    mirror_address = f'mirror_address = "tcp://{hosts.proxy("f>b2")}:4022"\n' if mirror else ""
    return f"""
[[database]]
name = "msdb"
[[database.route]]
name = "To B"
remote_service_name = "{SERVICE_B}"
address = "tcp://{hosts.proxy("f>b")}:4022"
{mirror_address}[[database.route]]
name = "To A"
remote_service_name = "{SERVICE_A}"
address = "tcp://{hosts.proxy("f>a")}:4022"
"""


def proxy_target(hosts: Hosts, hop: str) -> str:
    """The daemon a hop's proxy forwards to."""
    return hosts.daemon(hop.split(">")[1])


def build(root: Path, hosts: Hosts, mirror: bool = True) -> Deployment:
    """Declare the daemons (certificates and configurations; nothing started). Each
    daemon dies with the soak that starts it, also when the soak is SIGKILLed."""
    deployment = Deployment(root, RETRY, dies_with_parent=True)
    deployment.add(
        "a",
        hosts.daemon("a"),
        _endpoint_database(DATABASE_A, SERVICE_A, QUEUE_A, (SERVICE_B, hosts.proxy("a>f")))
        + _local_database(),
        # One fragment a frame: a lost frame or a kill leaves part of a large message
        # with its receiver, which a restart with another fragment size cuts again.
        endpoint_extra=ENDPOINT + "fragments_per_frame = 1\n",
        extra=_limits(FRAGMENT_SIZES[-1]),
    )
    deployment.add(
        "f",
        hosts.daemon("f"),
        _forwarder_database(hosts, mirror),
        endpoint_extra=ENDPOINT + "message_forwarding = true\nmessage_forward_size = 64\n",
        extra=_limits(FRAGMENT_SIZES[-1]),
    )
    for name in PARTNERS if mirror else PARTNERS[:1]:
        keys = ""
        if mirror:
            role, partner = ("principal", "b2") if name == "b" else ("mirror", "b")
            keys = _mirror_keys(hosts, role, partner)
        deployment.add(
            name,
            hosts.daemon(name),
            _endpoint_database(
                DATABASE_B, SERVICE_B, QUEUE_B, (SERVICE_A, hosts.proxy(f"{name}>f")), keys
            ),
            endpoint_extra=ENDPOINT,
            extra=_limits(FRAGMENT_SIZES[-1] if name == "b" else FRAGMENT_SIZES[0]),
        )
    return deployment
