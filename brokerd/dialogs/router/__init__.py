"""The router: where a conversation's messages go, applied to live dialogs (SPEC §2).

Owns the route of each conversation and of each message from outside, forwarding,
route administration at run time, dynamic routing and mirror roles. The decisions
themselves are :mod:`brokerd.routing`'s, pure.

May import: ``brokerd.dialogs.transmission``, ``brokerd.dialogs.endpoints`` and what
they may import. It reaches the engine's verbs only through the protocol it declares.
"""
