"""The router: where a conversation's messages go, applied to live dialogs (SPEC §2).

Owns the route of each conversation and of each message from outside, forwarding,
route administration at run time, dynamic routing and mirror roles. The decisions
themselves are :mod:`brokerd.routing`'s, pure.

The parts, each an object that owns its state and is handed its collaborators when it
is made (the engine as a narrow protocol each part declares, the other parts as
protocols too, the shared state as itself):

* ``state``: :class:`~.state.RouterState`, the state several parts share: the statistics,
  the local databases, the decisions shared between conversations and forgetting them,
  routing a database's conversations again (R-ROUTE-13);
* ``requests``: :class:`~.requests.RouteRequests`, dynamic routing (R-ROUTE-14): the
  MissingRoute requests in flight;
* ``mirror_roles``: :class:`~.mirror_roles.MirrorRoles`, mirroring (R-ROUTE-10,
  R-ROUTE-15, R-ROUTE-16): mirrored pairs and their principals, principal queries and
  answers, the role and epoch of each local database, failover;
* ``decisions``: :class:`~.decisions.RouteDecisions`, the route of each conversation that
  begins or is answered here (R-ROUTE-1 .. R-ROUTE-5), why its messages wait, ``explain``;
* ``inbound``: :class:`~.inbound.Inbound`, messages from outside (R-ROUTE-1, R-ROUTE-2) and
  forwarding (R-ROUTE-6, R-ROUTE-7): the hop count, the forwarding budget;
* ``admin``: :class:`~.admin.RouteAdmin`, route administration at run time (R-ROUTE-13);
* ``router``: :class:`~.router.Router` makes the parts and joins them into the one object
  the engine and the server call; :class:`~.router.DialogServices` is what the router
  needs of the engine.

Layers, top to bottom (``pyproject.toml`` checks them): ``router``; then ``admin``,
``inbound``, ``decisions``, ``requests`` and ``mirror_roles``, which never import one
another; then ``state``.

May import: ``brokerd.dialogs.transmission``, ``brokerd.dialogs.endpoints`` and what
they may import. It reaches the engine's verbs only through the protocols it declares.
"""
