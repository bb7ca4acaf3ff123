"""Lifetime hygiene: what the engine keeps of a dialog once it is over (SPEC §5).

Owns the clean-up of closed endpoints (``cleanup``): the endpoints
:class:`~brokerd.dialogs.endpoints.closing.ClosedEndpoints` says may go are removed from
memory and, in batches, from their database's file with every row of their
conversation (messages retained under RETENTION, fragments, timer, idempotency keys).

May import: ``brokerd.dialogs.transmission``, ``brokerd.dialogs.endpoints`` and what they
may import.
"""
