"""Where an endpoint's fragments go, as the dialog engine sees it.

A *link* is a network connection to a peer broker (``brokerd.server.transport``)
or the engine's in-process link for services of this same instance. The engine
and the router only ever talk to a :class:`Link`; the server provides them
through a :class:`LinkProvider`, so nothing in ``brokerd.dialogs`` touches a socket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

from protocol.dialog import DialogHeader

if TYPE_CHECKING:
    from brokerd.dialogs.endpoints.endpoint import Endpoint, OutMessage
    from brokerd.routing.forwarding import Forward
    from protocol.events import PrincipalAnswer, PrincipalQuery


class SendFragment(NamedTuple):
    """Fragment number ``fragment`` of an unacknowledged message; built when it is sent."""

    ep: Endpoint
    msg: OutMessage
    fragment: int


class SendAcks(NamedTuple):
    """Dedicated acknowledgements of several conversations."""

    headers: list[DialogHeader]


class SendHeader(NamedTuple):
    """A ready-made dialog message (a broker error answering a refused message)."""

    header: DialogHeader
    body: bytes


class Link(Protocol):
    """Where an endpoint's fragments and acknowledgements go."""

    @property
    def name(self) -> str: ...

    @property
    def identity(self) -> str:
        """Who sends what arrives on this link, as authenticated
        (``brokerd.dialogs.endpoints.binding``)."""
        ...

    @property
    def is_open(self) -> bool: ...

    @property
    def status(self) -> str: ...

    def queue_fragment(self, ep: Endpoint, msg: OutMessage, index: int) -> bool:
        """Queue fragment ``index`` of ``msg`` to be written; False if that fragment
        already waits to be written on this link (a retransmission due meanwhile): it is
        not queued twice."""
        ...

    def queue_acks(self, headers: list[DialogHeader]) -> None: ...

    def queue_header(self, header: DialogHeader, body: bytes) -> None: ...

    def want(self, ep: Endpoint) -> None: ...

    def forward(self, item: Forward) -> None: ...

    def may_hold(self, size: int, limit: int) -> bool:
        """Whether a forwarded item of ``size`` bytes may wait for this link, of a
        forwarding budget of ``limit`` bytes (R-ROUTE-7)."""
        ...

    def send_control(self, event: PrincipalQuery | PrincipalAnswer) -> None: ...

    def redial(self, reason: str) -> None:
        """Close the open connection, if any, and dial again (R-PROTO-5)."""


class LinkProvider(Protocol):
    """The link to a peer address, opened on demand (the server's transport)."""

    def link_for(self, address: str) -> Link: ...
