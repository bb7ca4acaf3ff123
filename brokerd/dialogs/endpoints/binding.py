"""Dialog binding: which broker may speak for a conversation's far side (SPEC R-DLG-14).

A conversation endpoint is *bound* to the far side that first answered it:

* its far broker instance (R-ROUTE-3), learned from the first acknowledgement
  or message of the other side (or named at BEGIN DIALOG);
* its far **peer**: who delivered that first frame, as the adjacent-broker
  handshake authenticated it. A frame that arrived with hop count 0 came
  straight from the far broker, so the peer is that broker's certificate name
  (``peer:NAME``). A frame with a hop count above 0 was relayed by a forwarder
  (R-ROUTE-7), whose certificate says nothing about the far end: the binding is
  then ``forwarded``. Delivery inside the instance is ``local``.

Every later message, acknowledgement (piggybacked or dedicated) and broker error
for the endpoint must match the binding: the same far broker instance always, and
for a ``peer:NAME`` binding a hop count of 0 from that very peer. Anything else is
refused: dropped, counted, traced, never acknowledged or applied.

What the adjacent check cannot do, and does not try to:

* a ``forwarded`` binding accepts any authenticated broker: a forwarder's
  certificate says nothing about the far end, and a broker that claims to relay
  (hop count above 0) cannot be told from one that does. A forwarder on the path
  (or a broker pretending to be one) can read, alter, drop and forge what it
  relays for such a dialog;
* a ``peer:NAME`` binding refuses the far side's frames once they come through a
  forwarder (a route changed, or the two directions take different paths): such
  a dialog must be secured;
* a far side reached over a mirrored route (R-ROUTE-10) answers from whichever
  partner is principal, and after a failover from the other one: for such an
  endpoint only the far broker instance is checked, as for a ``forwarded`` one. A
  target endpoint, which has no route of its own until it sends, is bound
  ``mirrored`` when its database has a mirrored route to the far service (the route
  its answers would take): a mirrored database that began the dialog may fail over
  before the target has answered anything.

Dialog security (``dialog_security``, :mod:`protocol.dialog_security`) closes
both: a secured dialog authenticates every frame end to end with its dialog key,
so for it only the far broker instance is checked here, and any path is allowed.

Pure: no I/O; the engine passes the link's authenticated identity.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from brokerd.storage.catalog import Route
from protocol.dialog import DialogHeader

if TYPE_CHECKING:
    from brokerd.dialogs.endpoints.endpoint import Endpoint

LOCAL = "local"
"""The identity of delivery inside this instance (``LocalLink``)."""
FORWARDED = "forwarded"
"""The binding of an endpoint whose far broker reaches it through forwarders."""
MIRRORED = "mirrored"
"""The binding of an endpoint whose far side is a mirrored pair (R-ROUTE-10)."""
PEER_PREFIX = "peer:"
"""Prefix of an adjacent broker's identity: ``peer:`` + its certificate's common name."""


def peer_identity(certificate_name: str | None) -> str:
    """The identity of a broker connection whose handshake authenticated ``certificate_name``."""
    return PEER_PREFIX + (certificate_name or "?")


def arrival_binding(header: DialogHeader, identity: str) -> str:
    """What an endpoint is bound to when ``header`` arrives first from ``identity``."""
    return identity if header.hop_count == 0 else FORWARDED


def refusal(ep: Endpoint, header: DialogHeader, identity: str) -> str | None:
    """Why ``header``, arriving from ``identity``, may not speak for ``ep``'s far side."""
    far = ep.far_broker_instance
    if far is not None and header.from_broker_instance != far:
        return (
            f"from broker instance {header.from_broker_instance}, but the conversation is "
            f"bound to broker instance {far} (R-DLG-14)"
        )
    bound = ep.far_peer
    if not bound or bound in (FORWARDED, MIRRORED) or ep.keys is not None:
        return None
    route = ep.route
    if route is not None and route.mirror_address is not None:
        return None  # either partner of a mirrored pair speaks for its instance (R-ROUTE-10)
    if header.hop_count != 0:
        return (
            f"relayed (hop count {header.hop_count}) by {identity}, but the conversation is "
            f"bound to the adjacent broker {bound} (R-DLG-14)"
        )
    if identity != bound:
        return f"sent by {identity}, but the conversation is bound to {bound} (R-DLG-14)"
    return None


def far_side_mirrored(ep: Endpoint, routes: Iterable[Route]) -> bool:
    """Whether the database's routes reach ``ep``'s far service over a mirrored route
    (R-ROUTE-10) that may name its far broker instance."""
    far = ep.far_broker_instance
    return any(
        route.mirror_address
        and route.remote_service_name == ep.far_service
        and (route.broker_instance is None or far is None or route.broker_instance == far)
        for route in routes
    )


def bind(ep: Endpoint, header: DialogHeader, identity: str, routes: Iterable[Route] = ()) -> bool:
    """Bind an unbound endpoint to the far side ``header`` came from (``routes``: its
    database's, to see a mirrored far side); True if it changed."""
    if ep.far_peer:
        return False
    if header.hop_count == 0 and far_side_mirrored(ep, routes):
        ep.far_peer = MIRRORED
    else:
        ep.far_peer = arrival_binding(header, identity)
    return True
