"""A unit of work: the rows one change writes, and what happens once they commit.

Every change of a database is computed first, without I/O, as a :class:`Work`:
the statements for one SQLite transaction, the callbacks that publish its
effects once that transaction has committed (queue the messages for
transmission, release a conversation group's lock, wake a RECEIVE, emit trace
events) and the callbacks that undo its in-memory effects if it fails. Works
combine: a client transaction is the concatenation of the works of its verbs,
committed by the store as one job, so all of it commits or none of it does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from brokerd.storage.chains import Token
from brokerd.storage.schema import Statement


@dataclass
class Work:
    statements: list[Statement] = field(default_factory=list)
    on_commit: list[Callable[[], None]] = field(default_factory=list)
    """Run in order once the transaction holding ``statements`` has committed."""
    on_failure: list[Callable[[BaseException], None]] = field(default_factory=list)
    """Run in reverse order if it failed: each undoes what its step did in memory."""
    chains: list[Token] = field(default_factory=list)
    """The dialogs' numberings it extends (:mod:`brokerd.storage.chains`): if an earlier
    SEND of one of them failed, this work is refused untried."""

    def add(
        self,
        statements: Iterable[Statement] = (),
        on_commit: Callable[[], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        chain: Token | None = None,
    ) -> Work:
        self.statements.extend(statements)
        if on_commit is not None:
            self.on_commit.append(on_commit)
        if on_failure is not None:
            self.on_failure.append(on_failure)
        if chain is not None:
            self.chains.append(chain)  # repeats are harmless: the store reads each
        return self

    def extend(self, other: Work) -> Work:
        self.statements.extend(other.statements)
        self.on_commit.extend(other.on_commit)
        self.on_failure.extend(other.on_failure)
        self.chains.extend(other.chains)
        return self

    def committed(self) -> None:
        for step in self.on_commit:
            step()

    def failed(self, exc: BaseException) -> None:
        for step in reversed(self.on_failure):
            step(exc)
