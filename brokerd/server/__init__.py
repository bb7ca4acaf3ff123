"""Server: the daemon's sockets, listeners, transport and timers.

Owns the adjacent-broker listener on port 4022 and its watch (``transport``), one
connection with its send pump (``peer_connection``, driving the sans-I/O
``protocol.connection``), the dialling of one peer address (``peer_link``), the
client listener for applications, the per-peer queues the connections drain, and
the ``Broker`` that wires the databases, the engine and the listeners together and
runs them.

May import everything of the daemon below it: ``protocol``, ``brokerd.storage``,
``brokerd.routing``, ``brokerd.dialogs``, ``brokerd.traces``, ``brokerd.config``,
``brokerd.errors``. Never the SDK, ``brokerd.admin`` or ``brokerd.tools``.
"""
