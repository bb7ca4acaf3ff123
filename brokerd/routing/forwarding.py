"""Message forwarding: relaying conversations that neither start nor end here (R-ROUTE-6..8).

A forwarder does not store, sequence or acknowledge what it relays: the two
ends of the dialog do that (R-DLG-5), and a forwarded message that is lost is
retransmitted by its sender. What this module owns:

* :class:`Forward`: one fragment (or one batch of dedicated acknowledgements)
  on its way to the next broker, with the hop count already incremented;
* :class:`ForwardBudget`: the bytes of forwarded messages held in memory, at
  most ``message_forward_size`` MB (R-ROUTE-7). Over the budget a message is
  dropped, not acknowledged, and its sender retries later; over half of it the
  transport stops reading the connections that bring more (``high``, ``low``), so a
  next hop slower than the sender makes the sender wait rather than resend;
* :func:`hop_refusal`: the routing-loop guard. Every forwarder increments the
  hop count; a message that has been forwarded ``max_hop_count`` times already
  is dropped with a readable reason (and counted), so a loop between two
  forwarders ends after a bounded number of hops and never spins.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.dialog import DialogHeader, encode_fragment, relay_fragment

HEADER_ALLOWANCE = 256
"""Bytes counted for each relayed dedicated acknowledgement (a header without a body);
a relayed fragment counts its encoded bytes."""


@dataclass(slots=True, eq=False)
class Forward:
    """A fragment (``payload``, encoded) or dedicated acknowledgements (``acks``) to relay."""

    payload: bytes | None
    acks: list[DialogHeader] | None
    size: int


CONNECT_GRACE = 1.0
"""Seconds what waits for a next hop's connection to open holds the readers back (a
connection opens in milliseconds); past it the hop is taken for one that does not
answer, and what waits for it may take at most a quarter of the budget."""


class ForwardBudget:
    """Bytes of forwarded messages in memory, bounded by ``message_forward_size`` (R-ROUTE-7).

    Over half the budget the transport stops reading the connections that bring messages
    to forward, down to a quarter (:meth:`high`, :meth:`low`). What has waited longer
    than :data:`CONNECT_GRACE` for a next hop whose connection does not open is left out
    of that count (``stale``, the links' own account): reading slower opens no
    connection, and a next hop that accepts TCP and never answers would otherwise stop
    the forwarder's traffic to every other hop until its attempt timed out."""

    def __init__(self, megabytes: int) -> None:
        self.limit = megabytes * 1024 * 1024
        self.held = 0
        self.peak = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        self.peak = max(self.peak, self.held)
        return True

    def release(self, size: int) -> None:
        self.held = max(0, self.held - size)

    def high(self, stale: int = 0) -> bool:
        """Over half the budget held, less ``stale``: a sender faster than the next hop
        waits instead of having its messages dropped and resent later."""
        return (self.held - stale) * 2 > self.limit

    def low(self, stale: int = 0) -> bool:
        """Down to a quarter of the budget, less ``stale``: held connections are read again."""
        return (self.held - stale) * 4 <= self.limit


def hop_refusal(header: DialogHeader, max_hop_count: int) -> str | None:
    """Why a message may not be forwarded once more (R-ROUTE-7 loop protection), or None."""
    if header.hop_count >= max_hop_count:
        return (
            f"hop count {header.hop_count} reached max_hop_count {max_hop_count}: "
            "a routing loop? dropped, not forwarded (R-ROUTE-7)"
        )
    return None


def fragment_item(header: DialogHeader, body: bytes, payload: bytes | None = None) -> Forward:
    """The relayed fragment, one hop further: ``payload`` as it arrived with the hop count
    changed (:func:`~protocol.dialog.relay_fragment`), or, without it, encoded again."""
    hop_count = header.hop_count + 1
    encoded = (
        encode_fragment(header._replace(hop_count=hop_count), body)
        if payload is None
        else relay_fragment(payload, hop_count)
    )
    return Forward(encoded, None, len(encoded))


def acks_item(headers: list[DialogHeader]) -> Forward:
    """Relayed dedicated acknowledgements, one hop further."""
    bumped = [h._replace(hop_count=h.hop_count + 1) for h in headers]
    return Forward(None, bumped, HEADER_ALLOWANCE * len(bumped))
