"""The read-only web console (``/``) and what it refreshes itself from
(``/console/body``, its content, fetched every two seconds; ``/console.json``, the
same data as JSON): connections, queues, the transmission queue with its status text,
endpoints by state, routes and the message rates. One page, no external assets: its
style and script are in the template (``templates/console.html.j2``).

May import: ``jinja2``, ``brokerd.server.admin_http.snapshot``.
"""

from __future__ import annotations

from typing import Any

import jinja2
import orjson

from brokerd.server.admin_http.snapshot import Snapshot

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("brokerd.server.admin_http", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


def model(s: Snapshot) -> dict[str, Any]:
    """What the page shows, as plain data (the template's and the JSON's)."""
    stats = s.stats
    return {
        "instance": s.instance,
        "ready": s.ready,
        "uptime": round(s.uptime, 1),
        "taken_at": s.taken_at,
        "counters": {
            "sent": stats.get("sent_messages", 0),
            "delivered": stats.get("delivered_messages", 0),
            "received": stats.get("received_by_application", 0),
            "retransmissions": stats.get("retransmissions", 0),
        },
        "client_connections": s.client_connections,
        "connections": [
            {
                k: row.get(k)
                for k in ("peer", "address", "direction", "state", "encrypted", "last_activity")
            }
            for row in s.views["broker_connections"]
        ],
        "queues": [
            {
                k: row.get(k)
                for k in (
                    "database",
                    "queue",
                    "status",
                    "ready_messages",
                    "readers",
                    "quarantined_conversations",
                )
            }
            for row in s.views["queues"]
        ],
        "peers": [
            {
                "peer": p.peer,
                "messages": p.messages,
                "oldest_age": round(p.oldest_age, 1),
                "status": p.status,
            }
            for p in s.peers()
        ],
        "transmission_queue": [
            {
                k: row.get(k)
                for k in (
                    "database",
                    "to_service",
                    "message_sequence_number",
                    "message_type",
                    "enqueued_at",
                    "transmission_status",
                )
            }
            for row in s.backlog.oldest
        ],
        "transmission_queue_total": s.backlog.total,
        "endpoints": [
            {"database": db, "state": state, "endpoints": n}
            for (db, state), n in sorted(s.endpoints_by_state().items())
        ],
        "routes": [
            {
                k: row.get(k)
                for k in ("database", "name", "remote_service_name", "address", "mirror_address")
            }
            for row in s.views["routes"]
        ],
    }


def page(s: Snapshot) -> bytes:
    """The whole page."""
    return _ENV.get_template("console.html.j2").render(m=model(s)).encode()


def body(s: Snapshot) -> bytes:
    """The page's content only, which the page fetches every two seconds."""
    return _ENV.get_template("console_body.html.j2").render(m=model(s)).encode()


def json(s: Snapshot) -> bytes:
    return orjson.dumps(model(s), default=str)
