"""The admin HTTP port of a daemon (``[admin] listen``): health, Prometheus metrics and
a read-only web console.

Owns the HTTP/1.1 server (``http``: ``asyncio`` streams and the sans-I/O ``h11``
parser, GET only, bounded requests), the readiness and health answers and the routes
(``site``), the snapshot of the daemon's views a scrape or the console reads once
(``snapshot``), the Prometheus collector over that snapshot and the store's commit
latencies (``metrics``), and the console page and its JSON (``console``, with its
Jinja2 template in ``templates/``).

It reads the daemon only through its views (``brokerd.server.client_views``) and the
:class:`~brokerd.server.admin_http.snapshot.AdminBroker` protocol; it changes nothing.

May import: ``brokerd.server.client_views``, ``brokerd.dialogs`` (for types),
``brokerd.storage.latency``, ``brokerd.config``, ``brokerd.errors`` and ``protocol``;
never the daemon module itself (``brokerd.server.daemon`` imports this package).
"""
