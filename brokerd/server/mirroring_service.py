"""The daemon's mirroring service: every mirrored database's :class:`Partner` (SPEC
R-ROUTE-15, R-ROUTE-16; docs/design.md "Mirroring").

:class:`Mirroring` makes a :class:`~brokerd.server.mirroring.Partner` for each database
configured with ``mirror_role`` and ``mirror_partner``, ticks them, hands them the MIRROR
frames the transport receives (by broker instance) and the partner's principal answers,
and is the router's hooks as a database's role changes (``promoting``, ``demoting``,
``resolved``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from brokerd.dialogs.endpoints.database import Database
from brokerd.server.mirroring import NO_LONGER_PRINCIPAL, POLL, Partner
from brokerd.server.outbox import MirrorAnswer
from protocol import events, mirroring
from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.mirroring import Attach, Chunk, Confirm, Refuse

if TYPE_CHECKING:
    from brokerd.dialogs.engine import DialogEngine
    from brokerd.server.peer_connection import BrokerProtocol
    from brokerd.server.transport import Transport

log = logging.getLogger("brokerd.server.mirroring")


class Mirroring:
    """Every :class:`Partner` of the instance; the transport hands it MIRROR frames."""

    def __init__(self, transport: Transport, engine: DialogEngine) -> None:
        self.transport = transport
        self.engine = engine
        self.partners: dict[uuid.UUID, Partner] = {}
        self.by_name: dict[str, Partner] = {}
        for db in engine.databases.values():
            if db.config.mirror_role is not None and db.config.mirror_partner is not None:
                self.by_name[db.name] = Partner(self, db)
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None

    def __bool__(self) -> bool:
        return bool(self.by_name)

    def opened(self) -> None:
        """The databases are open: index the partners by broker instance."""
        for partner in self.by_name.values():
            partner.opened()
            self.partners[partner.instance] = partner

    def start(self) -> None:
        self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="mirroring")

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        for task in list(self._tasks):
            task.cancel()
        for partner in self.by_name.values():
            partner.closing = True
            partner.fail_held("the broker is stopping")

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(POLL)
            now = time.monotonic()
            for partner in self.by_name.values():
                try:
                    partner.tick(now)
                except Exception:
                    log.exception("mirroring of %s", partner.db.name)

    # -- from the transport --------------------------------------------------------------

    def on_message(self, protocol: BrokerProtocol, payload: bytes) -> None:
        try:
            message = mirroring.decode(payload)
        except RemoteProtocolError as exc:
            protocol.abort(f"malformed mirroring message from {protocol.name}: {exc}")
            return
        partner = self.partners.get(message.broker_instance)
        if partner is None:
            if isinstance(message, Attach):
                with contextlib.suppress(LocalProtocolError):
                    protocol.send_control(
                        MirrorAnswer(
                            mirroring.encode(
                                Refuse(
                                    message.broker_instance,
                                    "no database with that broker instance is mirrored here",
                                )
                            )
                        )
                    )
            return
        try:
            if isinstance(message, Attach):
                partner.on_attach(protocol, message)
            elif isinstance(message, Confirm):
                partner.on_confirm(protocol, message)
            elif isinstance(message, Chunk):
                partner.on_chunk(protocol, message)
            else:
                log.warning(
                    "database %s: the partner %s refused mirroring: %s",
                    partner.db.name,
                    protocol.name,
                    message.reason,
                )
                if protocol is partner.attached_on:
                    partner.attached_on = None
                    partner.refused_until = time.monotonic() + 1.0
        except RemoteProtocolError as exc:
            protocol.abort(f"bad mirroring message from {protocol.name}: {exc}")

    def partner_answered(self, address: str, answer: events.PrincipalAnswer) -> None:
        partner = self.partners.get(answer.broker_instance)
        if partner is not None and partner.address == address:
            partner.on_partner_answer(answer)

    def unreachable(self, address: str) -> None:
        for partner in self.by_name.values():
            if partner.address == address:
                partner.partner_unreachable()

    def connection_lost(self, protocol: BrokerProtocol) -> None:
        for partner in self.by_name.values():
            partner.lost(protocol)

    # -- from the router (MirrorHooks) ------------------------------------------------------

    async def promoting(self, db: Database) -> None:
        partner = self.by_name.get(db.name)
        if partner is None:
            return
        await partner.drained()
        if partner.attached_on is not None:
            partner.attached_on.pinned = False
        partner.attached_on = None
        partner.assembler.reset()
        partner.receiver.reset()  # a copy cut off: its file goes
        partner.ring.clear()
        partner.ring_bytes = 0
        partner.base = (partner.replica.lsn, partner.replica.lsn_epoch)
        partner.confirmed = 0
        db.mirror_in_doubt = False  # a mirror holds only what its principal confirmed

    def demoting(self, db: Database) -> None:
        partner = self.by_name.get(db.name)
        if partner is None:
            return
        if partner.session is not None:
            session, partner.session = partner.session, None
            session.pinned = False
            session.drop(f"database {db.name} is no longer principal here")
        partner.fail_held(NO_LONGER_PRINCIPAL)
        partner.ring.clear()
        partner.ring_bytes = 0
        partner.copying = None
        db.mirror_in_doubt = False  # superseded: its tail is discarded by the copy it installs

    def resolved(self, db: Database, reason: str) -> None:
        partner = self.by_name.get(db.name)
        if partner is not None:
            partner.resolved(reason)

    def view(self) -> list[dict[str, object]]:
        return [partner.view() for partner in self.by_name.values()]
