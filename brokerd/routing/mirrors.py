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

Fencing by epoch (R-ROUTE-15): every answer carries the partner's mirroring
epoch. An answer older than one already heard from the same address is stale and
ignored; of the partners that claim the role, only one at the highest epoch seen
for the pair is principal, so a demoted partner that still believes it is
principal (split brain) is never sent to. Queries carry that highest epoch, so
the stale partner learns it has been superseded.

The database-side role (a database declared ``principal`` or ``mirror``,
swapped by ``brokerctl mirror-role``) lives in the engine; this module only
tracks what the senders have been told.

The pairs are bounded (:class:`MirrorTracker`): a forwarder's mirrored route to every
service makes one pair per service and broker instance that its peers' messages name,
so past a limit the pair used longest ago is forgotten (it asks both partners again
when it is used again).
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
    epochs: dict[str, int] = field(default_factory=dict)
    """The epoch of each address's last answer (R-ROUTE-15)."""
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

    @property
    def epoch(self) -> int:
        """The highest epoch either partner has answered with (R-ROUTE-15)."""
        return max(self.epochs.values(), default=0)

    def answer(self, address: str, role: Role, epoch: int = 0) -> bool:
        """Record an answer; True if the principal changed.

        An answer at an epoch below the last one heard from ``address`` is stale
        (it was overtaken on the way) and is ignored.
        """
        if address not in self.addresses:
            return False
        if epoch < self.epochs.get(address, 0):
            return False
        self.roles[address] = role
        self.epochs[address] = epoch
        return self._choose()

    def unreachable(self, address: str) -> bool:
        """The address could not be reached; True if the principal changed."""
        if address not in self.addresses:
            return False
        self.roles[address] = "unreachable"
        return self._choose()

    def _choose(self) -> bool:
        """The principal: a partner that claims the role at the highest epoch seen."""
        before = self.principal
        top = self.epoch
        claims = [
            a
            for a in self.addresses
            if self.roles.get(a) == "principal" and self.epochs.get(a, 0) == top
        ]
        if before in claims:
            self.principal = before
        else:
            self.principal = claims[0] if claims else None
        return self.principal != before

    def needs_asking(self, now: float, interval: float, recheck: float) -> bool:
        """Whether both should be asked (again) now: every ``interval`` while no partner is
        principal, every ``recheck`` while one is, so that a promotion the principal was not
        told of (R-ROUTE-15) is learned and the principal is fenced."""
        if self.asked_at is None:
            return True
        return now - self.asked_at >= (interval if self.principal is None else recheck)

    def status(self) -> str:
        """The readable state, as the transmission queue shows it."""
        said = ", ".join(
            f"{a} says {self.roles.get(a, 'nothing yet')}"
            + (f" at epoch {self.epochs[a]}" if a in self.epochs else "")
            for a in self.addresses
        )
        if self.principal is not None:
            return f"principal is {self.principal} at epoch {self.epoch} ({said})"
        return f"waiting for a principal among {' and '.join(self.addresses)} ({said}) (R-ROUTE-10)"


@dataclass
class MirrorTracker:
    """The mirrored targets this instance sends to: at most ``limit``, the pair used
    longest ago forgotten first (``evicted`` counts them)."""

    limit: int
    pairs: dict[MirrorKey, MirrorPair] = field(default_factory=dict)
    """In the order of their last use, the oldest first."""
    evicted: int = 0
    """Pairs forgotten to stay within ``limit``."""

    def pair(self, key: MirrorKey) -> MirrorPair:
        """The pair of ``key`` (tracked from now on if it was not), now the last used."""
        pairs = self.pairs
        found = pairs.pop(key, None)
        if found is None:
            found = MirrorPair(key)
            while len(pairs) >= max(1, self.limit):
                del pairs[next(iter(pairs))]
                self.evicted += 1
        pairs[key] = found
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
