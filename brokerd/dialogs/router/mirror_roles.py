"""Mirroring (R-ROUTE-10, R-ROUTE-15, R-ROUTE-16): the router's side of mirrored
databases and routes.

Owns :class:`MirrorRoles` and its state: the mirrored pairs of the routes in use (whose
principal messages go to), the numbering of principal queries, and the mirroring service
it tells of role changes (``mirroring``, a :class:`MirrorHooks`; ``brokerd.server``'s
``Mirroring`` satisfies it). Principal queries to both partners of a mirrored route,
answers to other brokers' queries, the role of each local database and failover
(:meth:`MirrorRoles.set_mirror_role`). Fencing by epoch (R-ROUTE-15): each role change
carries an epoch, persisted; a partner that is not principal sends nothing for the
mirrored database, and one that hears of a higher epoch while principal demotes itself
(:meth:`MirrorRoles.superseded`).

It is handed the engine as :class:`MirrorServices`, the router's shared state (the
statistics, the local databases, forgetting decisions) and the configured limits: the
mirrored pairs it tracks are at most ``limits.mirror_pairs``, the pair used longest ago
forgotten first (counted in ``mirror_pairs_evicted``, logged at most once a minute).

May import: ``protocol``, ``brokerd.routing``, ``brokerd.storage``, ``brokerd.errors``, the
router's ``state``, and for types only the models of ``brokerd.dialogs`` and
``brokerd.config``.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import uuid
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from brokerd.errors import DialogError, InvalidRequest
from brokerd.routing import rules as routing
from brokerd.routing.mirrors import MirrorKey, MirrorPair, MirrorTracker, Role
from brokerd.storage import queries
from protocol import events
from protocol.dialog import NIL_UUID, DialogHeader
from protocol.frames import MirrorRole

if TYPE_CHECKING:
    from brokerd.config import LimitsConfig, RetryConfig
    from brokerd.dialogs.endpoints.database import Database
    from brokerd.dialogs.endpoints.endpoint import Endpoint
    from brokerd.dialogs.router.state import RouterState
    from brokerd.dialogs.transmission.links import Link, LinkProvider
    from brokerd.storage.schema import Statement

log = logging.getLogger("brokerd.dialogs.router")  # one log for every part of the router

_ROLE_NAMES: dict[MirrorRole, Role] = {
    MirrorRole.PRINCIPAL: "principal",
    MirrorRole.MIRROR: "mirror",
    MirrorRole.UNKNOWN: "unknown",
}


class MirrorHooks(Protocol):
    """What a role change tells the mirroring service (R-ROUTE-16; the server's
    ``Mirroring`` satisfies it): a promotion waits until every unit already shipped
    to this partner is applied and stops taking more; a demotion drops the mirror
    attached to this partner and what waited for it."""

    async def promoting(self, db: Database) -> None: ...

    def demoting(self, db: Database) -> None: ...

    def resolved(self, db: Database, reason: str) -> None: ...

    def partner_answered(self, address: str, answer: events.PrincipalAnswer) -> None: ...

    def unreachable(self, address: str) -> None: ...


class MirrorServices(Protocol):
    """What mirroring needs of the dialog engine."""

    databases: dict[str, Database]
    by_instance: dict[uuid.UUID, Database]
    links: LinkProvider
    retry: RetryConfig

    def database(self, name: str) -> Database: ...

    def transmit(self, ep: Endpoint) -> None: ...

    async def submit_wait(self, db: Database, statements: list[Statement]) -> None: ...

    async def rebuild(self, db: Database) -> list[Statement]:
        """The image rebuilt from the file; returns the writes to submit once principal."""
        ...

    async def inherited(self, db: Database) -> None: ...

    def watch_deadlines(self, db: Database) -> None:
        """The timers and lifetimes of a rebuilt image, watched (once it is principal)."""
        ...

    def forget_image(self, db: Database) -> None: ...

    def resume(self, db: Database) -> None: ...


def mirror_key(decision: routing.Decision, service: str) -> MirrorKey:
    """The mirrored pair a network decision with a mirror address sends to (R-ROUTE-10)."""
    assert decision.address is not None and decision.mirror_address is not None
    return MirrorKey(decision.address, decision.mirror_address, decision.broker_instance, service)


class MirrorRoles:
    """The mirroring roles and mirrored routes of this instance (see the module docstring)."""

    def __init__(self, engine: MirrorServices, state: RouterState, limits: LimitsConfig) -> None:
        self.engine = engine
        self.state = state
        self.mirrors = MirrorTracker(limits.mirror_pairs)
        """The mirrored pairs of the routes in use, and what each partner last said."""
        self._evictions_logged_at = -math.inf
        self._query_ids = itertools.count(1)
        self.mirroring: MirrorHooks | None = None
        """Set by the daemon when a database is mirrored with a partner (R-ROUTE-16)."""

    # -- mirrored routes (R-ROUTE-10) ---------------------------------------------------------

    def principal(self, decision: routing.Decision, service: str) -> str | None:
        """The principal of the mirrored pair ``decision`` sends to, or None if none is
        known yet; both partners are asked when it is time to (R-ROUTE-10, R-ROUTE-15)."""
        pair = self.pair(decision, service)
        now = time.monotonic()
        pair.last_used = now
        if pair.needs_asking(now, self._ask_interval(), self._recheck_interval()):
            self._ask(pair)
        return pair.principal

    def pair(self, decision: routing.Decision, service: str) -> MirrorPair:
        """The mirrored pair ``decision`` sends to (tracked from now on if it was not)."""
        mirrors = self.mirrors
        before = mirrors.evicted
        pair = mirrors.pair(mirror_key(decision, service))
        if mirrors.evicted != before:
            self._evicted(mirrors.evicted - before)
        return pair

    def _evicted(self, count: int) -> None:
        """``count`` pairs were forgotten to stay within ``limits.mirror_pairs``: counted,
        and logged at most once a minute (a peer naming new services forgets one a
        message)."""
        self.state.stats.mirror_pairs_evicted += count
        now = time.monotonic()
        if now - self._evictions_logged_at < 60.0:
            return
        self._evictions_logged_at = now
        log.warning(
            "mirrored pairs: %d tracked at most (limits.mirror_pairs); the pair used longest "
            "ago is forgotten (%d so far) and asks both partners again when it is used again "
            "(R-ROUTE-10)",
            self.mirrors.limit,
            self.state.stats.mirror_pairs_evicted,
        )

    def known_pair(self, decision: routing.Decision, service: str) -> MirrorPair | None:
        """The mirrored pair ``decision`` sends to, if it is tracked already."""
        return self.mirrors.pairs.get(mirror_key(decision, service))

    def _ask_interval(self) -> float:
        return max(0.05, self.engine.retry.initial)

    def _recheck_interval(self) -> float:
        """How often both partners are asked again while one is principal (R-ROUTE-15)."""
        return max(0.5, self.engine.retry.maximum)

    def _ask(self, pair: MirrorPair) -> None:
        pair.asked_at = time.monotonic()
        key = pair.key
        for address in pair.addresses:
            self.state.stats.principal_queries_sent += 1
            self.engine.links.link_for(address).send_control(
                events.PrincipalQuery(
                    next(self._query_ids), key.broker_instance or NIL_UUID, key.service, pair.epoch
                )
            )

    def tick(self) -> None:
        """Keep asking both partners of a mirrored route in use: often while it has no
        principal, every ``retry.maximum`` seconds while it has one (R-ROUTE-15)."""
        now = time.monotonic()
        interval, recheck = self._ask_interval(), self._recheck_interval()
        for pair in self.mirrors.pairs.values():
            if now - pair.last_used < 600 and pair.needs_asking(now, interval, recheck):
                self._ask(pair)

    def _queried_database(self, broker_instance: uuid.UUID, service: str) -> Database | None:
        if broker_instance != NIL_UUID:
            return self.engine.by_instance.get(broker_instance)
        found = routing.locate_local(service, None, self.state.local_dbs, None)
        return self.engine.databases[found.name] if found else None

    def role_of(self, broker_instance: uuid.UUID, service: str) -> tuple[MirrorRole, int]:
        """What this instance answers to a principal query: its role and epoch."""
        db = self._queried_database(broker_instance, service)
        if db is None:
            return MirrorRole.UNKNOWN, 0
        role = MirrorRole.MIRROR if db.mirror_role == "mirror" else MirrorRole.PRINCIPAL
        return role, db.mirror_epoch

    def on_principal_query(self, link: Link, query: events.PrincipalQuery) -> None:
        self.state.stats.principal_queries_answered += 1
        db = self._queried_database(query.broker_instance, query.service)
        if db is not None and db.mirror_role is not None and query.epoch > db.mirror_epoch:
            self.superseded(db, query.epoch)
        role, epoch = self.role_of(query.broker_instance, query.service)
        link.send_control(
            events.PrincipalAnswer(
                query.query_id, role, query.broker_instance, query.service, epoch
            )
        )

    def superseded(self, db: Database, epoch: int) -> None:
        """R-ROUTE-15: a sender has seen the pair at a higher epoch than this partner's. If
        this partner is principal, its partner was promoted behind its back: it demotes
        itself (fencing); either way it adopts the epoch, so that its own next promotion is
        numbered above it. Committed in the background: if the daemon stops first, the
        next query carrying the epoch demotes it again. Heard of in a principal query, and
        by the mirroring service in a partner's answer or attachment."""
        if db.mirror_role == "principal":
            log.warning(
                "database %s: a partner is principal at epoch %d, above this partner's %d; "
                "this partner is now the mirror (fenced)",
                db.name,
                epoch,
                db.mirror_epoch,
            )
            db.mirror_role = "mirror"
            self.state.forget_decisions()
            if self.mirroring is not None:
                self.mirroring.demoting(db)
            self.engine.forget_image(db)
        db.mirror_epoch = epoch
        self._persist_role(db)

    def _persist_role(self, db: Database) -> None:
        """Store the role and epoch held in memory now. Submitted at once, not from a task
        started later: the store commits in submission order, so a role stored after this
        (a promotion's) is not overwritten by this older one."""
        assert db.mirror_role is not None
        role, epoch = db.mirror_role, db.mirror_epoch

        def failed(exc: BaseException) -> None:
            log.warning(
                "database %s: could not store its role (%s at epoch %d): %s",
                db.name,
                role,
                epoch,
                exc,
            )

        db.store.submit(
            [queries.meta("mirror_role", role), queries.meta("mirror_epoch", str(epoch))],
            on_failure=failed,
        )

    def on_principal_answer(self, address: str, answer: events.PrincipalAnswer) -> None:
        if self.mirroring is not None:
            self.mirroring.partner_answered(address, answer)
        instance = None if answer.broker_instance == NIL_UUID else answer.broker_instance
        changed = False
        for pair in self.mirrors.matching(address, instance, answer.service):
            before = pair.principal
            if pair.answer(address, _ROLE_NAMES[answer.role], answer.epoch):
                changed = True
                log.info(
                    "mirrored route %s/%s: principal %s -> %s",
                    pair.key.address,
                    pair.key.mirror_address,
                    before,
                    pair.principal,
                )
        if changed:
            self._resend_mirrored()

    def link_unreachable(self, address: str) -> None:
        if self.mirroring is not None:
            self.mirroring.unreachable(address)
        changed = False
        for pair in self.mirrors.with_address(address):
            changed |= pair.unreachable(address)
        if changed:
            self._resend_mirrored()

    def tell_mirror(self, link: Link, db: Database, header: DialogHeader) -> None:
        """A message reached the mirror partner: tell the sender it is not principal."""
        link.send_control(
            events.PrincipalAnswer(
                0, MirrorRole.MIRROR, db.broker_instance, header.to_service, db.mirror_epoch
            )
        )

    def _resend_mirrored(self) -> None:
        for db in self.engine.databases.values():
            for ep in db.endpoints.values():
                if ep.has_unacknowledged and ep.route is not None and ep.route.mirror_address:
                    ep.route_link = None
                    for msg in ep.outbox.values():
                        msg.due = 0.0
                    self.engine.transmit(ep)

    async def set_mirror_role(self, database: str, role: str) -> None:
        """Failover: this partner becomes ``principal`` or ``mirror`` (persisted).

        R-ROUTE-15: a promotion opens a new epoch, one above the highest this partner
        knows of (its own, any it heard in principal queries and answers, among them its
        principal's answer as it attached as mirror, and the epoch of the last unit its
        file holds); a demotion keeps the epoch. Both are stored before the role is used.
        A promotion rebuilds the image from the file, mirroring configured or not."""
        db = self.engine.database(database)
        if db.mirror_role is None:
            raise DialogError(
                f"database {db.name!r} is not mirrored (set mirror_role in the configuration)"
            )
        if role not in ("principal", "mirror"):
            raise InvalidRequest(f"mirror role must be principal or mirror, not {role!r}")
        promotion = role == "principal" and db.mirror_role != "principal"
        if role == "principal" and not promotion:
            # Already principal: role and epoch are unchanged, stored in the background. A
            # restarted principal in doubt holds its commits (R-ROUTE-16), and a write
            # waited for here would be held behind them: the doubt this call ends.
            self._persist_role(db)
            log.info(
                "database %s stays the principal partner at epoch %d", db.name, db.mirror_epoch
            )
            if db.mirror_in_doubt and self.mirroring is not None:
                # the administrator vouches for this partner (a forced service); resumes it
                self.mirroring.resolved(db, "the administrator confirmed it as principal")
            else:
                self.engine.resume(db)
            return
        if self.mirroring is not None:
            if promotion:
                await self.mirroring.promoting(db)
            elif role == "mirror" and db.mirror_role == "principal":
                db.mirror_role = role  # fenced at once: nothing more is committed as principal
                self.mirroring.demoting(db)
                self.engine.forget_image(db)
        epoch = db.mirror_epoch
        if promotion:
            # R-ROUTE-15: above every epoch this partner knows of, also the one its
            # principal wrote the units it holds at (a demoted partner keeps its own,
            # older epoch; promoted again, it opened the epoch its partner already had).
            replica = db.store.replica
            if replica is not None:
                epoch = max(epoch, replica.lsn_epoch)
            epoch += 1
            # Adopted at once: while the promotion is stored and the image rebuilt, a
            # principal query carrying an epoch at or below it supersedes nothing (it
            # would store this partner as the mirror after the promotion's own row).
            db.mirror_epoch = epoch
        await self.engine.submit_wait(
            db,
            [queries.meta("mirror_role", role), queries.meta("mirror_epoch", str(epoch))],
        )
        if promotion and db.mirror_epoch > epoch:
            self._promoted_above(db)
        writes: list[Statement] = []
        if promotion:
            # R-ROUTE-16: resume every conversation where the old principal stood. Also
            # without a replicating partner: a partner fenced by a query (``superseded``)
            # dropped its image, and its file is what it serves again.
            writes = await self.engine.rebuild(db)
            if db.mirror_epoch > epoch:  # heard of meanwhile, while the image was built
                self.engine.forget_image(db)
                self._promoted_above(db)
            # R-TRACE-5: what it inherited, durable before it serves (the old principal's
            # own events of its last commits may have died with it)
            await self.engine.inherited(db)
        db.mirror_role = role
        db.mirror_epoch = max(db.mirror_epoch, epoch)
        log.info("database %s is now the %s partner at epoch %d", db.name, role, epoch)
        if writes:
            # the rebuild's own writes, once they are the principal's (a unit it ships):
            # as the mirror, the file refused them; submitted before traffic resumes, in
            # their order (the configuration's catalog: deletes, then inserts)
            db.store.submit_in_order(writes)
        if role == "principal":
            if promotion:
                # R-DLG-9, R-DLG-11: a timer or lifetime due meanwhile fires now, written
                # as the principal's (as the mirror, the file refused it)
                self.engine.watch_deadlines(db)
            self.engine.resume(db)  # a promotion: the doubt, if any, ended in ``promoting``
        else:
            self.state.forget_decisions()

    def _promoted_above(self, db: Database) -> NoReturn:
        """A partner was promoted above this one during its promotion (R-ROUTE-15): this
        one stays the mirror. Taking the role anyway made two principals at one epoch,
        the other's (``superseded`` adopts it), which senders cannot tell apart."""
        self._persist_role(db)
        raise DialogError(
            f"database {db.name!r}: a partner became principal at epoch "
            f"{db.mirror_epoch} during this promotion; this partner stays the mirror"
        )

    def mirrors_view(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = [
            {
                "kind": "local database",
                "name": db.name,
                "service": "",
                "broker_instance": str(db.broker_instance),
                "role": db.mirror_role,
                "epoch": db.mirror_epoch,
                "principal": "",
            }
            for db in self.engine.databases.values()
            if db.mirror_role is not None
        ]
        rows += [
            {
                "kind": "mirrored route",
                "name": f"{p.key.address} / {p.key.mirror_address}",
                "service": p.key.service,
                "broker_instance": str(p.key.broker_instance or ""),
                "role": p.status(),
                "epoch": p.epoch,
                "principal": p.principal or "",
            }
            for p in self.mirrors.pairs.values()
        ]
        return rows
