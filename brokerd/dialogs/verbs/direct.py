"""Direct delivery: a SEND whose target queue can take it, bypassing the transmission queue.

R-DLG-13: "messages between two local services whose target queue can take them
directly bypass the transmission queue" (Service Broker puts such a message straight
into the target queue, and uses no transmission object for it). brokerd does so when
both endpoints of the dialog are in the same database: the message's queue row and
both endpoints' rows are one transaction in one file, so the SEND commits exactly
when the message is in the target queue, and a crash leaves both or neither.

**Decision**: between two databases of one instance (two SQLite files, whose WAL
commits cannot be one atomic transaction) a message still goes through the
transmission queue and the local link, acknowledged as between brokers.

A message goes directly only when the target endpoint has accepted every earlier
message of the dialog in order. Those that came through the transmission queue were
accepted into a commit of the same database, queued before this one, so the target
queue still gets the dialog's messages in order; they are acknowledged as usual. A
dialog's first message, and any SEND while earlier ones are still on their way to the
target, take the transmission queue like any other. So do the SENDs of a client
transaction and of ``send_many``: only pipelined SENDs go directly (the client
listener's path, ``SendVerbs.send_now``: a run of them on one conversation
commits in a job of its own, with nothing else of the application's), because
undoing a direct SEND means reloading what the database has received from its file.

May import: ``brokerd.dialogs`` models.
"""

from __future__ import annotations

from brokerd.dialogs.endpoints.database import Database
from brokerd.dialogs.endpoints.endpoint import Endpoint
from brokerd.dialogs.endpoints.states import DELIVERING


def direct_target(db: Database, ep: Endpoint) -> Endpoint | None:
    """The far endpoint of ``ep``'s dialog when its next plain message (not an end, not an
    error; the SEND's own checks already passed) may go straight into that endpoint's
    queue, or None (R-DLG-13).

    Direct only when:

    * the far endpoint is in ``db`` and still takes messages (not ended, not refused by
      its broker), and neither side is under dialog security (whose bodies travel
      encrypted and whose headers carry a tag);
    * the far endpoint has accepted every number up to ``ep``'s last (so none is in the
      transmission queue or still committing there), with no gap, no partial message,
      nothing held and nothing being validated;
    * the far endpoint's queue is on (a queue that is off holds what arrives, R-DLG-12);
    * the database sends and receives (not a fenced mirror, not in doubt, not reloading
      after a store error).
    """
    if ep.keys is not None or db.sends_nothing or db.rx_suspended:
        return None
    far = db.by_key.get((ep.conversation_id, not ep.initiator))
    if far is None or far.state not in DELIVERING or far.broker_error or far.keys is not None:
        return None
    accepted = far.accepted
    if accepted.through != ep.send_sequence or accepted.beyond or accepted.fragments:
        return None
    if far.validating or far.held_end_flags:
        return None
    queue = db.queue_of(far.service)
    info = db.catalog.queues.get(queue) if queue else None
    if info is None or not info.status:
        return None
    return far
