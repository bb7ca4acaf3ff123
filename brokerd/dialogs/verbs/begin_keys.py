"""BEGIN DIALOG with an idempotency key (SPEC §6, outcomes): a BEGIN DIALOG whose outcome
is unknown (its connection lost before the answer) may be made again under the same key,
and begins one dialog.

A key is unique per initiating service and database. A new key is kept with the handle
of the dialog it begins, and the arguments it was begun with, in the BEGIN DIALOG's own
commit (``begin_dialog_keys``), so the key is durable exactly when the dialog is. A key
this database knows is answered with its dialog (once that dialog's BEGIN DIALOG has
committed, or failed as it failed) and begins nothing; one used again with other
arguments is refused (``KeyReused``). A key goes with its dialog's endpoint (the
clean-up of closed endpoints, END CONVERSATION WITH CLEANUP) and after
``limits.send_key_window``, as the keys of SENDs do.

May import: :mod:`brokerd.dialogs.verbs.conversation`, ``brokerd.dialogs.endpoints`` and
what they may import.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from brokerd.dialogs.endpoints.begin_keys import Arguments, BeginKey, arguments_text
from brokerd.dialogs.endpoints.commits import commit
from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.directory import Directory
from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.verbs.conversation import ConversationVerbs
from brokerd.errors import KeyReused
from brokerd.storage import queries


class BeginKeyVerbs:
    """BEGIN DIALOG under an idempotency key, and the keys forgotten after their window."""

    def __init__(
        self,
        directory: Directory,
        conversations: ConversationVerbs,
        clock: Callable[[], float],
        key_window: float,
    ) -> None:
        self.directory = directory
        self.conversations = conversations
        self.clock = clock
        self.key_window = key_window
        """Seconds a key is kept (``limits.send_key_window``)."""

    async def begin_dialog(
        self, key: str, from_service: str, to_service: str, contract: str, **options: Any
    ) -> Endpoint:
        """BEGIN DIALOG as :meth:`ConversationVerbs.begin_dialog` (``options``: its keyword
        arguments), under ``key``: the dialog this key began, if ``from_service`` gave it
        one in this database within the window (``KeyReused`` if with other arguments),
        else a new one."""
        db = self.conversations.initiating_database(from_service, options.get("database"))
        arguments: Arguments = {
            "to_service": to_service,
            "contract": contract,
            "to_broker_instance": _text(options.get("to_broker_instance")),
            "lifetime": options.get("lifetime", 0),
            "related_conversation": _text(options.get("related_conversation")),
            "related_conversation_group": _text(options.get("related_group")),
        }
        known = await self._known(db, from_service, key, arguments)
        if known is not None:
            return known
        db, ep = self.conversations.new_dialog(from_service, to_service, contract, **options)
        work = self.conversations.begin_dialog_work(db, ep)
        now = self.clock()
        entry = BeginKey(ep.handle, arguments, now, asyncio.get_running_loop().create_future())
        db.begin_keys.add(from_service, key, entry)
        row = queries.begin_key(from_service, key, ep.handle_text, arguments_text(arguments), now)
        work.add([row], entry.committed, entry.failed)
        await commit(db, work)
        return ep

    async def _known(
        self, db: Database, from_service: str, key: str, arguments: Arguments
    ) -> Endpoint | None:
        """The endpoint of the dialog ``key`` began (once its BEGIN DIALOG has committed),
        or None if the key is new."""
        entry = db.begin_keys.find(from_service, key)
        if entry is None:
            return None
        if entry.arguments != arguments:
            differ = ", ".join(
                f"{name} {entry.arguments.get(name)!r}, not {value!r}"
                for name, value in arguments.items()
                if entry.arguments.get(name) != value
            )
            raise KeyReused(
                f"BEGIN DIALOG refused: key {key!r} of service {from_service!r} began dialog "
                f"{entry.handle} with other arguments ({differ}); a key names one dialog"
            )
        if entry.committing is not None:
            await asyncio.shield(entry.committing)  # fails as the first one failed
        ep = db.endpoints.get(entry.handle)
        if ep is None:  # gone meanwhile (its key with it): the key is new
            return None
        return ep

    def forget_old_keys(self, now: float) -> None:
        """Forget the keys kept longer than ``limits.send_key_window``, in memory and in
        each database's file."""
        before = now - self.key_window
        for db in self.directory.databases.values():
            if db.mirror_role == "mirror":
                continue  # its file changes only by what the principal ships
            if db.begin_keys.forget_older(before):
                db.store.submit([queries.forget_begin_keys(before)])


def _text(value: uuid.UUID | None) -> str | None:
    return None if value is None else str(value)
