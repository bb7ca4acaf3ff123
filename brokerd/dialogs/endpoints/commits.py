"""Committing units of work: a :class:`~brokerd.dialogs.endpoints.work.Work` (or bare
statements) handed to its database's committer, its callbacks run after the commit.

Every part of the engine commits through these functions, so there is one way a unit
of work reaches the file: queued for the next group commit at once, before anything
else runs on the loop (its endpoint snapshots were taken now, and a snapshot queued
after a newer one of the same endpoint would write back an older receive sequence).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.work import Work
from brokerd.storage.schema import Statement


def submit(db: Database, work: Work) -> asyncio.Future[Any]:
    """Queue ``work`` for the next group commit now; the future is done after its
    callbacks ran."""
    future = db.store.submit(
        work.statements,
        on_commit=work.committed,
        on_failure=work.failed,
        wait=True,
        chains=work.chains,
    )
    assert future is not None
    return future


async def commit(db: Database, work: Work) -> None:
    """Make ``work`` durable in one SQLite transaction; its callbacks run after it."""
    await submit(db, work)


async def commit_statements(
    db: Database,
    statements: list[Statement],
    on_commit: Callable[[], None] | None = None,
    on_failure: Callable[[BaseException], None] | None = None,
) -> None:
    """Commit bare ``statements`` (no unit of work) and wait for it."""
    future = db.store.submit(statements, on_commit=on_commit, on_failure=on_failure, wait=True)
    assert future is not None
    await future
