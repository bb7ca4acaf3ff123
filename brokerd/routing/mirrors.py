"""Which partner of a mirrored route is principal (SPEC R-ROUTE-10).

The routing documentation calls the partner's address the "mirror address".

Pure bookkeeping, no I/O: the engine asks both addresses of a route with a
mirror address which one is principal (PRINCIPAL_QUERY frames), feeds the
answers and connection failures in here, and sends the route's messages to
:attr:`MirrorPair.principal` only. The rules:

* the first time the route is used, nothing is known: ask both;
* an address that answers PRINCIPAL becomes the principal;
* if the principal cannot be reached, or says it is no longer principal, and
  the partner says it is now the principal, send to the partner;
* if the principal is unreachable and the partner does not claim to be
  principal, send to neither and keep asking both until one answers as principal.

The database-side role (a database declared ``principal`` or ``mirror``,
swapped by ``brokerctl mirror-role``) lives in the engine; this module only
tracks what the senders have been told.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Literal

Role = Literal["principal", "mirror", "unknown", "unreachable"]


@dataclass(frozen=True)
class MirrorKey:
    """One mirrored target: the two addresses and what is asked about."""

    address: str
    mirror_address: str
    broker_instance: uuid.UUID | None
    service: str


@dataclass
class MirrorPair:
    key: MirrorKey
    roles: dict[str, Role] = field(default_factory=dict)
    """The last thing each address said (or ``unreachable``)."""
    principal: str | None = None
    asked_at: float | None = None
    """When both were last asked; None = never."""
    last_used: float = 0.0
    """When a message last needed the principal (only pairs in use are asked again)."""

    @property
    def addresses(self) -> tuple[str, str]:
        return self.key.address, self.key.mirror_address

    def partner_of(self, address: str) -> str:
        a, b = self.addresses
        return b if address == a else a

    def answer(self, address: str, role: Role) -> bool:
        """Record an answer; True if the principal changed."""
        if address not in self.addresses:
            return False
        self.roles[address] = role
        before = self.principal
        if role == "principal":
            self.principal = address
        elif address == self.principal:
            partner = self.partner_of(address)
            self.principal = partner if self.roles.get(partner) == "principal" else None
        return self.principal != before

    def unreachable(self, address: str) -> bool:
        """The address could not be reached; True if the principal changed."""
        return self.answer(address, "unreachable")

    def needs_asking(self, now: float, interval: float) -> bool:
        """Whether both should be asked (again) now."""
        if self.principal is not None:
            return False
        return self.asked_at is None or now - self.asked_at >= interval

    def status(self) -> str:
        """The readable state, as the transmission queue shows it."""
        said = ", ".join(f"{a} says {self.roles.get(a, 'nothing yet')}" for a in self.addresses)
        if self.principal is not None:
            return f"principal is {self.principal} ({said})"
        return f"waiting for a principal among {' and '.join(self.addresses)} ({said}) (R-ROUTE-10)"


@dataclass
class MirrorTracker:
    """Every mirrored target this instance sends to."""

    pairs: dict[MirrorKey, MirrorPair] = field(default_factory=dict)

    def pair(self, key: MirrorKey) -> MirrorPair:
        found = self.pairs.get(key)
        if found is None:
            found = self.pairs[key] = MirrorPair(key)
        return found

    def matching(
        self, address: str, broker_instance: uuid.UUID | None, service: str
    ) -> list[MirrorPair]:
        """Pairs an answer from ``address`` about (broker instance, service) applies to."""
        return [
            p
            for p in self.pairs.values()
            if address in p.addresses
            and (
                p.key.broker_instance == broker_instance
                if p.key.broker_instance is not None
                else p.key.service == service
            )
        ]

    def with_address(self, address: str) -> list[MirrorPair]:
        return [p for p in self.pairs.values() if address in p.addresses]
