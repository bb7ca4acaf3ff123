"""Arrivals: what links hand the engine, made durable and ready to RECEIVE (SPEC §4, §5).

Owns fragments, acknowledgements and broker errors from links: routing on arrival,
binding and dialog security checks, duplicates, in-order release and reassembly,
acknowledgements after the commit (R-DLG-2 .. R-DLG-8, R-DLG-14), and the runs of one
dialog that the local link and a connection hand over.

May import: ``brokerd.dialogs.router``, ``brokerd.dialogs.transmission``,
``brokerd.dialogs.endpoints`` and what they may import.
"""
