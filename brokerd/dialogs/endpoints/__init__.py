"""Endpoints and their state: the models every other part of the dialog engine works on.

Owns a conversation endpoint and its unacknowledged messages (``endpoint``), the
endpoint state machine as data (``states``, SPEC §5), the numbers of unacknowledged
messages not in memory (``backlog``), messages ready to RECEIVE by conversation group
(``ready``), one database's in-memory image and its recovery (``database``), units of
work (``work``), timers and lifetimes (``deadlines``), who may speak for a far side
(``binding``) and service key pairs (``service_keys``, R-DLG-14), the engine's
counters (``stats``) and runs of alike messages (``runs``).

May import: ``protocol``, ``brokerd.storage``, ``brokerd.routing``, ``brokerd.traces``,
``brokerd.config``, ``brokerd.errors``. Nothing else of ``brokerd.dialogs``.
"""
