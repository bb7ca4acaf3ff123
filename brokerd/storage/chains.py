"""Chains of jobs: jobs that each build on the ones before them, committed in order.

A dialog's SENDs are numbered when they are submitted, before any of them is
committed (R-DLG-1): SEND 7 is only meaningful if 2..6 are stored. If the commit
holding 2..6 fails (a full disk, say), a later job holding 7 must not commit on
its own, or the far side waits for ever for numbers that were never stored.

The receiving side has the same shape: a job storing message 8 of a dialog also
records that 1..8 were received, and must not commit after the job storing 7 failed.

A job names the chains it extends as ``(key, generation)`` tokens: a dialog's
endpoint and the generation its SENDs were numbered in
(``Endpoint.numbering``), or the endpoint's receiving chain
(``Endpoint.receiving``). When a job fails, the committer thread marks its tokens
broken, and every later job holding a token of the same key and a generation no
newer is refused untried, with an error that says why. The event loop, told of
the failure, renumbers from the last stored number in a new generation (or, for
what is received, reloads it from the file in a new generation), whose jobs
commit again. Committer thread only.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from brokerd.errors import StoreError

Token = tuple[Hashable, int]
"""A chain's key and the generation a job extends it in."""


class BrokenChains:
    """Keys whose chain broke, with the newest broken generation and its error."""

    __slots__ = ("_broken",)

    def __init__(self) -> None:
        self._broken: dict[Hashable, tuple[int, BaseException]] = {}

    def refusal(self, chains: Sequence[Token]) -> StoreError | None:
        """Why a job holding ``chains`` must not be tried, or None."""
        for key, generation in chains:
            broken = self._broken.get(key)
            if broken is not None and generation <= broken[0]:
                error = StoreError(
                    f"not committed: an earlier write it follows failed ({broken[1]}); "
                    "what came after that failure is refused too, so nothing is stored out "
                    "of order"
                )
                error.__cause__ = broken[1]
                return error
        return None

    def failed(self, chains: Sequence[Token], error: BaseException) -> None:
        for key, generation in chains:
            broken = self._broken.get(key)
            if broken is None or broken[0] < generation:
                self._broken[key] = (generation, error)

    def committed(self, chains: Sequence[Token]) -> None:
        """A job of a newer generation committed: every job of the broken one, submitted
        before it, has been refused already, so the key is forgotten (bounded memory)."""
        for key, generation in chains:
            broken = self._broken.get(key)
            if broken is not None and broken[0] < generation:
                del self._broken[key]

    def __len__(self) -> int:
        return len(self._broken)
