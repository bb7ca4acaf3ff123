"""Routing: route tables, matching and decisions, mirrors, the forwarding budget (SPEC §2).

Pure: a decision is computed from the route tables, the conversation, the local
databases and the time, and says deliver here, send to an address, delay (with
the reason) or drop. Nothing here opens a socket, awaits, or writes a file.

May import: ``protocol``, ``brokerd.storage``, ``brokerd.config``, ``brokerd.errors``.
Never ``brokerd.dialogs`` or ``brokerd.server``.
"""
