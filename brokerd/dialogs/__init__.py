"""Dialogs: conversation endpoints, their state table, sequencing, reassembly and
the dialog engine that applies application verbs and peer fragments to them
(SPEC §4, §5).

May import: ``protocol``, ``brokerd.storage``, ``brokerd.routing``,
``brokerd.traces``, ``brokerd.config``, ``brokerd.errors``. Never ``brokerd.server``
(connections reach the engine through the ``Link`` protocol it declares) or the SDK.
"""
