"""Endpoints and their state: the models every other part of the dialog engine works on,
and the small parts they all share.

Owns:

* the models: a conversation endpoint and its unacknowledged messages (``endpoint``),
  the endpoint state machine as data (``states``, SPEC §5), the numbers of
  unacknowledged messages not in memory (``backlog``), messages ready to RECEIVE by
  conversation group (``ready``), one database's in-memory image and its recovery
  (``database``), units of work (``work``), timers and lifetimes (``deadlines``), who
  may speak for a far side (``binding``) and service key pairs (``service_keys``,
  R-DLG-14), the engine's counters (``stats``), runs of alike messages (``runs``),
  the broker's Error bodies and codes (``broker_errors``) and what poison-message
  handling knows of a database: rollback counts and quarantines (``poison``, SPEC §6),
  and the idempotency keys of its BEGIN DIALOGs (``begin_keys``, SPEC §6);
* the shared parts: the databases and the lookups every part needs (``directory``),
  committing a unit of work (``commits``), and dropped messages and a dialog's life in
  the trace (``events``).

May import: ``protocol``, ``brokerd.storage``, ``brokerd.routing``, ``brokerd.traces``,
``brokerd.config``, ``brokerd.errors``. Nothing else of ``brokerd.dialogs``.
"""
