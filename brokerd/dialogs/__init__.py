"""Dialogs: exactly-once-in-order conversations between services (SPEC §4, §5, §6).

The dialog engine is a set of parts, each a sub-package; every part owns its state and
is handed its collaborators. From the bottom up:

* ``endpoints``: an endpoint and its state machine (as data), the database image and
  its recovery, ready messages, units of work and committing them, the lookups every
  part needs (``Directory``), drops and a dialog's life in the trace (``DialogEvents``);
* ``transmission``: sending, retransmission, acknowledgements, send windows, bodies in
  memory, the ``Link`` protocols and the local link;
* ``router``: where messages go, applied to live dialogs (SPEC §2);
* ``arrivals``: what links hand over, checked, made durable and ready to RECEIVE, and
  the broker's own messages (Errors, DialogTimers, deadlines firing);
* ``verbs``: the application's verbs (SEND, RECEIVE, BEGIN DIALOG, END CONVERSATION,
  ...), client transactions and the administrator's views;
* ``images``: a mirrored database's image as its role changes;
* ``engine``: :class:`~brokerd.dialogs.engine.DialogEngine` composes them.

Each sub-package's docstring says what it owns and may import; import-linter's
contracts in ``pyproject.toml`` hold the order above and each sub-package's own.

May import: ``protocol``, ``brokerd.storage``, ``brokerd.routing``,
``brokerd.traces``, ``brokerd.config``, ``brokerd.errors``. Never ``brokerd.server``
(connections reach the engine through the ``Link`` protocol it declares) or the SDK.
"""
