"""Database mirroring in high-safety mode (SPEC R-ROUTE-16; docs/design.md "Mirroring").

For each database configured with ``mirror_role`` and ``mirror_partner`` one
:class:`Partner` plays the role its database holds now:

* **Mirror.** It keeps a connection to the partner's 4022 endpoint (the same
  authenticated, encrypted connection as any broker's) and sends ATTACH: the
  database, its epoch and the last unit of work its file holds (LSN and the epoch
  that unit was written at). Just before, it asks the partner's role (a principal
  query) and adopts the epoch answered, so that its next promotion opens one above.
  It then applies, in order, each UNIT the principal ships (``Store.apply_unit``)
  or a SNAPSHOT (a copy of the principal's file, when the mirror's last unit is
  not in the principal's history: too far behind, or diverged) and CONFIRMs each.
* **Principal.** The store hands it every committed batch with its units
  (``Replica.sink``). It ships them to the attached mirror in commit order and
  holds the batch (its callbacks: acknowledgements to senders, client replies,
  outgoing messages) until the mirror confirms. With no mirror attached it goes on
  alone (``mirror_when_lost = "exposed"``) or holds everything until one attaches
  and has caught up (``"stall"``); a mirror that confirms nothing for
  ``mirror_timeout`` seconds while batches wait is deemed lost (its connection is
  closed). Recent units are kept in memory (:data:`CATCH_UP_BYTES`) so a mirror
  that was away briefly receives only what it missed.

**A principal in doubt.** A principal restarted with units in its file (it may have
been superseded, and its last units may never have been confirmed: their batches were
held, never released) reveals nothing of them until it knows. It sends and accepts no
dialog traffic for the database and releases no commit (``Database.mirror_in_doubt``)
while it asks its partner which role the partner holds (a principal query). The doubt
ends when a mirror has confirmed the file's last unit; or when the partner answers that
it is principal at a higher epoch (this partner demotes itself, its tail is discarded by
the copy it then installs); or, with ``mirror_when_lost = "exposed"``, when the partner
is a mirror, cannot be reached, or has not answered for ``mirror_timeout``. A partner
that keeps answering that it is principal at this partner's epoch keeps the doubt. Without it, a
restarted old principal sent the messages of its unconfirmed tail while the new principal
gave their sequence numbers to other messages: the far side kept the first and
discarded the others as duplicates.

A promotion (``Router.set_mirror_role``) first waits for every unit already
received to be applied, then the engine rebuilds the database's image from the file.
A demotion fails the batches still held (their outcome was never revealed, and the
new principal may not have them) and starts the mirror side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.dialogs.endpoints.database import Database
from brokerd.errors import StoreError
from brokerd.server.mirror_copies import CopyReceiver, remove_stale_copies, send_copy
from brokerd.server.outbox import MirrorAnswer
from brokerd.storage import queries
from brokerd.storage.replica import Replica, Unit
from protocol import events, mirroring
from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.frames import MirrorRole
from protocol.mirroring import Attach, Chunk, Confirm, Kind, Refuse

if TYPE_CHECKING:
    from brokerd.dialogs.engine import DialogEngine
    from brokerd.server.peer_connection import BrokerProtocol
    from brokerd.server.transport import Transport

log = logging.getLogger("brokerd.server.mirroring")

NO_LONGER_PRINCIPAL = (
    "this partner is no longer principal: the outcome of the commit is the new principal's "
    "(R-ROUTE-16)"
)
"""Why a commit made as principal fails once the partner is demoted."""
CATCH_UP_BYTES = 64 * 1024 * 1024
"""Units kept in memory after their commit, for a mirror that returns (beyond: a copy)."""
POLL = 0.2
"""How often a mirror checks its session (connected, attached)."""
ASK_EVERY = 0.5
"""How often a principal in doubt asks its partner for the partner's role."""
DIVERGED = 2**64 - 1
"""An ATTACH ``lsn_epoch`` that matches no unit: asks for a copy of the file."""


class Services(Protocol):
    """What a :class:`Partner` needs of the daemon's mirroring service
    (:class:`~brokerd.server.mirroring_service.Mirroring`)."""

    engine: DialogEngine
    transport: Transport

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...


@dataclass(frozen=True, slots=True)
class _Kept:
    """A committed unit kept for a mirror that returns: its encoded statements only (the
    statements themselves, message bodies included, would double what the ring holds
    beyond what :data:`CATCH_UP_BYTES` counts)."""

    lsn: int
    epoch: int
    data: bytes


@dataclass(slots=True)
class _Held:
    release_lsn: int
    release: Callable[[], None]
    fail: Callable[[BaseException], None]


class Partner:
    """The mirroring state of one mirrored database on this instance."""

    def __init__(self, owner: Services, db: Database) -> None:
        self.owner = owner
        self.db = db
        config = db.config
        assert config.mirror_partner is not None
        self.address = config.mirror_partner
        self.stall = config.mirror_when_lost == "stall"
        self.timeout = config.mirror_timeout
        self.replica = Replica(role=lambda: db.mirror_role, epoch=lambda: db.mirror_epoch)
        self.replica.sink = self._committed
        db.store.replica = self.replica
        # principal side
        self.session: BrokerProtocol | None = None
        self.partner_name: str | None = None
        """The partner's instance name, as this instance's connection to its address
        authenticated it: only that broker may attach as mirror."""
        self.verifying: BrokerProtocol | None = None
        """The connection whose ATTACH waits for that name."""
        self.copying: BrokerProtocol | None = None
        """The session a copy of the file is being taken for: units wait to follow the copy
        on it. A copy belongs to its session; one displaced or lost leaves the next session
        its units."""
        self.confirmed = 0
        self.shipped = 0
        """The highest LSN the attached mirror holds or was sent on its session: it cannot
        confirm more."""
        self.ring: deque[_Kept] = deque()
        self.ring_bytes = 0
        self.base = (0, 0)
        """(LSN, epoch) of the unit just before the ring's first (or the file's last)."""
        self.held: deque[_Held] = deque()
        self.progress = time.monotonic()
        self.doubt_lsn = 0
        """The file's last LSN at open, while the database is in doubt."""
        self.doubt_since = 0.0
        self.asked_at = 0.0
        self.answered_at = 0.0
        """When the partner last answered this partner's principal query."""
        self.rival_epoch = -1
        """The epoch of the last principal answer that kept this partner in doubt (logged
        once)."""
        # mirror side
        self.attached_on: BrokerProtocol | None = None
        self.refused_until = 0.0
        self.assembler = mirroring.ChunkAssembler(mirroring.MAX_UNIT_BYTES)
        self.receiver = CopyReceiver(db.store)
        """A copy of the principal's file, received into a file (not held in memory)."""
        self.applying: asyncio.Queue[tuple[BrokerProtocol, Chunk, bytes | Path]] = asyncio.Queue()
        self.busy = False
        self.closing = False
        self.stats = {
            "units_shipped": 0,
            "units_applied": 0,
            "snapshots_sent": 0,
            "snapshots_installed": 0,
            "batches_held": 0,
            "mirror_timeouts": 0,
        }

    @property
    def instance(self) -> uuid.UUID:
        return self.db.broker_instance

    def opened(self) -> None:
        """After the store opened: the file's last unit is the ring's base; a principal
        whose file holds units is in doubt about them until its partner has answered."""
        remove_stale_copies(self.db.store)
        # the units its start wrote (the configuration's catalog) are shipped as any other
        self.base = self.replica.opened_at
        for unit in self.replica.opened_units:
            self.ring.append(_Kept(unit.lsn, unit.epoch, unit.data))
            self.ring_bytes += len(unit.data)
        self.replica.opened_units = []
        if self.db.mirror_role == "principal" and self.replica.opened_at[0] > 0:
            self.db.mirror_in_doubt = True
            self.doubt_lsn = self.replica.lsn
            self.doubt_since = time.monotonic()
            log.info(
                "database %s: restarted as principal at epoch %d with LSN %d; traffic held "
                "until the partner %s confirms it or shows it was superseded",
                self.db.name,
                self.db.mirror_epoch,
                self.doubt_lsn,
                self.address,
            )

    def resolved(self, reason: str) -> None:
        """The doubt is over and this partner stays principal: release and resume."""
        db = self.db
        if not db.mirror_in_doubt:
            return
        db.mirror_in_doubt = False
        log.info("database %s: principal confirmed (%s); traffic resumes", db.name, reason)
        if self.session is None and not self.stall:
            self._release_all()
        self.owner.engine.resume(db)

    def on_partner_answer(self, answer: events.PrincipalAnswer) -> None:
        """The partner's answer to this partner's principal query: asked by a mirror as it
        attaches (it adopts its principal's epoch, so that its own next promotion opens an
        epoch above it, R-ROUTE-15, also when no unit was shipped at that epoch), and by a
        principal in doubt (R-ROUTE-16)."""
        db = self.db
        self.answered_at = time.monotonic()
        if db.mirror_role == "mirror":
            if answer.epoch > db.mirror_epoch:
                self.owner.engine.router.mirror_roles.superseded(db, answer.epoch)
            return
        if not db.mirror_in_doubt or db.mirror_role != "principal":
            return
        if answer.role is MirrorRole.PRINCIPAL:
            if answer.epoch > db.mirror_epoch:
                self.owner.engine.router.mirror_roles.superseded(db, answer.epoch)
            elif answer.epoch != self.rival_epoch:
                # Two claims at one epoch (or the partner's below it, which the query just
                # fenced): serving beside it would let both SEND on the same dialogs. The
                # doubt stays until the partner yields or the administrator decides.
                self.rival_epoch = answer.epoch
                log.warning(
                    "database %s: in doubt at epoch %d, the partner %s answers that it is "
                    "principal at epoch %d; traffic stays held (set_mirror_role decides)",
                    db.name,
                    db.mirror_epoch,
                    self.address,
                    answer.epoch,
                )
        elif not self.stall:
            self.resolved(f"the partner answered {answer.role.name.lower()}; running exposed")

    def partner_unreachable(self) -> None:
        if self.db.mirror_in_doubt and not self.stall:
            self.resolved("the partner cannot be reached; running exposed")

    # -- principal -------------------------------------------------------------------------

    def _committed(
        self,
        units: list[Unit],
        release_lsn: int,
        release: Callable[[], None],
        fail: Callable[[BaseException], None],
    ) -> None:
        if self.db.mirror_role != "principal" and units:
            # Committed as principal, but demoted before the batch came back: its units
            # are not shipped (nor kept to catch a mirror up), and the new principal's
            # history does not hold them. Its outcome is the new principal's, as that of
            # the batches held at the demotion (``fail_held``): released, it acknowledged
            # messages and answered SENDs the new principal does not have.
            fail(StoreError(f"database {self.db.name!r}: {NO_LONGER_PRINCIPAL}"))
            return
        for unit in units:  # encoded, within the mirror's bounds, before their commit
            self.ring.append(_Kept(unit.lsn, unit.epoch, unit.data))
            self.ring_bytes += len(unit.data)
            if self.session is not None and self.copying is not self.session:
                self._ship(self.session, unit.lsn, unit.epoch, unit.data)
        self._trim()
        if self.closing:
            fail(StoreError(f"database {self.db.name!r}: the broker is stopping"))
            return
        if self.db.mirror_role != "principal" or (not units and not self.held):
            release()  # nothing new to confirm, nothing before it waits
            return
        if self.session is None and not self.stall and not self.db.mirror_in_doubt:
            release()  # exposed: no mirror to wait for
            return
        if not self.held:
            self.progress = time.monotonic()
        self.held.append(_Held(release_lsn, release, fail))
        self.stats["batches_held"] += 1

    def _trim(self) -> None:
        while self.ring and self.ring_bytes > CATCH_UP_BYTES and self.copying is None:
            kept = self.ring.popleft()
            self.ring_bytes -= len(kept.data)
            self.base = (kept.lsn, kept.epoch)

    def _ship(
        self, protocol: BrokerProtocol, lsn: int, epoch: int, data: bytes, kind: Kind = Kind.UNIT
    ) -> None:
        size = mirroring.chunk_size(protocol.conn.peer_max_frame_size)
        for chunk in mirroring.split(kind, self.instance, lsn, epoch, data, size):
            protocol.send_control(events.Mirror(mirroring.encode(chunk)))
        self.shipped = max(self.shipped, lsn)
        if kind is Kind.UNIT:
            self.stats["units_shipped"] += 1

    def _knows(self, lsn: int, epoch: int) -> bool:
        """Whether the principal's history holds unit ``lsn`` written at ``epoch``."""
        if (lsn, epoch) == self.base or (lsn, epoch) == (self.replica.lsn, self.replica.lsn_epoch):
            return True
        return any(kept.lsn == lsn and kept.epoch == epoch for kept in self.ring)

    def on_attach(self, protocol: BrokerProtocol, message: Attach) -> None:
        """An ATTACH is taken only from the partner: the broker that this instance's own
        connection to ``mirror_partner`` authenticates. Any other broker of the
        deployment is refused: it would get the database's units and a copy of its file,
        displace the mirror, and release commits by confirming them."""
        verdict = self._from_partner(protocol)
        if verdict is None:
            if self.verifying is not None and not self.verifying.closed:
                self._refuse(protocol, "another attach is being checked; attach again")
                return
            self.verifying = protocol
            self.owner.spawn(self._attach_once_checked(protocol, message))
            return
        if not verdict:
            self._refuse(protocol, self._not_partner(protocol))
            return
        self._attached(protocol, message)

    def _from_partner(self, protocol: BrokerProtocol) -> bool | None:
        """Whether ``protocol``'s peer is the partner, or None while this instance's own
        connection to the partner's address is not open to tell (its name is remembered
        from the last time it was)."""
        link = self.owner.transport.link_for(self.address)
        if link.is_open and link.protocol is not None:
            self.partner_name = link.protocol.conn.peer_instance
        name = protocol.conn.peer_instance
        if name is not None and name == self.partner_name:
            return True
        return False if link.is_open else None

    async def _attach_once_checked(self, protocol: BrokerProtocol, message: Attach) -> None:
        """Dial the partner's address to learn who the partner is, then take or refuse the
        ATTACH that ``protocol`` sent meanwhile."""
        try:
            link = self.owner.transport.link_for(self.address)
            link.connect()
            deadline = time.monotonic() + 2 * self.owner.transport.config.connect_timeout
            while not link.is_open and not protocol.closed and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if protocol.closed:
                return
            if self._from_partner(protocol):
                self._attached(protocol, message)
            else:
                self._refuse(protocol, self._not_partner(protocol))
        finally:
            if self.verifying is protocol:
                self.verifying = None

    def _not_partner(self, protocol: BrokerProtocol) -> str:
        return (
            f"{protocol.conn.peer_instance!r} is not the partner of database {self.db.name} "
            f"(the broker at {self.address} is {self.partner_name!r})"
        )

    def _attached(self, protocol: BrokerProtocol, message: Attach) -> None:
        db = self.db
        if message.epoch > db.mirror_epoch and db.mirror_role == "principal":
            self.owner.engine.router.mirror_roles.superseded(db, message.epoch)
        if db.mirror_role != "principal":
            self._refuse(protocol, f"{db.fenced_reason()}")
            return
        if self.session is not protocol:
            self.shipped = 0  # nothing was sent on this session yet
        if self.session is not None and self.session is not protocol:
            if self.copying is self.session:
                self.copying = None  # that copy is its session's: no longer awaited
            self.session.pinned = False
            self.session.drop("another mirror attached for the database")
        self.session = protocol
        protocol.pinned = True
        # mirror_timeout counts from the attach: commits held while no mirror was there
        # may be older than that, and a mirror cannot confirm before it has attached.
        self.progress = time.monotonic()
        if (
            message.lsn <= self.replica.lsn
            and self._knows(message.lsn, message.lsn_epoch)
            and (message.lsn >= self.base[0])
        ):
            self.confirmed = message.lsn
            self.shipped = max(self.shipped, message.lsn)
            log.info(
                "database %s: mirror %s attached at LSN %d (principal at %d)",
                db.name,
                protocol.name,
                message.lsn,
                self.replica.lsn,
            )
            for kept in self.ring:
                if kept.lsn > message.lsn:
                    self._ship(protocol, kept.lsn, kept.epoch, kept.data)
            self._release_confirmed()
            return
        log.info(
            "database %s: mirror %s at LSN %d (epoch %d) is not in this principal's history "
            "(LSN %d): sending a copy of the file",
            db.name,
            protocol.name,
            message.lsn,
            message.lsn_epoch,
            self.replica.lsn,
        )
        # A mirror outside this history holds nothing of it until it has installed the
        # copy and confirmed: its own LSN (a diverged history, possibly ahead) must not
        # release a single commit, or a failover would lose what it released.
        self.confirmed = 0
        self.copying = protocol
        self.owner.spawn(self._copy(protocol))

    async def _copy(self, protocol: BrokerProtocol) -> None:
        """Send ``protocol``'s mirror a copy of the file (streamed: ``send_copy``), then the
        units committed since it was taken."""
        try:
            lsn = await send_copy(
                protocol,
                self.db.store,
                self.instance,
                lambda: self.session is protocol and not protocol.closed,
            )
        except StoreError as exc:
            log.error("database %s: cannot copy the file for the mirror: %s", self.db.name, exc)
            self._copied(protocol)
            protocol.drop(f"copy for the mirror failed: {exc}")
            return
        if lsn is None or self.session is not protocol or protocol.closed:
            self._copied(protocol)
            return
        self.shipped = max(self.shipped, lsn)
        self.stats["snapshots_sent"] += 1
        self._copied(protocol)
        self.progress = time.monotonic()  # the mirror has a whole file to install first
        for kept in self.ring:
            if kept.lsn > lsn:
                self._ship(protocol, kept.lsn, kept.epoch, kept.data)
        self._trim()

    def _copied(self, protocol: BrokerProtocol) -> None:
        """The copy taken for ``protocol`` is over (sent, failed or no longer wanted): a
        copy since started for another session is not."""
        if self.copying is protocol:
            self.copying = None

    def on_confirm(self, protocol: BrokerProtocol, message: Confirm) -> None:
        if protocol is not self.session:
            return
        if message.lsn > self.shipped:
            # A confused (or hostile) mirror: it cannot hold a unit it was never sent, and
            # believing it would release commits no mirror holds (R-ROUTE-16).
            protocol.drop(
                f"database {self.db.name}: the mirror confirmed LSN {message.lsn}, but only "
                f"LSN {self.shipped} was sent to it"
            )
            self.lost(protocol)
            return
        if message.lsn > self.confirmed:
            self.confirmed = message.lsn
            self.progress = time.monotonic()
        self._release_confirmed()

    def _release_confirmed(self) -> None:
        if self.db.mirror_in_doubt and self.confirmed >= self.doubt_lsn:
            self.resolved(f"the mirror confirmed LSN {self.confirmed}")
        while self.held and self.held[0].release_lsn <= self.confirmed:
            self.held.popleft().release()

    def lost(self, protocol: BrokerProtocol) -> None:
        if protocol is self.session:
            log.warning(
                "database %s: the mirror is lost (%s); %s",
                self.db.name,
                protocol.close_reason,
                "commits wait for it (stall)" if self.stall else "running exposed",
            )
            self.session = None
            self._copied(protocol)
            if not self.stall and not self.db.mirror_in_doubt:
                self._release_all()
        if protocol is self.attached_on:
            self.attached_on = None
            self.assembler.reset()
            self.receiver.reset()

    def _release_all(self) -> None:
        held, self.held = self.held, deque()
        for item in held:
            item.release()

    def fail_held(self, reason: str) -> None:
        held, self.held = self.held, deque()
        error = StoreError(f"database {self.db.name!r}: {reason}")
        for item in held:
            item.fail(error)

    def tick(self, now: float) -> None:
        db = self.db
        if db.mirror_role == "principal":
            if db.mirror_in_doubt:
                self._ask(now)
            if self.session is not None and self.held and now - self.progress > self.timeout:
                self.stats["mirror_timeouts"] += 1
                session = self.session
                session.drop(
                    f"database {db.name}: the mirror confirmed nothing for {self.timeout:g} s "
                    "(mirror_timeout)"
                )
                self.lost(session)
            return
        # mirror side: keep a session with the partner
        if self.attached_on is not None and not self.attached_on.closed:
            return
        if now < self.refused_until:
            return
        link = self.owner.transport.link_for(self.address)
        link.pinned = True
        if not link.is_open or link.protocol is None:
            link.connect()
            return
        self.attach(link.protocol)

    def _ask(self, now: float) -> None:
        """In doubt: ask the partner its role (R-ROUTE-15), and give up waiting when it has
        not answered for ``mirror_timeout`` (counted from the doubt's start or its last
        answer) and running exposed is allowed. A partner that keeps answering that it is
        principal keeps this one in doubt."""
        silent_since = max(self.doubt_since, self.answered_at)
        if not self.stall and now - silent_since > self.timeout:
            self.resolved(f"the partner has not answered for {self.timeout:g} s; running exposed")
            return
        if now - self.asked_at < ASK_EVERY:
            return
        self.asked_at = now
        self.owner.transport.link_for(self.address).send_control(self._query())

    def _query(self) -> events.PrincipalQuery:
        """A principal query to the partner about this database, carrying this partner's
        epoch (answered with the partner's role and epoch, R-ROUTE-15)."""
        # any service: the broker instance names the database
        service = min(self.db.catalog.services, default="")
        return events.PrincipalQuery(0, self.instance, service, self.db.mirror_epoch)

    def attach(self, protocol: BrokerProtocol, lsn_epoch: int | None = None) -> None:
        self.attached_on = protocol
        self.assembler.reset()
        self.receiver.reset()
        protocol.pinned = True
        # R-ROUTE-15: learn the principal's epoch (``on_partner_answer``), which no unit
        # carries while the pair is quiet. Asked before the ATTACH on the same connection:
        # the answer leaves the principal before it counts this mirror as attached.
        protocol.send_control(self._query())
        message = Attach(
            self.instance,
            self.db.mirror_epoch,
            self.replica.lsn,
            self.replica.lsn_epoch if lsn_epoch is None else lsn_epoch,
        )
        protocol.send_control(events.Mirror(mirroring.encode(message)))

    # -- mirror --------------------------------------------------------------------------------

    def on_chunk(self, protocol: BrokerProtocol, chunk: Chunk) -> None:
        if self.db.mirror_role != "mirror" or protocol is not self.attached_on:
            return
        payload: bytes | Path | None
        if chunk.kind is Kind.SNAPSHOT:
            if self.assembler.buffered:
                self.assembler.reset()
                raise RemoteProtocolError("a SNAPSHOT arrived before the UNIT was complete")
            try:
                payload = self.receiver.add(chunk)
            except StoreError as exc:
                protocol.drop(f"database {self.db.name}: {exc}")
                return
        else:
            if self.receiver.receiving:
                self.receiver.reset()
                raise RemoteProtocolError("a UNIT arrived before the SNAPSHOT was complete")
            payload = self.assembler.add(chunk)
        if payload is None:
            return
        self.applying.put_nowait((protocol, chunk, payload))
        if not self.busy:
            self.busy = True
            self.owner.spawn(self._apply_all())

    async def _apply_all(self) -> None:
        try:
            while not self.applying.empty():
                protocol, chunk, payload = self.applying.get_nowait()
                if self.db.mirror_role != "mirror" or protocol is not self.attached_on:
                    if isinstance(payload, Path):
                        payload.unlink(missing_ok=True)
                    continue
                try:
                    confirmed = await self._apply(chunk, payload)
                except (StoreError, RemoteProtocolError) as exc:
                    log.error(
                        "database %s: cannot apply the principal's LSN %d: %s; asking for a copy",
                        self.db.name,
                        chunk.lsn,
                        exc,
                    )
                    self._drain()
                    self.attach(protocol, DIVERGED)
                    continue
                if confirmed is None:
                    self._drain()
                    self.attach(protocol)  # a gap: attach again from what the file holds
                    continue
                protocol.send_control(
                    events.Mirror(mirroring.encode(Confirm(self.instance, confirmed)))
                )
        finally:
            self.busy = False

    def _drain(self) -> None:
        while not self.applying.empty():
            _, _, payload = self.applying.get_nowait()
            if isinstance(payload, Path):
                payload.unlink(missing_ok=True)

    async def _apply(self, chunk: Chunk, payload: bytes | Path) -> int | None:
        store = self.db.store
        if isinstance(payload, Path):
            own = [
                queries.meta("mirror_role", "mirror"),
                queries.meta("mirror_epoch", str(self.db.mirror_epoch)),
            ]
            try:
                await store.install_snapshot(payload, own)
            finally:
                payload.unlink(missing_ok=True)
            self.stats["snapshots_installed"] += 1
            log.info(
                "database %s: installed the principal's copy at LSN %d", self.db.name, chunk.lsn
            )
            return self.replica.lsn
        if chunk.lsn <= self.replica.lsn:
            return self.replica.lsn  # already applied (sent again after a new attach)
        if chunk.lsn != self.replica.lsn + 1:
            return None
        await store.apply_unit(Unit(chunk.lsn, chunk.epoch, payload))
        self.stats["units_applied"] += 1
        return chunk.lsn

    async def drained(self) -> None:
        """Every unit received so far is applied (before a promotion)."""
        while self.busy or not self.applying.empty():
            await asyncio.sleep(0.01)

    def view(self) -> dict[str, object]:
        return {
            "kind": "mirroring",
            "database": self.db.name,
            "role": self.db.mirror_role,
            "partner": self.address,
            "lsn": self.replica.lsn,
            "lsn_epoch": self.replica.lsn_epoch,
            "mirror_attached": self.session is not None and not self.session.closed,
            "confirmed": self.confirmed,
            "held": len(self.held),
            "in_doubt": self.db.mirror_in_doubt,
            "when_lost": "stall" if self.stall else "exposed",
            "attached_to_principal": self.attached_on is not None and not self.attached_on.closed,
            **self.stats,
        }

    def _refuse(self, protocol: BrokerProtocol, reason: str) -> None:
        with contextlib.suppress(LocalProtocolError):
            protocol.send_control(
                MirrorAnswer(mirroring.encode(Refuse(self.instance, reason[:900])))
            )
