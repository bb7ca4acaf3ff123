"""Server: the daemon's sockets, listeners, transport and timers.

Owns the adjacent-broker listener and connections on port 4022 (driving the
sans-I/O ``protocol.connection``), the client listener for applications, the
per-peer queues the connections drain, and the ``Broker`` that wires the
databases, the engine and the listeners together and runs them.

May import everything of the daemon below it: ``protocol``, ``brokerd.storage``,
``brokerd.routing``, ``brokerd.dialogs``, ``brokerd.traces``, ``brokerd.config``,
``brokerd.errors``. Never the SDK, ``brokerd.admin`` or ``brokerd.tools``.
"""
