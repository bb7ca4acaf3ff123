"""The application's verbs (SPEC §6): BEGIN DIALOG, SEND, RECEIVE, END CONVERSATION,
MOVE CONVERSATION, BEGIN CONVERSATION TIMER, ALTER QUEUE, client transactions,
poison-message handling (``poison``: rollback counts, quarantine, release) and the
views an administrator reads.

May import: ``brokerd.dialogs.arrivals`` (a SEND inside one database is an arrival,
R-DLG-13), ``brokerd.dialogs.router``, ``brokerd.dialogs.transmission``,
``brokerd.dialogs.endpoints`` and what they may import.
"""
