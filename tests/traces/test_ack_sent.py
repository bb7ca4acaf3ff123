"""``ack_sent`` (docs/traces.md) says an acknowledgement was given to a connection to send:
an acknowledgement owed while no connection to its peer is open is not traced as sent
(the peer retransmits, and is acknowledged then). The receiving broker runs in the test's
process; a hostile broker plays the shop's, so that the test says when its connection
closes."""

from __future__ import annotations

import uuid
from pathlib import Path

from brokerd.tools import example
from brokerd.traces.writer import read_events, segment_files
from tests.daemons import FAST_RETRY, in_process, wait_until
from tests.hostile import HostileBroker, order_message

SHOP_HOST, WAREHOUSE_HOST = "127.0.16.6", "127.0.16.7"


async def test_an_acknowledgement_owed_on_a_closed_connection_is_not_traced_as_sent(
    tmp_path: Path,
) -> None:
    """R-TRACE-1, R-DLG-5: a message is stored, then its connection closes before the
    acknowledgement is due (``retry.ack_delay``): no ``ack_sent`` for it. A message of
    another dialog arriving on another connection meanwhile is acknowledged, by the same
    flush or a later one, and traced."""
    retry = {**FAST_RETRY, "ack_delay": 1.0}
    deployment = example.shop_and_warehouse(tmp_path, retry, hosts=(SHOP_HOST, WAREHOUSE_HOST))
    async with in_process(deployment.daemons["beta"].config_path) as beta:
        shop = uuid.uuid4()
        lost, kept = uuid.uuid4(), uuid.uuid4()
        first = HostileBroker(deployment.cert_dir)
        await first.connect(WAREHOUSE_HOST)
        try:
            await first.send_fragments([order_message(shop, lost, 1, b"<order id='1'/>")])

            async def stored() -> bool:
                return beta.engine.stats.delivered_messages >= 1

            await wait_until(stored, timeout=10.0)
        finally:
            await first.close()
        (ep,) = beta.databases["warehouse"].endpoints.values()

        async def closed() -> bool:
            return ep.last_link is not None and not ep.last_link.is_open

        await wait_until(closed, timeout=10.0)
        assert beta.engine.stats.acks_sent == 0  # its acknowledgement is not due yet
        second = HostileBroker(deployment.cert_dir)
        await second.connect(WAREHOUSE_HOST)
        try:
            await second.send_fragments([order_message(shop, kept, 1, b"<order id='2'/>")])

            async def acknowledged() -> bool:  # by the flush due for the first, or after it
                return beta.engine.stats.acks_sent >= 1

            await wait_until(acknowledged, timeout=10.0)
        finally:
            await second.close()
        await beta.trace.flush()
        sent = [
            e["conversation_id"]
            for e in read_events(segment_files([beta.trace.config.directory]))
            if e.get("event") == "ack_sent"
        ]
        assert sent == [str(kept)], sent
        assert ep.ack_version > ep.ack_sent_version  # still owed: given to no connection
