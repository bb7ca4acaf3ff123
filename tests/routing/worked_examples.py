"""Service Broker's seven worked routing examples as deployments of real daemons.

SPEC §2, R-ROUTE-1..14.

Each ``example_N(deployment)`` declares (``Deployment.add``, not started) the
daemons of example N and returns an :class:`Example` that names them:

* ``aw`` (127.0.0.31) holds database ``AdventureWorks`` and ``msdb`` with exactly
  the example's route tables. ``AutoCreatedLocal`` is not written: the store
  creates it in every database (R-OBJ-6). The services the tests need are added:
  ``//AW/Initiator`` (begins the conversations), ``LocalService`` (a service
  present locally) and what the example mentions locally.
* the documentation's ``tcp://<name>.Adventure-Works.com:4022/`` hosts are daemons on
  127.0.0.32 / 127.0.0.33 that host the routed services and route replies back
  to ``//AW/Initiator`` on aw (``Example.doc_hosts`` names them);
* ``outside`` (127.0.0.34) begins conversations that arrive at aw from outside
  its instance: every service is routed to aw (one catch-all route).

``MissingService`` exists nowhere. The :class:`Case` list of an example is what
``brokerctl explain`` is asked on aw, with the decision the example describes;
``docs/explain_routing_examples.py`` prints them and the tests check them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from brokerd.tools.launcher import Deployment
from tests.routing.deploy import AW, R, addr, database, queue_of

AW_HOST = "127.0.0.31"
HOST_A = "127.0.0.32"
"""host2 (example 2), partner1 (3), forwarding (4, 7), server1 (5), elsewhere (6)."""
HOST_B = "127.0.0.33"
"""partner2 (example 3), server2 (5)."""
OUTSIDE_HOST = "127.0.0.34"

FORWARDING = "message_forwarding = true\n"

INITIATOR = "//AW/Initiator"
"""In AdventureWorks on aw: the from-service of conversations that begin there."""
LOCAL_SERVICE = "LocalService"
"""In AdventureWorks on aw (and, in examples 4 and 7, also on the other host)."""
MISSING = "MissingService"
"""Exists on no broker."""
OUTSIDE_INITIATOR = "//Outside/Initiator"
"""On the outside broker: the from-service of conversations arriving at aw from outside."""
SALES_SERVICE = "SalesService"
"""Example 1: in a second database ``Sales`` of aw (R-ROUTE-12: any database of the instance)."""
ORDER_PARTS = "OrderParts"
REMOTE_SERVICE = "RemoteService"
"""Examples 4 and 7: only on the forwarding host."""
BALANCED = "BalancedService"
ELSEWHERE = "ElsewhereService"

BI_ONE = uuid.UUID("5fb8d92b-ed69-4c80-afbb-2aa6a7d3cb2d")
"""Example 5, BalancedRouteOne (server1)."""
BI_TWO = uuid.UUID("81b1d3d0-288e-4d2c-b1d3-456cbb944b4f")
"""Example 5, BalancedRouteTwo (server2)."""
BI_PARTS = uuid.UUID("3c0e4f7a-3b1e-4c55-9d21-0a4b5c6d7e8f")
"""Example 3: the mirrored database's broker instance, the same on both partners."""

BACK_TO_AW = R("ReplyToAdventureWorks", addr(AW_HOST), INITIATOR)
"""On the other hosts: replies to //AW/Initiator go to aw."""


@dataclass(frozen=True)
class Case:
    """One question for aw's ``explain`` and the decision the example describes."""

    service: str
    expected: str
    """local | network | delayed | drop"""
    from_outside: bool = False
    broker_instance: uuid.UUID | None = None
    what: str = ""
    """The example's words for this case (for the docs)."""


@dataclass(frozen=True)
class Example:
    number: int
    title: str
    aw_routes: tuple[R, ...]
    """AdventureWorks.sys.routes besides AutoCreatedLocal."""
    msdb_routes: tuple[R, ...]
    """msdb.sys.routes besides AutoCreatedLocal."""
    forwarding: bool
    daemons: tuple[str, ...]
    """Every daemon declared, in start order ("aw" first)."""
    cases: tuple[Case, ...]
    doc_hosts: dict[str, str] = field(default_factory=dict)
    """Daemon name -> the documentation's host name it stands for."""


def _aw(
    deployment: Deployment,
    aw_routes: tuple[R, ...],
    msdb_routes: tuple[R, ...],
    services: tuple[str, ...] = (),
    forwarding: bool = False,
    extra_databases: str = "",
) -> None:
    toml = (
        database(AW, (INITIATOR, LOCAL_SERVICE, *services), aw_routes)
        + database("msdb", routes=msdb_routes)
        + extra_databases
    )
    deployment.add("aw", AW_HOST, toml, endpoint_extra=FORWARDING if forwarding else "")


def _outside(deployment: Deployment) -> None:
    """A broker whose every conversation is routed to aw: traffic from outside aw's instance."""
    deployment.add(
        "outside",
        OUTSIDE_HOST,
        database("Outside", [OUTSIDE_INITIATOR], [R("ToAdventureWorksInstance", addr(AW_HOST))]),
    )


def _remote(deployment: Deployment, name: str, host: str, services: tuple[str, ...]) -> None:
    deployment.add(name, host, database("Remote", services, [BACK_TO_AW]))


def _outside_cases(local: str, dropped: str) -> tuple[Case, ...]:
    return (
        Case(
            local, "local", from_outside=True, what="from outside: msdb AutoCreatedLocal, delivered"
        ),
        Case(
            dropped,
            "drop",
            from_outside=True,
            what="from outside, the service is not in the instance: dropped",
        ),
    )


def example_1(deployment: Deployment) -> Example:
    """Default routing: only AutoCreatedLocal in AdventureWorks and msdb."""
    sales = database("Sales", [SALES_SERVICE])
    _aw(deployment, (), (), extra_databases=sales)
    _outside(deployment)
    return Example(
        1,
        "Default routing (AutoCreatedLocal only)",
        (),
        (),
        False,
        ("aw", "outside"),
        (
            Case(LOCAL_SERVICE, "local", what="begun in AdventureWorks: delivered locally"),
            Case(SALES_SERVICE, "local", what="a service of another database of the instance"),
            Case(
                MISSING,
                "delayed",
                what=(
                    "not present locally: the documentation says dropped, "
                    "R-ROUTE-13 decides DELAYED"
                ),
            ),
            *_outside_cases(LOCAL_SERVICE, MISSING),
        ),
    )


def example_2(deployment: Deployment) -> Example:
    """A network route to OrderParts at host2."""
    aw_routes = (R("OrderPartsRoute", addr(HOST_A), ORDER_PARTS),)
    _aw(deployment, aw_routes, ())
    _remote(deployment, "host2", HOST_A, (ORDER_PARTS,))
    _outside(deployment)
    return Example(
        2,
        "A network route to one service",
        aw_routes,
        (),
        False,
        ("aw", "host2", "outside"),
        (
            Case(ORDER_PARTS, "network", what="OrderPartsRoute: sent to host2"),
            Case(LOCAL_SERVICE, "local", what="other services: AutoCreatedLocal"),
            Case(MISSING, "delayed", what="other service not present locally: DELAYED"),
            *_outside_cases(LOCAL_SERVICE, ORDER_PARTS),
        ),
        {"host2": "host2.Adventure-Works.com"},
    )


def mirrored_database(role: str) -> str:
    """Example 3's mirrored database ``Parts`` as one partner holds it (R-ROUTE-10)."""
    queue = queue_of(ORDER_PARTS)
    return (
        "\n[[database]]\n"
        'name = "Parts"\n'
        f'broker_instance = "{BI_PARTS}"\n'
        f'mirror_role = "{role}"\n'
        "[[database.queue]]\n"
        f'name = "{queue}"\n'
        "[[database.service]]\n"
        f'name = "{ORDER_PARTS}"\n'
        f'queue = "{queue}"\n'
        'contracts = ["DEFAULT"]\n' + BACK_TO_AW.toml()
    )


def example_3(deployment: Deployment, principal: str = "partner1") -> Example:
    """A network route with a mirror address: partner1 (address) / partner2 (mirror).

    ``principal`` names the partner whose database is the principal; the other
    one is the mirror.
    """
    assert principal in ("partner1", "partner2")
    aw_routes = (R("OrderPartsRoute", addr(HOST_A), ORDER_PARTS, mirror_address=addr(HOST_B)),)
    _aw(deployment, aw_routes, ())
    for name, host in (("partner1", HOST_A), ("partner2", HOST_B)):
        role = "principal" if name == principal else "mirror"
        deployment.add(name, host, mirrored_database(role))
    _outside(deployment)
    return Example(
        3,
        "A network route to a mirrored database",
        aw_routes,
        (),
        False,
        ("aw", "partner1", "partner2", "outside"),
        (
            Case(ORDER_PARTS, "network", what="OrderPartsRoute: sent to the principal partner"),
            Case(LOCAL_SERVICE, "local", what="other services: AutoCreatedLocal"),
            Case(MISSING, "delayed", what="other service not present locally: DELAYED"),
            *_outside_cases(LOCAL_SERVICE, ORDER_PARTS),
        ),
        {"partner1": "partner1.Adventure-Works.com", "partner2": "partner2.Adventure-Works.com"},
    )


def example_4(deployment: Deployment) -> Example:
    """A catch-all network route behind AutoCreatedLocal (LOCAL is chosen first)."""
    aw_routes = (R("ExternalRoute", addr(HOST_A)),)
    _aw(deployment, aw_routes, ())
    _remote(deployment, "forwarding", HOST_A, (LOCAL_SERVICE, REMOTE_SERVICE))
    _outside(deployment)
    return Example(
        4,
        "A network route for every service not present locally",
        aw_routes,
        (),
        False,
        ("aw", "forwarding", "outside"),
        (
            Case(LOCAL_SERVICE, "local", what="present locally: AutoCreatedLocal wins"),
            Case(REMOTE_SERVICE, "network", what="not present locally: ExternalRoute"),
            Case(MISSING, "network", what="not present anywhere: still ExternalRoute"),
            *_outside_cases(LOCAL_SERVICE, REMOTE_SERVICE),
        ),
        {"forwarding": "forwarding.Adventure-Works.com"},
    )


def example_5(deployment: Deployment) -> Example:
    """Two broker instances of BalancedService: load balancing."""
    aw_routes = (
        R("BalancedRouteOne", addr(HOST_A), BALANCED, broker_instance=BI_ONE),
        R("BalancedRouteTwo", addr(HOST_B), BALANCED, broker_instance=BI_TWO),
    )
    _aw(deployment, aw_routes, ())
    for name, host, instance in (("server1", HOST_A, BI_ONE), ("server2", HOST_B, BI_TWO)):
        deployment.add(
            name, host, database("Balanced", [BALANCED], [BACK_TO_AW], broker_instance=instance)
        )
    _outside(deployment)
    return Example(
        5,
        "Network routes to two instances of one service (load balancing)",
        aw_routes,
        (),
        False,
        ("aw", "server1", "server2", "outside"),
        (
            Case(BALANCED, "network", what="no broker instance named: one of the two routes"),
            Case(BALANCED, "network", broker_instance=BI_ONE, what="BalancedRouteOne only"),
            Case(BALANCED, "network", broker_instance=BI_TWO, what="BalancedRouteTwo only"),
            Case(MISSING, "delayed", what="other service not present locally: DELAYED"),
            *_outside_cases(LOCAL_SERVICE, BALANCED),
        ),
        {"server1": "server1.Adventure-Works.com", "server2": "server2.Adventure-Works.com"},
    )


def example_6(
    deployment: Deployment, forwarding: bool = True, local_elsewhere: bool = True
) -> Example:
    """msdb forwards ElsewhereService to elsewhere (only for traffic from outside).

    ``local_elsewhere``: aw's AdventureWorks also holds an ElsewhereService.
    """
    msdb_routes = (R("ForwardingRoute", addr(HOST_A), ELSEWHERE),)
    _aw(
        deployment,
        (),
        msdb_routes,
        (ELSEWHERE,) if local_elsewhere else (),
        forwarding=forwarding,
    )
    _remote(deployment, "elsewhere", HOST_A, (ELSEWHERE,))
    _outside(deployment)
    from_outside = (
        Case(ELSEWHERE, "network", from_outside=True, what="ForwardingRoute, forwarding on")
        if forwarding
        else Case(ELSEWHERE, "drop", from_outside=True, what="ForwardingRoute, forwarding off")
    )
    return Example(
        6,
        "Forwarding for one service (msdb route)"
        + ("" if forwarding else ", message forwarding disabled"),
        (),
        msdb_routes,
        forwarding,
        ("aw", "elsewhere", "outside"),
        (
            Case(
                ELSEWHERE,
                "local" if local_elsewhere else "delayed",
                what="begun in AdventureWorks"
                + (", which holds an ElsewhereService too" if local_elsewhere else "")
                + ": AutoCreatedLocal, never msdb's ForwardingRoute",
            ),
            Case(MISSING, "delayed", what="not present locally: DELAYED"),
            from_outside,
            *_outside_cases(LOCAL_SERVICE, MISSING),
        ),
        {"elsewhere": "elsewhere.Adventure-Works.com"},
    )


def example_7(deployment: Deployment, forwarding: bool = True) -> Example:
    """msdb forwards every service not present locally to the forwarding host."""
    msdb_routes = (R("ForwardingRoute", addr(HOST_A)),)
    _aw(deployment, (), msdb_routes, forwarding=forwarding)
    _remote(deployment, "forwarding", HOST_A, (LOCAL_SERVICE, REMOTE_SERVICE))
    _outside(deployment)
    return Example(
        7,
        "Forwarding for every service not present locally"
        + ("" if forwarding else ", message forwarding disabled"),
        (),
        msdb_routes,
        forwarding,
        ("aw", "forwarding", "outside"),
        (
            Case(LOCAL_SERVICE, "local", what="begun in AdventureWorks: AutoCreatedLocal"),
            Case(REMOTE_SERVICE, "delayed", what="begun in AdventureWorks, not local: DELAYED"),
            Case(
                LOCAL_SERVICE,
                "local",
                from_outside=True,
                what="from outside, present locally: AutoCreatedLocal before ForwardingRoute",
            ),
            Case(
                REMOTE_SERVICE,
                "network" if forwarding else "drop",
                from_outside=True,
                what="from outside, not present locally: ForwardingRoute"
                + ("" if forwarding else ", but forwarding is off: dropped"),
            ),
            Case(
                MISSING,
                "network" if forwarding else "drop",
                from_outside=True,
                what="from outside, not present anywhere: ForwardingRoute all the same"
                + ("" if forwarding else ", but forwarding is off: dropped"),
            ),
        ),
        {"forwarding": "forwarding.Adventure-Works.com"},
    )


EXAMPLES = {
    1: example_1,
    2: example_2,
    3: example_3,
    4: example_4,
    5: example_5,
    6: example_6,
    7: example_7,
}
