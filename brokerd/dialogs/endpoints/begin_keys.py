"""What one database knows of its BEGIN DIALOGs' idempotency keys (SPEC §6, outcomes):
per initiating service and key, the dialog the key began and the arguments it was begun
with, and, while that BEGIN DIALOG commits, its outcome for the repeats of the key that
wait for it.

A :class:`BeginKeys` is the in-memory image of the ``begin_dialog_keys`` table, loaded by
recovery with the endpoints and changed by
:class:`~brokerd.dialogs.verbs.begin_keys.BeginKeyVerbs`; a key goes with its dialog's
endpoint (:meth:`forget_conversation`) and after ``limits.send_key_window``
(:meth:`forget_older`).

May import: the standard library only.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

Arguments = dict[str, Any]
"""A BEGIN DIALOG's arguments a key is checked against: target service, contract, far
broker instance, lifetime, related conversation or group (texts and a number)."""


def arguments_text(arguments: Arguments) -> str:
    """``arguments`` as the row keeps them (JSON, keys sorted)."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"))


def arguments_of(text: str) -> Arguments:
    """The arguments a row keeps."""
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


@dataclass(slots=True)
class BeginKey:
    """The dialog one key began."""

    handle: uuid.UUID
    arguments: Arguments
    created_at: float
    """Wall-clock time its BEGIN DIALOG was made: the window counts from it."""
    committing: asyncio.Future[None] | None = None
    """Until its BEGIN DIALOG has committed: done with its outcome (the repeats of the
    key wait for it, and fail as it failed)."""

    def committed(self) -> None:
        future, self.committing = self.committing, None
        if future is not None and not future.done():
            future.set_result(None)

    def failed(self, exc: BaseException) -> None:
        future, self.committing = self.committing, None
        if future is not None and not future.done():
            future.set_exception(exc)
            future.exception()  # retrieved: a failure no repeat waited for is not logged


@dataclass
class BeginKeys:
    """The keys of one database's BEGIN DIALOGs, by (initiating service, key)."""

    by_key: dict[tuple[str, str], BeginKey] = field(default_factory=dict)
    of_handle: dict[uuid.UUID, tuple[str, str]] = field(default_factory=dict)
    """The key of each keyed dialog, so that it goes with its endpoint."""

    def find(self, service: str, key: str) -> BeginKey | None:
        return self.by_key.get((service, key))

    def add(self, service: str, key: str, entry: BeginKey) -> None:
        self.by_key[(service, key)] = entry
        self.of_handle[entry.handle] = (service, key)

    def forget_conversation(self, handle: uuid.UUID) -> None:
        """The dialog ``handle`` is gone (removed, ended WITH CLEANUP, its BEGIN DIALOG
        failed): so is its key."""
        named = self.of_handle.pop(handle, None)
        if named is not None and (entry := self.by_key.get(named)) and entry.handle == handle:
            del self.by_key[named]

    def forget_older(self, before: float) -> int:
        """Forget the committed keys made before ``before``; how many went."""
        stale = [
            named
            for named, entry in self.by_key.items()
            if entry.created_at < before and entry.committing is None
        ]
        for named in stale:
            entry = self.by_key.pop(named)
            self.of_handle.pop(entry.handle, None)
        return len(stale)
