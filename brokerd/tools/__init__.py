"""Tools around the daemon: certificates, the fault proxy, the local cluster
launcher, the example deployment and the demo.

May import anything. Never imported by the daemon (``brokerd.server`` and below).
"""
