"""Administration: ``brokerctl`` and the views it prints.

May import: ``brokerd.sdk``, ``protocol``, ``brokerd.config`` (to find a daemon's
client port, token and trace folder from its configuration file) and ``brokerd.errors``.
Never the daemon itself, nor ``brokerd.traces``: ``brokerctl trace`` reads the trace
format (docs/traces.md) on its own.
"""
