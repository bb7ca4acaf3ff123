"""Transmission: how an endpoint's messages reach a link and come back acknowledged.

Owns sending, retransmission and dedicated acknowledgements (``transmission``), the
send window (``window``), each link's acknowledgement delay (``rtt``), unacknowledged
bodies in memory (``bodies``), what a sender takes from the fragments an acknowledgement
names (``fragment_acks``), the ``Link`` protocols (``links``) and delivery between the
databases of one instance (``local_link``). R-DLG-5, R-DLG-6, R-DLG-7, R-DLG-13.

May import: ``brokerd.dialogs.endpoints`` and what it may import. It reaches the router
and the engine only through the protocols it declares.
"""
