"""Route lookup, a pure function (SPEC §2 R-ROUTE-1 .. R-ROUTE-14, R-OBJ-5, R-OBJ-6).

One test per requirement step, then Service Broker's seven worked routing examples as
table-driven cases. The example addresses ``tcp://<host>.Adventure-Works.com:4022/``
are mapped to loopback addresses. Every decision is also checked for its
reasoning: non-empty ``steps`` ending in the ``decision:`` line.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from brokerd.config.addresses import normal_tcp_address
from brokerd.dialogs.router.decisions import own_addresses
from brokerd.routing.rules import (
    BROKER_CONFIGURATION_SERVICE,
    LOCAL,
    TRANSPORT,
    Conversation,
    Decision,
    LocalDatabase,
    Route,
    decide,
    equivalent,
    locate_local,
    spread,
    transport_address,
)

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
AW = "AdventureWorks"
BI_AW = uuid.UUID("11111111-1111-4111-8111-111111111111")
BI_OTHER = uuid.UUID("22222222-2222-4222-8222-222222222222")
BI_X = uuid.UUID("5fb8d92b-ed69-4c80-afbb-2aa6a7d3cb2d")
BI_Y = uuid.UUID("81b1d3d0-288e-4d2c-b1d3-456cbb944b4f")
BI_NOWHERE = uuid.UUID("99999999-9999-4999-8999-999999999999")
OWN = "tcp://127.0.0.1:4022"
A1, A2, A3 = "tcp://127.0.0.11:4022", "tcp://127.0.0.12:4022", "tcp://127.0.0.13:4022"
AUTO = Route("AutoCreatedLocal", LOCAL, source="system")  # R-OBJ-6

_rng = random.Random(4022)


def cid() -> uuid.UUID:
    """A uuid4 conversation id, reproducible across runs."""
    return uuid.UUID(int=_rng.getrandbits(128), version=4)


def dbs(*services: str, other: tuple[str, ...] = ()) -> list[LocalDatabase]:
    """AdventureWorks holding ``services``; a second database ``Other`` holding ``other``."""
    return [
        LocalDatabase(AW, BI_AW, frozenset(services)),
        LocalDatabase("Other", BI_OTHER, frozenset(other)),
    ]


def conv(
    service: str = "Svc",
    *,
    origin: str | None = AW,
    broker_instance: uuid.UUID | None = None,
    conversation_id: uuid.UUID | None = None,
    address: str | None = None,
    chosen_instance: uuid.UUID | None = None,
) -> Conversation:
    return Conversation(
        service, conversation_id or cid(), broker_instance, origin, address, chosen_instance
    )


def run(
    routes: list[Route],
    conversation: Conversation,
    databases: list[LocalDatabase] | None = None,
    **kwargs: Any,
) -> Decision:
    """``decide`` plus the invariants of its reasoning."""
    d = decide(routes, conversation, dbs() if databases is None else databases, NOW, **kwargs)
    assert d.steps, d
    assert d.steps[-1].startswith("decision:"), d.steps
    assert d.steps[-1] == f"decision: {d.kind.upper()}: {d.reason}"
    assert sum(line.startswith("decision:") for line in d.steps) == 1
    return d


def matched_by(d: Decision, step: int) -> bool:
    """The decision names the R-ROUTE-4 step whose routes were selected from."""
    return f"R-ROUTE-4 step {step}" in d.steps[-1]


def mentions(d: Decision, text: str) -> bool:
    return any(text in line for line in d.steps)


# R-ROUTE-4: matching
def test_r_route_4_step_1_service_and_broker_instance_match() -> None:
    routes = [AUTO, Route("X", A1, "Svc", BI_X), Route("Any", A2, "Svc")]
    routes.append(Route("Y", A3, "Svc", BI_Y))
    d = run(routes, conv(broker_instance=BI_X))
    assert (d.kind, d.route, d.address, d.broker_instance) == ("network", "X", A1, BI_X)
    assert matched_by(d, 1)
    assert mentions(d, "R-ROUTE-4 step 1: routes for service 'Svc' and broker instance")


@pytest.mark.parametrize("named", [None, BI_NOWHERE], ids=["no-instance", "unknown-instance"])
def test_r_route_4_step_2_null_broker_instance(named: uuid.UUID | None) -> None:
    routes = [AUTO, Route("X", A1, "Svc", BI_X), Route("Any", A2, "Svc")]
    d = run(routes, conv(broker_instance=named))
    assert (d.kind, d.route, d.address) == ("network", "Any", A2)
    assert matched_by(d, 2)


def test_r_route_4_step_3_picks_one_broker_instance() -> None:
    routes = [AUTO, Route("X1", A1, "Svc", BI_X), Route("X2", A2, "Svc", BI_X)]
    routes += [Route("Y", A3, "Svc", BI_Y), Route("Other", A3, "NotSvc")]
    by_instance = {BI_X: {"X1", "X2"}, BI_Y: {"Y"}}
    instances: set[uuid.UUID] = set()
    for _ in range(200):
        c = conv()
        d = run(routes, c)
        assert d.kind == "network" and matched_by(d, 3)
        assert d.broker_instance is not None and d.route in by_instance[d.broker_instance]
        instances.add(d.broker_instance)
        assert run(list(reversed(routes)), c).route == d.route  # the conversation keeps it
    assert instances == {BI_X, BI_Y}
    # A conversation that names a broker instance never gets one arbitrarily (step 3 skipped).
    d = run(routes, conv(broker_instance=BI_NOWHERE), dbs("Svc"))
    assert mentions(d, "R-ROUTE-4 step 3: skipped")
    assert d.kind == "delayed" and matched_by(d, 5)


def test_r_route_4_step_4_dynamic_routing_request() -> None:
    dynamic = Route("Dynamic", A1, BROKER_CONFIGURATION_SERVICE)
    # Step 4 comes before step 5: AutoCreatedLocal would deliver Svc locally.
    d = run([AUTO, dynamic], conv(), dbs("Svc"))
    assert (d.kind, d.request_route, d.route) == ("delayed", True, "Dynamic")
    assert mentions(d, "R-ROUTE-4 step 4: a route to the dynamic routing service exists")
    # A named route still wins (steps 1-3 come first).
    d = run([AUTO, dynamic, Route("S", A2, "Svc")], conv())
    assert (d.kind, d.request_route, d.route) == ("network", False, "S")
    # An expired route to the dynamic routing service does not count.
    expired = Route("Dynamic", A1, BROKER_CONFIGURATION_SERVICE, lifetime=NOW)
    d = run([AUTO, expired], conv(), dbs("Svc"))
    assert (d.kind, d.request_route) == ("local", False)


def test_r_route_4_step_4_skipped_while_request_pending() -> None:
    dynamic = Route("Dynamic", A1, BROKER_CONFIGURATION_SERVICE)
    d = run([AUTO, dynamic], conv(), dbs("Svc"), pending_route_requests={"Svc"})
    assert (d.kind, d.request_route, d.database) == ("local", False, AW)
    assert matched_by(d, 5)
    assert mentions(d, "R-ROUTE-4 step 4: a request for 'Svc'")
    # A request pending for another service does not hold this one back.
    d = run([AUTO, dynamic], conv(), dbs("Svc"), pending_route_requests={"Else"})
    assert (d.kind, d.request_route) == ("delayed", True)
    # Pending and nothing else matches: step 7, still no second request.
    d = run([dynamic], conv(), dbs("Svc"), pending_route_requests={"Svc"})
    assert (d.kind, d.request_route) == ("delayed", False)
    assert mentions(d, "R-ROUTE-4 step 7")


def test_r_route_4_step_4_waits_while_the_table_has_its_requests_pending() -> None:
    """R-ROUTE-14: with ``limits.route_requests`` pending, step 4 still marks the
    conversation DELAYED (it does not fall through to step 5); its request is sent when it
    is routed again with fewer pending, and the reason names the limit."""
    dynamic = Route("Dynamic", A1, BROKER_CONFIGURATION_SERVICE)
    d = run(
        [AUTO, dynamic],
        conv(),
        dbs("Svc"),
        pending_route_requests={"Else"},
        route_requests_full=True,
    )
    assert (d.kind, d.request_route) == ("delayed", True)
    assert "limits.route_requests" in d.reason and "R-ROUTE-14" in d.reason
    # a service already asked for is not asked again, full or not: step 5 as before
    d = run(
        [AUTO, dynamic],
        conv(),
        dbs("Svc"),
        pending_route_requests={"Svc"},
        route_requests_full=True,
    )
    assert (d.kind, d.request_route, d.database) == ("local", False, AW)


def test_r_route_4_step_5_catch_all() -> None:
    routes = [Route("Ext", A1), Route("Named", A2, "NotSvc")]
    d = run(routes, conv())
    assert (d.kind, d.route, d.address) == ("network", "Ext", A1)
    assert matched_by(d, 5)
    # NULL service but a broker instance is not a catch-all route.
    d = run([Route("Half", A1, None, BI_X)], conv(broker_instance=BI_X))
    assert d.kind == "delayed"
    assert mentions(d, "NULL service name and NULL broker instance: none")


def test_r_route_4_step_6_implicit_local() -> None:
    routes = [Route("Named", A2, "NotSvc")]
    d = run(routes, conv(broker_instance=BI_OTHER), dbs(other=("Svc",)))
    assert (d.kind, d.database, d.broker_instance) == ("local", "Other", BI_OTHER)
    assert matched_by(d, 6)
    # Without a broker instance in the conversation, step 6 does not apply.
    d = run(routes, conv(), dbs(other=("Svc",)))
    assert d.kind == "delayed" and mentions(d, "R-ROUTE-4 step 6: skipped")
    # With one, but no database holds the service.
    d = run(routes, conv(broker_instance=BI_OTHER), dbs("NotSvc"))
    assert d.kind == "delayed" and mentions(d, "R-ROUTE-4 step 6: no database")


def test_r_route_4_step_7_delayed() -> None:
    routes = [Route("Named", A1, "NotSvc"), Route("Dead", A2, lifetime=NOW - timedelta(1))]
    d = run(routes, conv(), dbs("Svc"))
    assert (d.kind, d.route, d.address, d.request_route) == ("delayed", None, None, False)
    assert mentions(d, "R-ROUTE-4 step 7: no route matched")
    d = run(routes, conv(origin=None), dbs("Svc"))
    assert (d.kind, d.arrived_from_outside) == ("drop", True)


STEP_1_OVER_2 = [Route("X", A1, "Svc", BI_X), Route("Mirror", A2, "Svc", None, A3)]


@pytest.mark.parametrize(
    ("routes", "conversation", "expected", "step"),
    [
        # Step 1 ends matching: the step-2 route with a mirror would win selection otherwise.
        (STEP_1_OVER_2, conv(broker_instance=BI_X), "X", 1),
        # Step 2 ends matching: AutoCreatedLocal (LOCAL, service held here) would win otherwise.
        ([AUTO, Route("Net", A1, "Svc")], conv(), "Net", 2),
        # Step 3 ends matching before step 5.
        ([AUTO, Route("Y", A1, "Svc", BI_Y)], conv(), "Y", 3),
    ],
    ids=["step-1-over-2", "step-2-over-5", "step-3-over-5"],
)
def test_r_route_4_first_step_with_routes_ends_matching(
    routes: list[Route], conversation: Conversation, expected: str, step: int
) -> None:
    d = run(routes, conversation, dbs("Svc"))
    assert (d.kind, d.route) == ("network", expected)
    assert matched_by(d, step)


# R-ROUTE-5: selection
def test_r_route_5_step_1_mirror_first() -> None:
    routes = [AUTO, Route("Net", A1), Route("Mirrored", A2, mirror_address=A3)]
    d = run(routes, conv(), dbs("Svc"))
    assert (d.kind, d.route, d.address, d.mirror_address) == ("network", "Mirrored", A2, A3)
    assert mentions(d, "R-ROUTE-5 step 1: route(s) with a mirror address")


def test_r_route_5_step_2_local_before_network() -> None:
    routes = [Route("Net", A1), AUTO]
    d = run(routes, conv(), dbs("Svc"))
    assert (d.kind, d.route, d.database, d.address) == ("local", "AutoCreatedLocal", AW, None)
    assert d.broker_instance == BI_AW


def test_r_route_5_step_2_local_without_service_goes_on_to_network() -> None:
    d = run([AUTO, Route("Net", A1)], conv(), dbs("NotSvc"))
    assert (d.kind, d.route, d.address) == ("network", "Net", A1)
    assert mentions(d, "no database of this instance holds service 'Svc'; going on to step 3")


def test_r_route_5_step_3_network() -> None:
    service = "tcp://127.0.0.9:4022/Svc"
    d = run([Route("Transport", TRANSPORT), Route("Net", A1)], conv(service), dbs())
    assert (d.kind, d.route, d.address) == ("network", "Net", A1)
    assert mentions(d, "R-ROUTE-5 step 3: network route(s)")


def test_r_route_5_step_4_transport() -> None:
    service = "tcp://127.0.0.9:4022/Svc"
    d = run([AUTO, Route("Transport", TRANSPORT)], conv(service), dbs())
    assert (d.kind, d.route, d.address) == ("network", "Transport", "tcp://127.0.0.9:4022")
    assert mentions(d, "R-ROUTE-5 step 4: TRANSPORT route Transport")
    # LOCAL still comes first when the service is here.
    d = run([AUTO, Route("Transport", TRANSPORT)], conv(service), dbs(service))
    assert (d.kind, d.route) == ("local", "AutoCreatedLocal")


def test_r_route_5_equivalent_routes_count_once() -> None:
    same_a, same_b = Route("A", A1, "Svc"), Route("B", A1, "Svc")
    other = Route("C", A2, "Svc")
    assert sorted(r.address for r in equivalent([same_b, other, same_a])) == [A1, A2]
    assert len(equivalent([same_a, Route("D", A1, "Svc", BI_X), Route("E", A1)])) == 3
    counts: Counter[str] = Counter()
    for _ in range(1000):
        d = run([same_a, same_b, other], conv())
        counts[d.address or ""] += 1
    # Two choices, not three: each address gets about half the conversations, not 2/3 : 1/3.
    assert set(counts) == {A1, A2}
    assert 400 <= counts[A1] <= 600, counts


def test_r_route_5_spread_is_stable_per_conversation_and_spreads() -> None:
    routes = [AUTO, Route("One", A1, "Svc"), Route("Two", A2, "Svc")]
    chosen: Counter[str] = Counter()
    for _ in range(300):
        c = conv(conversation_id=uuid.uuid4())
        d = run(routes, c)
        assert d.route in {"One", "Two"}
        chosen[d.route or ""] += 1
        assert run(routes, c).route == d.route
        assert run(list(reversed(routes)), c).route == d.route  # not the table's order
        assert spread([routes[2], routes[1]], c).name == d.route
    assert set(chosen) == {"One", "Two"}
    assert min(chosen.values()) >= 90, chosen


def test_r_route_5_a_conversation_keeps_its_address_when_equal_routes_change() -> None:
    """R-ROUTE-5 and R-ROUTE-3: a conversation whose messages went to one address keeps
    it while a route to it is among the equal ones, whatever routes were added; once no
    route leads there, it is spread again."""
    one, two = Route("One", A1, "Svc"), Route("Two", A2, "Svc")
    many = [
        AUTO,
        one,
        two,
        *(Route(f"Z{n}", f"tcp://127.0.0.{n}:4022", "Svc") for n in range(60, 70)),
    ]
    for _ in range(100):
        base = conv(conversation_id=uuid.uuid4())
        first = run([AUTO, one, two], base)
        kept = conv(conversation_id=base.conversation_id, address=first.address)
        assert run(many, kept).address == first.address
        gone = [AUTO, *(r for r in many[1:] if r.address != first.address)]
        assert run(gone, kept).address != first.address


def test_r_route_4_step_3_a_conversation_keeps_its_broker_instance_when_routes_change() -> None:
    """R-ROUTE-4 step 3, R-ROUTE-5 and R-ROUTE-3: a conversation whose messages went to
    the route of one broker instance keeps that broker instance while a route names it,
    whatever routes of other broker instances were added (before its first
    acknowledgement binds it, another broker would begin the dialog again); once no
    route names it, one is chosen again."""
    x = Route("X", A1, "Svc", BI_X)
    more = [Route(f"Z{n}", f"tcp://127.0.0.{n}:4022", "Svc", uuid.uuid4()) for n in range(60, 70)]
    for _ in range(100):
        base = conv(conversation_id=uuid.uuid4())
        first = run([AUTO, x], base)
        assert (first.broker_instance, first.choices) == (BI_X, 1)
        kept = conv(
            conversation_id=base.conversation_id,
            address=first.address,
            chosen_instance=first.broker_instance,
        )
        later = run([AUTO, x, *more], kept)
        assert (later.route, later.broker_instance) == ("X", BI_X)
        assert mentions(later, "kept by this conversation")
        again = run([AUTO, Route("X", A2, "Svc", BI_X), *more], kept)  # X's address altered
        assert (again.route, again.address) == ("X", A2)
    # no route names it any more: another is chosen
    assert run([AUTO, *more], kept).broker_instance != BI_X


def test_r_route_5_spread_after_step_3_uses_every_route_of_the_chosen_instance() -> None:
    routes = [Route("X1", A1, "Svc", BI_X), Route("X2", A2, "Svc", BI_X)]
    routes += [Route("Y1", A3, "Svc", BI_Y), Route("Y2", "tcp://127.0.0.14:4022", "Svc", BI_Y)]
    chosen = {run(routes, conv()).route for _ in range(400)}
    assert chosen == {"X1", "X2", "Y1", "Y2"}


# R-OBJ-5, R-OBJ-6: the routes catalog
def test_r_obj_5_expired_routes_ignored() -> None:
    soon, later = NOW + timedelta(hours=1), NOW + timedelta(hours=2)
    routes = [
        AUTO,
        Route("Old", A1, "Svc", lifetime=NOW - timedelta(seconds=1)),
        Route("Edge", A1, "Svc", lifetime=NOW),  # lifetime == now: expired
        Route("New", A2, "Svc", lifetime=later),
        Route("Else", A3, "NotSvc", lifetime=soon),
    ]
    d = run(routes, conv())
    assert (d.kind, d.route, d.address) == ("network", "New", A2)
    assert d.valid_until == soon
    assert mentions(d, "R-OBJ-5: route Old expired") and mentions(d, "R-OBJ-5: route Edge expired")
    # Once every named route has expired, AutoCreatedLocal (R-OBJ-6) delivers locally.
    d = run(routes[:3], conv(), dbs("Svc"))
    assert (d.kind, d.route, d.valid_until) == ("local", "AutoCreatedLocal", None)


# R-ROUTE-1: which table
def test_r_route_1_outside_conversation_uses_given_table() -> None:
    database = [AUTO, Route("OrderPartsRoute", A1, "OrderParts")]
    msdb = [AUTO]
    d = run(database, conv("OrderParts"), dbs(), msdb_routes=msdb)
    assert (d.kind, d.route, d.arrived_from_outside) == ("network", "OrderPartsRoute", False)
    assert d.steps[0].startswith("R-ROUTE-1: the conversation began in database 'AdventureWorks'")
    d = run(msdb, conv("OrderParts", origin=None), dbs(), forwarding=True)
    assert (d.kind, d.route, d.arrived_from_outside) == ("drop", None, True)
    assert d.steps[0].startswith("R-ROUTE-1: the conversation arrived from outside")
    d = run(msdb, conv("OrderParts", origin=None), dbs("OrderParts"))
    assert (d.kind, d.database, d.arrived_from_outside) == ("local", AW, True)


# R-ROUTE-6: the forwarding gate

GATED = {
    "network": Route("Fwd", A1, "Svc"),
    "mirror": Route("Fwd", A1, "Svc", mirror_address=A2),
    "transport": Route("Fwd", TRANSPORT, "tcp://127.0.0.9:4022/Svc"),
}


@pytest.mark.parametrize("kind", sorted(GATED))
def test_r_route_6_forwarding_gate_drops_when_disabled(kind: str) -> None:
    route = GATED[kind]
    service = route.remote_service_name or ""
    d = run([AUTO, route], conv(service, origin=None), dbs(), forwarding=False)
    assert (d.kind, d.route, d.arrived_from_outside) == ("drop", "Fwd", True)
    assert mentions(d, "R-ROUTE-6: message forwarding is disabled")


@pytest.mark.parametrize("kind", sorted(GATED))
def test_r_route_6_forwarding_enabled_forwards(kind: str) -> None:
    route = GATED[kind]
    service = route.remote_service_name or ""
    d = run([AUTO, route], conv(service, origin=None), dbs(), forwarding=True)
    assert (d.kind, d.route, d.arrived_from_outside) == ("network", "Fwd", True)
    assert d.address in {A1, "tcp://127.0.0.9:4022"}
    assert mentions(d, "R-ROUTE-6: message forwarding is enabled")


def test_r_route_6_local_route_needs_no_forwarding() -> None:
    d = run([AUTO, Route("Ext", A1)], conv(origin=None), dbs("Svc"), forwarding=False)
    assert (d.kind, d.database) == ("local", AW)
    assert not mentions(d, "R-ROUTE-6")
    # The gate is for traffic from outside only: a conversation begun here may leave.
    d = run([AUTO, Route("Ext", A1)], conv(), dbs(), forwarding=False)
    assert (d.kind, d.address) == ("network", A1)


# R-ROUTE-8: a route back to this instance
def test_r_route_8_own_address_rerouted_with_msdb() -> None:
    loop = Route("Loop", OWN, "Svc")
    here = dbs(other=("Svc",))
    kw: dict[str, Any] = {"own_addresses": {OWN}}
    # msdb's LOCAL route delivers locally.
    d = run([AUTO, loop], conv(), here, msdb_routes=[AUTO], **kw)
    assert (d.kind, d.database, d.arrived_from_outside) == ("local", "Other", True)
    assert mentions(d, "R-ROUTE-8:") and mentions(d, "arrived from outside")
    # An msdb network route needs forwarding; without it the conversation waits.
    msdb = [AUTO, Route("Fwd", A1, "Svc")]
    d = run([loop], conv(), dbs(), msdb_routes=msdb, forwarding=True, **kw)
    assert (d.kind, d.route, d.address, d.arrived_from_outside) == ("network", "Fwd", A1, True)
    d = run([loop], conv(), dbs(), msdb_routes=msdb, forwarding=False, **kw)
    assert (d.kind, d.route) == ("delayed", "Fwd")
    # msdb has nothing for it, or leads back here again: delayed, never dropped.
    d = run([loop], conv(), dbs(), msdb_routes=[AUTO], **kw)
    assert d.kind == "delayed"
    d = run([loop], conv(), dbs(), msdb_routes=[Route("Again", OWN)], forwarding=True, **kw)
    assert d.kind == "delayed" and mentions(d, "leads back to this instance again")
    # An address that is not ours is sent as usual.
    d = run([Route("Away", A1, "Svc")], conv(), dbs(), msdb_routes=[AUTO], **kw)
    assert (d.kind, d.address, d.arrived_from_outside) == ("network", A1, False)
    # A message from outside whose msdb route leads back here is dropped (a loop).
    d = run([AUTO, loop], conv(origin=None), dbs(), forwarding=True, **kw)
    assert (d.kind, d.arrived_from_outside) == ("drop", True)


def test_r_route_13_local_origin_never_dropped_without_msdb_routes() -> None:
    d = run([Route("Loop", OWN, "Svc")], conv(), dbs(), own_addresses={OWN})
    assert d.kind == "delayed"


# R-ROUTE-9: TRANSPORT
@pytest.mark.parametrize(
    ("service", "address"),
    [
        ("tcp://127.0.0.9:4022/Svc", "tcp://127.0.0.9:4022"),
        ("TCP://host.example:4023/a/b", "tcp://host.example:4023"),
        ("tcp://[::1]:4022/Svc", "tcp://[::1]:4022"),
        ("OrderParts", None),
        ("tcp://host.example/Svc", None),
        ("http://host.example:4022/Svc", None),
        ("tcp://host.example:port/Svc", None),
    ],
)
def test_r_route_9_transport_address_from_service_name(service: str, address: str | None) -> None:
    assert transport_address(service) == address
    d = run([Route("Transport", TRANSPORT)], conv(service), dbs())
    if address is None:
        assert (d.kind, d.address) == ("delayed", None)
        assert mentions(d, "is not of the form tcp://host:port/...")
        assert run([Route("Transport", TRANSPORT)], conv(service, origin=None)).kind == "drop"
    else:
        assert (d.kind, d.route, d.address) == ("network", "Transport", address)


# R-ROUTE-12: locating the local service
def test_r_route_12_locate_by_broker_instance() -> None:
    both = dbs("Svc", other=("Svc",))
    assert locate_local("Svc", BI_OTHER, both, AW) == both[1]
    d = run([AUTO], conv(broker_instance=BI_OTHER), both)
    assert (d.kind, d.database, d.broker_instance) == ("local", "Other", BI_OTHER)
    assert mentions(d, f"found by broker instance {BI_OTHER}")
    # The route names the broker instance (step 3): that database, not the holding one.
    d = run([AUTO, Route("ToOther", LOCAL, "Svc", BI_OTHER)], conv(), both)
    assert (d.kind, d.route, d.database) == ("local", "ToOther", "Other")


def test_r_route_12_locate_prefers_holding_database() -> None:
    both = dbs("Svc", other=("Svc",))
    assert locate_local("Svc", None, both, "Other") == both[1]
    assert locate_local("Svc", None, both, AW) == both[0]
    only_other = dbs("NotSvc", other=("Svc",))
    assert locate_local("Svc", None, only_other, AW) == only_other[1]
    assert locate_local("Missing", None, both, AW) is None
    assert run([AUTO], conv(origin="Other"), both).database == "Other"
    d = run([AUTO], conv(origin=AW), both)
    assert d.database == AW and mentions(d, "found by service name")


def test_r_route_12_named_broker_instance_not_here() -> None:
    held = dbs("Svc")
    assert locate_local("Svc", BI_NOWHERE, held, AW) is None
    # The database with that broker instance exists but lacks the service: no fallback.
    assert locate_local("Svc", BI_OTHER, held, AW) is None
    d = run([AUTO], conv(broker_instance=BI_NOWHERE), held)
    assert (d.kind, d.database) == ("delayed", None)
    d = run([AUTO], conv(broker_instance=BI_OTHER, origin=None), held)
    assert (d.kind, d.database) == ("drop", None)


# R-ROUTE-13: no local service
@pytest.mark.parametrize("forwarding", [False, True])
def test_r_route_13_delayed_for_local_origin_drop_for_outside(forwarding: bool) -> None:
    d = run([AUTO], conv(), dbs("NotSvc"), forwarding=forwarding)
    assert (d.kind, d.arrived_from_outside) == ("delayed", False)
    assert "DELAYED (R-ROUTE-13)" in d.reason and matched_by(d, 5)
    d = run([AUTO], conv(origin=None), dbs("NotSvc"), forwarding=forwarding)
    assert (d.kind, d.arrived_from_outside) == ("drop", True)
    assert "dropped (R-ROUTE-13)" in d.reason


# Service Broker's seven worked routing examples

HOST2 = "tcp://127.0.0.2:4022"  # host2.Adventure-Works.com
PARTNER1, PARTNER2 = "tcp://127.0.0.3:4022", "tcp://127.0.0.4:4022"
FORWARDER = "tcp://127.0.0.5:4022"  # forwarding.Adventure-Works.com
SERVER1, SERVER2 = "tcp://127.0.0.6:4022", "tcp://127.0.0.7:4022"
ELSEWHERE = "tcp://127.0.0.8:4022"
BALANCED_ONE = Route("BalancedRouteOne", SERVER1, "BalancedService", BI_X)
BALANCED_TWO = Route("BalancedRouteTwo", SERVER2, "BalancedService", BI_Y)

EXAMPLES: dict[int, tuple[list[Route], list[Route]]] = {
    1: ([AUTO], [AUTO]),
    2: ([AUTO, Route("OrderPartsRoute", HOST2, "OrderParts")], [AUTO]),
    3: ([AUTO, Route("OrderPartsRoute", PARTNER1, "OrderParts", None, PARTNER2)], [AUTO]),
    4: ([AUTO, Route("ExternalRoute", FORWARDER)], [AUTO]),
    5: ([AUTO, BALANCED_ONE, BALANCED_TWO], [AUTO]),
    6: ([AUTO], [AUTO, Route("ForwardingRoute", ELSEWHERE, "ElsewhereService")]),
    7: ([AUTO], [AUTO, Route("ForwardingRoute", FORWARDER)]),
}
LOCAL_AUTO = ("local", "AutoCreatedLocal", None, 5)
DELAYED = ("delayed", None, None, 5)
DROP = ("drop", None, None, 5)


def example_case(example: int, service: str, *, outside: bool, here: bool, **kw: Any) -> Decision:
    """Routes begun in AdventureWorks with its table, from outside with msdb's."""
    aw, msdb = EXAMPLES[example]
    databases = dbs(*([service] if here else []), "LocalService")
    c = conv(service, origin=None if outside else AW, broker_instance=kw.pop("instance", None))
    return run(msdb if outside else aw, c, databases, msdb_routes=msdb, **kw)


def check(d: Decision, expected: tuple[str, str | None, str | None, int]) -> None:
    kind, route, address, step = expected
    assert (d.kind, d.route, d.address) == (kind, route, address), d.steps
    assert matched_by(d, step), d.steps
    if kind == "local":
        assert d.database == AW


# Outcomes every example shares: other services from AdventureWorks, everything from outside.
COMMON = [
    ("Other", False, True, LOCAL_AUTO),
    ("Other", False, False, DELAYED),
    ("Other", True, True, LOCAL_AUTO),
    ("Other", True, False, DROP),
]


@pytest.mark.parametrize(("service", "outside", "here", "expected"), COMMON)
@pytest.mark.parametrize("forwarding", [False, True])
def test_worked_example_1_default_routing(
    service: str, outside: bool, here: bool, expected: Any, forwarding: bool
) -> None:
    # R-ROUTE-13 Decision: DELAYED, not "dropped", for a conversation begun in AdventureWorks.
    check(example_case(1, service, outside=outside, here=here, forwarding=forwarding), expected)


ONE_SERVICE = [
    ("OrderParts", False, False, "route"),
    ("OrderParts", False, True, "route"),  # step 2 ends matching before AutoCreatedLocal
    ("OrderParts", True, False, DROP),
    ("OrderParts", True, True, LOCAL_AUTO),
    *COMMON,
]


def check_one_service(example: int, service: str, outside: bool, here: bool, expected: Any) -> None:
    d = example_case(example, service, outside=outside, here=here)
    if expected == "route":
        address = HOST2 if example == 2 else PARTNER1
        check(d, ("network", "OrderPartsRoute", address, 2))
        assert d.mirror_address == (None if example == 2 else PARTNER2)
    else:
        check(d, expected)
        assert d.mirror_address is None


@pytest.mark.parametrize(("service", "outside", "here", "expected"), ONE_SERVICE)
def test_worked_example_2_network_route_to_one_service(
    service: str, outside: bool, here: bool, expected: Any
) -> None:
    check_one_service(2, service, outside, here, expected)


@pytest.mark.parametrize(("service", "outside", "here", "expected"), ONE_SERVICE)
def test_worked_example_3_route_with_mirror(
    service: str, outside: bool, here: bool, expected: Any
) -> None:
    # The principal of the pair is chosen later (R-ROUTE-10): both addresses are handed on.
    check_one_service(3, service, outside, here, expected)


@pytest.mark.parametrize("forwarding", [False, True])
@pytest.mark.parametrize(
    ("outside", "here", "expected"),
    [
        (False, True, LOCAL_AUTO),
        (False, False, ("network", "ExternalRoute", FORWARDER, 5)),
        (True, True, LOCAL_AUTO),
        (True, False, DROP),
    ],
)
def test_worked_example_4_catch_all_behind_local(
    outside: bool, here: bool, expected: Any, forwarding: bool
) -> None:
    for service in ("OrderParts", "Other"):
        check(example_case(4, service, outside=outside, here=here, forwarding=forwarding), expected)


@pytest.mark.parametrize(
    ("service", "outside", "here", "instance", "expected"),
    [
        ("BalancedService", False, False, BI_X, ("network", "BalancedRouteOne", SERVER1, 1)),
        ("BalancedService", False, False, BI_Y, ("network", "BalancedRouteTwo", SERVER2, 1)),
        ("BalancedService", True, False, None, DROP),
        *[(s, o, h, None, e) for s, o, h, e in COMMON],
    ],
)
def test_worked_example_5_load_balancing(
    service: str, outside: bool, here: bool, instance: uuid.UUID | None, expected: Any
) -> None:
    check(example_case(5, service, outside=outside, here=here, instance=instance), expected)


def test_worked_example_5_unbound_conversations_spread_over_both_instances() -> None:
    aw, _ = EXAMPLES[5]
    addresses: Counter[str | None] = Counter()
    for _ in range(200):
        c = conv("BalancedService")
        d = run(aw, c, dbs("LocalService"))
        assert d.kind == "network" and matched_by(d, 3)
        route = BALANCED_ONE if d.route == BALANCED_ONE.name else BALANCED_TWO
        assert (d.address, d.broker_instance) == (route.address, route.broker_instance)
        addresses[d.address] += 1
        # Once bound to the acknowledging broker instance (R-ROUTE-3), the same route (step 1).
        bound = run(aw, conv("BalancedService", broker_instance=d.broker_instance))
        assert bound.route == d.route and matched_by(bound, 1)
    assert set(addresses) == {SERVER1, SERVER2}


@pytest.mark.parametrize(
    ("service", "outside", "here", "forwarding", "expected"),
    [
        # Begun in AdventureWorks: never sent to ElsewhereService's msdb route.
        ("ElsewhereService", False, False, True, DELAYED),
        ("ElsewhereService", False, True, True, LOCAL_AUTO),
        # From outside: forwarded (even if the service is also here) or dropped.
        ("ElsewhereService", True, False, True, ("network", "ForwardingRoute", ELSEWHERE, 2)),
        ("ElsewhereService", True, True, True, ("network", "ForwardingRoute", ELSEWHERE, 2)),
        ("ElsewhereService", True, False, False, ("drop", "ForwardingRoute", ELSEWHERE, 2)),
        ("ElsewhereService", True, True, False, ("drop", "ForwardingRoute", ELSEWHERE, 2)),
        *[(s, o, h, f, e) for s, o, h, e in COMMON for f in (False, True)],
    ],
)
def test_worked_example_6_forwarding_one_service(
    service: str, outside: bool, here: bool, forwarding: bool, expected: Any
) -> None:
    check(example_case(6, service, outside=outside, here=here, forwarding=forwarding), expected)


@pytest.mark.parametrize(
    ("outside", "here", "forwarding", "expected"),
    [
        (False, True, False, LOCAL_AUTO),
        (False, False, False, DELAYED),
        (False, False, True, DELAYED),
        (True, True, False, LOCAL_AUTO),
        (True, True, True, LOCAL_AUTO),
        (True, False, True, ("network", "ForwardingRoute", FORWARDER, 5)),
        (True, False, False, ("drop", "ForwardingRoute", FORWARDER, 5)),
    ],
)
def test_worked_example_7_forwarding_every_missing_service(
    outside: bool, here: bool, forwarding: bool, expected: Any
) -> None:
    for service in ("ElsewhereService", "Other"):
        d = example_case(7, service, outside=outside, here=here, forwarding=forwarding)
        check(d, expected)
        assert d.arrived_from_outside is outside


def test_r_route_8_an_own_address_is_known_in_any_case() -> None:
    """R-ROUTE-8: a route whose address resolves to this very instance is rerouted with
    msdb's routes, whatever capitals its host name is written in."""
    own = own_addresses("localhost", 4022)
    assert normal_tcp_address("tcp://LocalHost:4022") in own
    assert normal_tcp_address("tcp://LOCALHOST:4022") == "tcp://localhost:4022"
