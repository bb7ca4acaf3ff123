"""Routing at run time: the engine's side of SPEC §2 (R-ROUTE-1 .. R-ROUTE-14).

:mod:`brokerd.routing.rules` decides; the router applies the decisions to live
conversations and holds the state routing needs between messages:

* the route of each conversation that begins here or is answered from here,
  cached on the endpoint until a route changes or expires (R-OBJ-5), and
  re-decided once the conversation is bound to the broker instance of the
  first acknowledgement (R-ROUTE-3);
* the route of each message arriving from outside, with msdb's routes
  (R-ROUTE-1), replies delivered by broker instance first (R-ROUTE-2),
  cached per conversation;
* forwarding (R-ROUTE-6, R-ROUTE-7): relayed fragments and acknowledgements,
  the hop count, the ``message_forward_size`` budget;
* route administration at run time (create, alter, drop; persisted in the
  database file) and the re-routing of DELAYED conversations when routes
  change (R-ROUTE-13);
* dynamic routing (R-ROUTE-14): at most one MissingRoute request per service
  name in flight, sent on a dialog from the system service
  ``brokerd/RouteRequester``; when the routing service ends that dialog the
  waiting conversations are routed again;
* mirroring (R-ROUTE-10): principal queries to both partners of a mirrored
  route, answers to other brokers' queries, the role of each local database;
  fencing by epoch (R-ROUTE-15): each role change carries an epoch, persisted;
  a partner that is not principal sends nothing for the mirrored database, and
  one that hears of a higher epoch while principal demotes itself;
* ``explain``: the step-by-step reasoning for a service, as ``brokerctl explain``
  prints it.

The parts, each in its own module of ``brokerd.dialogs``: ``router_core`` (the state,
the statistics, what the router is given), ``route_decisions`` (the route of each
conversation, ``explain``), ``inbound`` (messages from outside, forwarding),
``route_admin`` (route administration), ``route_requests`` (dynamic routing) and
``mirror_roles`` (mirroring). Each part is a subclass of the parts whose methods it
calls; :class:`Router` joins them.

May import: the parts above.
"""

from __future__ import annotations

from brokerd.dialogs.router.admin import RouteAdmin
from brokerd.dialogs.router.inbound import Inbound


class Router(Inbound, RouteAdmin):
    """The router of one dialog engine: every part joined (see the module docstring)."""
