"""What a fragment of a message of several must be for the receiver to hold it (R-DLG-7).

A receiver stores each fragment of a message of several as it arrives, one row each,
and acknowledges it after its commit (R-DLG-5); what a peer's fragments make it hold is
bounded here, fragment by fragment, before anything is stored:

* a fragment is one of a cut of its message at one size (it tiles the message with the
  others, :func:`~protocol.fragments.extent_problem`), and that size is at least
  :data:`~protocol.fragments.MIN_FRAGMENT_SIZE`, the least any broker cuts at, so a
  message is at most one row per that many bytes;
* every fragment of a message names the length the fragments held of it named;
* a database holds at most ``limits.partial_messages`` partial messages: past it, the
  first fragment of another one waits for its sender to send it again.

A fragment that fails one is dropped (not stored, not acknowledged: its sender keeps
it), counted and named in the ``drops`` view; nothing held or acknowledged goes.

May import: ``brokerd.dialogs.endpoints`` and what it may import.
"""

from __future__ import annotations

from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.endpoints.events import DialogEvents
from brokerd.dialogs.endpoints.stats import EngineStats
from protocol.buffers import Body
from protocol.dialog import DialogHeader
from protocol.fragments import MIN_FRAGMENT_SIZE, extent_problem


class FragmentChecks:
    """The receiver's bounds on the fragments of messages of several."""

    def __init__(self, events: DialogEvents, stats: EngineStats) -> None:
        self.events = events
        self.stats = stats

    def cut_wrongly(self, header: DialogHeader, body: Body) -> bool:
        """Whether a fragment is not one of a cut of its message at one size of at least
        :data:`MIN_FRAGMENT_SIZE` bytes: joined with the others it would not make the
        message, or the message would take more rows than the bound allows. It is
        dropped, neither stored nor acknowledged (R-DLG-5)."""
        extent = extent_problem(
            header.fragment_index,
            header.fragment_count,
            header.fragment_offset,
            len(body),
            header.message_length,
            MIN_FRAGMENT_SIZE,
        )
        if extent is None:
            return False
        return self._refuse(header, extent)

    def length_differs(self, ep: Endpoint, header: DialogHeader) -> bool:
        """Whether a fragment names another length of its message than the fragments
        ``ep`` holds of it: the message a sender sends again is the same message, as long
        as ever, however it cuts it. Dropped, not acknowledged; what is held stays."""
        seq = header.sequence_number
        held = ep.accepted.length_of(seq)
        if held is None or held == header.message_length:
            return False
        return self._refuse(
            header,
            f"fragment {header.fragment_index} of {header.fragment_count} says message "
            f"{seq} is {header.message_length} bytes long, the fragments held of it say "
            f"{held} (R-DLG-7)",
        )

    def too_many_partial(self, db: Database, ep: Endpoint | None, header: DialogHeader) -> bool:
        """Whether this fragment would begin another partial message in ``db`` while it
        holds ``limits.partial_messages`` of them (``ep``: the endpoint, None if the
        fragment would create it). Dropped, not acknowledged: its sender sends it again,
        and the fragments of the messages held, which complete them and make room, are
        still taken."""
        if header.fragment_count == 1 or db.partials.held < db.partial_limit:
            return False
        if ep is not None and header.sequence_number in ep.accepted.fragments:
            return False
        self.stats.partial_refusals += 1
        self.events.drop(
            header,
            f"database {db.name!r} holds {db.partials.held} partial messages "
            f"(limits.partial_messages = {db.partial_limit}): another one's first fragment "
            "waits for its sender to send it again (R-DLG-7)",
        )
        return True

    def _refuse(self, header: DialogHeader, reason: str) -> bool:
        self.stats.fragments_refused += 1
        self.events.drop(header, reason)
        return True
