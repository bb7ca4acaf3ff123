"""``/metrics``: the daemon in Prometheus's text format, read from a :class:`Snapshot` at
scrape time by a custom collector (no counter is kept twice: the figures are the
``stats``, ``queues``, ``transmission_queue``, ``broker_connections`` and
``endpoint_ages`` views, and each store's commit-latency histogram).

May import: ``prometheus_client``, ``brokerd.server.admin_http.snapshot``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from brokerd.server.admin_http.snapshot import Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("messages_sent", "sent_messages", "Messages SENT by applications of this broker."),
    (
        "messages_delivered",
        "delivered_messages",
        "Messages delivered into a queue of this broker (from any broker).",
    ),
    (
        "messages_received",
        "received_by_application",
        "Messages RECEIVEd by applications of this broker.",
    ),
    ("retransmissions", "retransmissions", "Messages sent again for want of an acknowledgement."),
    ("duplicates", "duplicates", "Messages that arrived again and were acknowledged again."),
    ("corrupted_messages", "corrupted_messages", "Messages whose signature did not match."),
    ("dropped_messages", "dropped", "Messages dropped (see brokerctl drops for why)."),
    ("fragments_sent", "fragments_sent", "Message fragments sent to other brokers."),
    ("fragments_received", "fragments_received", "Message fragments received from brokers."),
    ("rollbacks_counted", "rollbacks_counted", "Messages put back by a ROLLBACK and counted."),
    ("poison_quarantined", "poison_quarantined", "Conversations set aside as poison."),
)
"""(metric name without ``brokerd_`` and ``_total``, ``stats`` field, help)."""


class BrokerCollector(Collector):
    """The metric families of one snapshot."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        yield _gauge("brokerd_ready", "1 once the databases are open and listeners up.", s.ready)
        yield _gauge("brokerd_uptime_seconds", "Seconds since the daemon started.", s.uptime)
        stats = s.stats
        for name, field, help_text in COUNTERS:
            yield CounterMetricFamily(f"brokerd_{name}", help_text, value=stats.get(field, 0))

        depth = GaugeMetricFamily(
            "brokerd_queue_messages", "Messages ready in a queue.", labels=["database", "queue"]
        )
        readers = GaugeMetricFamily(
            "brokerd_queue_readers",
            "RECEIVEs waiting on a queue and groups held by its readers.",
            labels=["database", "queue"],
        )
        aside = GaugeMetricFamily(
            "brokerd_quarantined_conversations",
            "Conversations of a queue set aside by poison-message handling.",
            labels=["database", "queue"],
        )
        status = GaugeMetricFamily(
            "brokerd_queue_enabled", "1 if the queue's status is on.", labels=["database", "queue"]
        )
        for row in s.views["queues"]:
            labels = [str(row["database"]), str(row["queue"])]
            depth.add_metric(labels, row["ready_messages"])
            readers.add_metric(labels, row["readers"])
            aside.add_metric(labels, row["quarantined_conversations"])
            status.add_metric(labels, 1 if row["status"] == "on" else 0)
        yield from (depth, readers, aside, status)

        tq = GaugeMetricFamily(
            "brokerd_transmission_queue_messages",
            "Messages sent and not yet acknowledged, by far broker instance.",
            labels=["peer"],
        )
        oldest = GaugeMetricFamily(
            "brokerd_transmission_queue_oldest_age_seconds",
            "How long the oldest unacknowledged message for a far broker has waited.",
            labels=["peer"],
        )
        for peer in s.peers():
            tq.add_metric([peer.peer], peer.messages)
            oldest.add_metric([peer.peer], peer.oldest_age)
        yield from (tq, oldest)
        yield _gauge(
            "brokerd_transmission_queue_depth",
            "Messages sent and not yet acknowledged, in all.",
            s.backlog.total,
        )

        conns = GaugeMetricFamily(
            "brokerd_broker_connections", "Connections to other brokers by state.", labels=["state"]
        )
        for state in ("handshake", "open", "closed"):
            conns.add_metric([state], s.connections_by_state().get(state, 0))
        yield conns
        yield _gauge("brokerd_client_connections", "Application connections.", s.client_connections)

        endpoints = GaugeMetricFamily(
            "brokerd_conversation_endpoints",
            "Conversation endpoints by database and state.",
            labels=["database", "state"],
        )
        for (database, state), n in sorted(s.endpoints_by_state().items()):
            endpoints.add_metric([database, state], n)
        yield endpoints

        latency = HistogramMetricFamily(
            "brokerd_commit_latency_seconds",
            "Duration of each group commit of a database file, BEGIN to COMMIT.",
            labels=["database"],
        )
        for database, histogram in sorted(s.commit_latency.items()):
            buckets = [(_bound(b), float(n)) for b, n in histogram.cumulative()]
            latency.add_metric([database], buckets, sum_value=histogram.total_seconds)
        yield latency


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=float(value))


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def render(snapshot: Snapshot) -> bytes:
    """The snapshot in Prometheus's text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(snapshot))
    return generate_latest(registry)
