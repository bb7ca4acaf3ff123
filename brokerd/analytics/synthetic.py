"""Synthetic trace sets of any size with known figures, for tests and benchmarks.

:func:`generate` simulates a deployment of six instances: two clients sending orders
to a warehouse service load-balanced over ``store-1`` and ``store-2``, and billing
dialogs forwarded through ``hub`` to ``ledger``. Each conversation is a whole
dialog: BEGIN, optionally DELAYED first, a few orders, a reply, END on both sides.
The plan injects faults at fixed intervals (a lost fragment, a corrupted one, a
lost acknowledgement), leaves some conversations open with a message that cannot
be delivered, and can inject the three kinds of audit violation. Events are
written by the daemon's own :class:`brokerd.traces.writer.TraceWriter` (same format,
same segment rotation) with a simulated clock, and the :class:`Truth` returned
says what any analysis must find.

    python -m brokerd.analytics.synthetic --events 5000000 --out /tmp/traces5m
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from brokerd.config import TraceConfig
from brokerd.traces.names import CLOSED_SUFFIX
from brokerd.traces.writer import TraceWriter, segment_files

CLIENTS = ("client-1", "client-2")
STORES = ("store-1", "store-2")
INSTANCES = (*CLIENTS, "hub", *STORES, "ledger")
ADDRESSES = {name: f"tcp://127.0.10.{n}:4022" for n, name in enumerate(INSTANCES, start=1)}
ORDERS = ("//shop/Client", "//warehouse/Orders", "WarehouseA", "WarehouseB")
BILLING = ("//shop/Billing", "//ledger/Invoices", "ViaHub", "Ledger")
START = 1_795_000_000.0
"""2026-11-18T09:46:40Z: the simulated clock's start."""
RETRY_INITIAL = 0.5


@dataclass
class Plan:
    conversations: int = 100
    orders: int = 8
    """Messages the initiator sends before END CONVERSATION."""
    billing_every: int = 4
    """Every n-th conversation is a billing dialog, forwarded through ``hub``."""
    seconds: float = 60.0
    """Simulated time over which the conversations begin."""
    lost_fragment_every: int = 97
    corrupt_every: int = 89
    lost_ack_every: int = 83
    """Every n-th message (counted over the whole set) meets this fault once."""
    delayed_every: int = 10
    open_every: int = 25
    """Every n-th conversation ends with a message that is never delivered."""
    violations: bool = False
    """Inject one lost message, one duplicate delivery and one out-of-order delivery."""
    torn_line: bool = True
    """Append a torn line (and one event of a future schema version) to a segment."""
    compact: bool = True
    """Compact every segment once written (torn one included), as the daemons' keeper does
    once a segment is closed (a crash's at the next start): the set a stopped deployment
    leaves. False: JSON Lines only."""
    segment_mb: int = 64
    segment_seconds: float = 300.0
    seed: int = 1


@dataclass
class Truth:
    """What the generated set contains."""

    events: int = 0
    messages_sent: int = 0
    messages_delivered: int = 0
    messages_received: int = 0
    retransmissions: int = 0
    duplicates: int = 0
    corrupted_messages: int = 0
    connections_refused: int = 0
    messages_waiting: int = 0
    messages_forwarded: int = 0
    open_endpoints: int = 0
    delayed_conversations: int = 0
    delayed_seconds: float = 0.0
    lines_skipped: int = 0
    other_versions: int = 0
    dialogs_per_store: Counter[str] = field(default_factory=Counter)
    messages_per_pair: Counter[tuple[str, str]] = field(default_factory=Counter)
    violations: set[tuple[str, str, bool, int]] = field(default_factory=set)
    """(kind, conversation_id, initiator, seq) of every injected audit violation."""
    waiting: list[tuple[str, bool, int]] = field(default_factory=list)
    """(conversation_id, initiator, seq) of every message left waiting."""


class _Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@dataclass
class _Conversation:
    cid: uuid.UUID
    client: str
    target: str
    via_hub: bool
    service: str
    far_service: str
    route: str
    reply_route: str
    delayed: float
    open: bool
    violation: str


class _Simulation:
    def __init__(self, out: Path, plan: Plan) -> None:
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self.clock = _Clock()
        self.truth = Truth()
        self._received: dict[tuple[uuid.UUID, bool], float] = {}
        """The time of each stream's last ``received`` event."""
        self.writers = {
            name: TraceWriter(
                TraceConfig(
                    directory=out / name,
                    segment_mb=plan.segment_mb,
                    segment_seconds=plan.segment_seconds,
                    flush_interval=3600.0,
                    durable=False,  # a generator: nothing to survive a crash
                    compress=False,  # compacted at the end, when Plan.compact says so
                ),
                name,
                clock=self.clock,
            )
            for name in INSTANCES
        }
        self.message_count = 0
        self._late: tuple[str, uuid.UUID, bool, int, str] | None = None

    def emit(
        self, instance: str, t: float, event: str, cid: uuid.UUID | None, **fields: object
    ) -> None:
        self.clock.now = t
        self.writers[instance].emit(event, cid, **fields)

    def leg(self) -> float:
        return self.rng.lognormvariate(-7.0, 0.6)  # about 1 ms

    # -- one message ---------------------------------------------------------------------

    def transfer(
        self,
        conv: _Conversation,
        initiator: bool,
        seq: int,
        t: float,
        message_type: str,
        size: int,
        *,
        stuck: bool = False,
    ) -> float:
        """One message from SEND to acknowledgement; returns the time it was delivered."""
        sender, receiver = (conv.client, conv.target) if initiator else (conv.target, conv.client)
        service, far = (
            (conv.service, conv.far_service) if initiator else (conv.far_service, conv.service)
        )
        database = "shop" if initiator else "backend"
        first_hop = "hub" if conv.via_hub else receiver
        route = conv.route if initiator else conv.reply_route
        address = ADDRESSES[first_hop]
        cid = conv.cid
        self.truth.messages_sent += 1
        self.truth.messages_per_pair[(service, far)] += 1
        self.emit(
            sender,
            t,
            "message_sent",
            cid,
            database=database,
            initiator=initiator,
            seq=seq,
            size=size,
            message_type=message_type,
            service=service,
            far_service=far,
        )
        t += 0.0002
        self.emit(
            sender,
            t,
            "enqueued",
            cid,
            database=database,
            initiator=initiator,
            seq=seq,
            size=size,
            fragments=1,
        )
        self.message_count += 1
        n = self.message_count
        fault = ""
        if stuck:
            fault = "stuck"
        elif n % self.plan.lost_fragment_every == 0:
            fault = "lost_fragment"
        elif n % self.plan.corrupt_every == 0:
            fault = "corrupt"
        elif n % self.plan.lost_ack_every == 0:
            fault = "lost_ack"
        attempt = 1
        delivered_t = -1.0

        def retransmit(t: float, wait: float, attempt: int) -> tuple[float, float, int]:
            """No acknowledgement within ``wait``: the next attempt, after twice the wait."""
            t += wait
            wait = min(wait * 2, 60.0)
            attempt += 1
            self.truth.retransmissions += 1
            self.emit(
                sender,
                t,
                "retransmission",
                cid,
                database=database,
                initiator=initiator,
                seq=seq,
                attempt=attempt,
                wait=wait,
                peer=address,
            )
            return t, wait, attempt

        forwarded = False
        wait = RETRY_INITIAL
        while True:
            t += 0.0001
            self.emit(
                sender,
                t,
                "fragment_sent",
                cid,
                database=database,
                initiator=initiator,
                seq=seq,
                fragment=0,
                fragments=1,
                size=size,
                attempt=attempt,
                peer=address,
                route=route,
            )
            failed = (fault in ("lost_fragment", "corrupt") and attempt == 1) or fault == "stuck"
            arrive = t + self.leg()
            if fault == "corrupt" and attempt == 1:
                self.emit(
                    first_hop,
                    arrive,
                    "corrupted_message",
                    None,
                    peer=f"{sender}@{address.removeprefix('tcp://')}",
                    reason="MD5 signature does not match",
                )
                self.truth.corrupted_messages += 1
            if failed:
                if fault == "stuck" and attempt == 3:
                    self.emit(
                        sender,
                        t + 0.001,
                        "connection_refused",
                        None,
                        peer=address,
                        reason=f"connection refused by {address.removeprefix('tcp://')}",
                    )
                    self.truth.connections_refused += 1
                    return -1.0
                t, wait, attempt = retransmit(t, wait, attempt)
                continue
            hop = None
            if conv.via_hub:
                self.emit(
                    "hub",
                    arrive,
                    "fragment_received",
                    cid,
                    initiator=initiator,
                    seq=seq,
                    fragment=0,
                    fragments=1,
                    size=size,
                    peer=f"{sender}@{address}",
                )
                arrive += 0.0003
                hop = 1
                self.emit(
                    "hub",
                    arrive,
                    "forwarded",
                    cid,
                    initiator=initiator,
                    seq=seq,
                    fragment=0,
                    size=size,
                    hop=1,
                    address=ADDRESSES[receiver],
                    route="Ledger" if initiator else "Shop",
                )
                if not forwarded:
                    forwarded = True
                    self.truth.messages_forwarded += 1
                arrive += self.leg()
            came_from = "hub" if conv.via_hub else sender
            peer = f"{came_from}@{ADDRESSES[came_from].removeprefix('tcp://')}"
            self.emit(
                receiver,
                arrive,
                "fragment_received",
                cid,
                initiator=initiator,
                seq=seq,
                fragment=0,
                fragments=1,
                size=size,
                hop=hop,
                peer=peer,
            )
            if initiator and seq == 1 and attempt == 1:
                self.emit(
                    receiver,
                    arrive,
                    "dialog_begun",
                    cid,
                    database="backend",
                    initiator=False,
                    service=conv.far_service,
                    far_service=conv.service,
                    contract="//shop/Contract",
                    peer=peer,
                )
            queue = "BackendQueue" if initiator else "ShopQueue"
            if delivered_t < 0:
                delivered_t = arrive + 0.0002
                skip = conv.violation == "lost" and initiator and seq == 2
                late = conv.violation == "out_of_order" and initiator and seq == 2
                if not skip and not late:
                    self.emit(
                        receiver,
                        delivered_t,
                        "delivered",
                        cid,
                        database="backend" if initiator else "shop",
                        initiator=initiator,
                        seq=seq,
                        queue=queue,
                    )
                if late:
                    self._late = (receiver, cid, initiator, seq, queue)
                if conv.violation == "duplicate" and initiator and seq == 3:
                    self.emit(
                        receiver,
                        delivered_t + 0.0001,
                        "delivered",
                        cid,
                        database="backend",
                        initiator=initiator,
                        seq=seq,
                        queue=queue,
                    )
                if conv.violation == "out_of_order" and initiator and seq == 3:
                    assert self._late is not None
                    r, c, i, s, q = self._late
                    self.emit(
                        r,
                        delivered_t + 0.0001,
                        "delivered",
                        c,
                        database="backend",
                        initiator=i,
                        seq=s,
                        queue=q,
                    )
                if not skip:
                    self.truth.messages_delivered += 1
            else:
                self.emit(
                    receiver,
                    arrive,
                    "duplicate",
                    cid,
                    database="backend" if initiator else "shop",
                    initiator=initiator,
                    seq=seq,
                    fragment=0,
                    peer=peer,
                )
                self.truth.duplicates += 1
            ack_t = arrive + 0.005
            self.emit(
                receiver,
                ack_t,
                "ack_sent",
                cid,
                database="backend" if initiator else "shop",
                initiator=initiator,
                through=seq,
                peer=peer,
            )
            if fault == "lost_ack" and attempt == 1:
                t, wait, attempt = retransmit(t, wait, attempt)
                continue
            back = ack_t + self.leg() + (self.leg() + 0.0003 if conv.via_hub else 0.0)
            self.emit(
                sender,
                back,
                "ack_received",
                cid,
                database=database,
                initiator=initiator,
                through=seq,
                acked=1,
                seqs=str(seq),
            )
            return delivered_t

    def receive(self, conv: _Conversation, initiator: bool, seq: int, delivered_t: float) -> None:
        receiver = conv.target if initiator else conv.client
        # The application receives a stream's messages in order (R-DLG-1).
        stream = (conv.cid, initiator)
        at = delivered_t + 0.002 + self.rng.random() * 0.01
        at = max(at, self._received.get(stream, 0.0) + 1e-6)
        self._received[stream] = at
        self.emit(
            receiver,
            at,
            "received",
            conv.cid,
            database="backend" if initiator else "shop",
            initiator=initiator,
            seq=seq,
            queue="BackendQueue" if initiator else "ShopQueue",
        )
        self.truth.messages_received += 1

    # -- one conversation ------------------------------------------------------------------

    def conversation(self, conv: _Conversation, t: float) -> None:
        cid = conv.cid
        self.emit(
            conv.client,
            t,
            "dialog_begun",
            cid,
            database="shop",
            initiator=True,
            service=conv.service,
            far_service=conv.far_service,
            contract="//shop/Contract",
        )
        if conv.delayed:
            self.emit(
                conv.client,
                t,
                "delayed",
                cid,
                database="shop",
                initiator=True,
                service=conv.far_service,
                reason=f"no route to service {conv.far_service!r}",
            )
            t += conv.delayed
            self.emit(conv.client, t, "released", cid, database="shop", initiator=True)
            self.truth.delayed_conversations += 1
            self.truth.delayed_seconds += conv.delayed
        first_hop = "hub" if conv.via_hub else conv.target
        self.emit(
            conv.client,
            t + 0.0001,
            "route_chosen",
            cid,
            database="shop",
            initiator=True,
            service=conv.far_service,
            decision="network",
            route=conv.route,
            step="R-ROUTE-4 step 5",
            address=ADDRESSES[first_hop],
        )
        if not conv.via_hub:
            self.truth.dialogs_per_store[ADDRESSES[conv.target]] += 1
        orders = self.plan.orders
        for seq in range(1, orders + 1):
            stuck = conv.open and seq == orders
            t += 0.001
            delivered = self.transfer(conv, True, seq, t, "//shop/Order", 200 + seq, stuck=stuck)
            if delivered < 0:
                self.truth.messages_waiting += 1
                self.truth.waiting.append((str(cid), True, seq))
                self.truth.open_endpoints += 2
                return
            t = max(t, delivered)
            left = conv.open and seq == orders - 1  # left in the queue: a pile-up
            if not left and not (conv.violation == "lost" and seq == 2):
                self.receive(conv, True, seq, delivered)
        back = "hub" if conv.via_hub else conv.client
        self.emit(
            conv.target,
            t + 0.0001,
            "route_chosen",
            cid,
            database="backend",
            initiator=False,
            service=conv.service,
            decision="network",
            route=conv.reply_route,
            step="R-ROUTE-4 step 5",
            address=ADDRESSES[back],
        )
        t += 0.002
        delivered = self.transfer(conv, False, 1, t, "//shop/Confirmation", 120)
        self.receive(conv, False, 1, delivered)
        t = delivered + 0.001
        delivered = self.transfer(
            conv, True, orders + 1, t, "http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog", 0
        )
        self.receive(conv, True, orders + 1, delivered)
        t = delivered + 0.001
        delivered = self.transfer(
            conv, False, 2, t, "http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog", 0
        )
        self.receive(conv, False, 2, delivered)
        self.emit(
            conv.target, delivered + 0.001, "dialog_ended", cid, database="backend", initiator=False
        )
        self.emit(
            conv.client, delivered + 0.003, "dialog_ended", cid, database="shop", initiator=True
        )

    async def run(self) -> Truth:
        plan = self.plan
        for writer in self.writers.values():
            await writer.start()
        violations = {}
        if plan.violations:
            violations = {3: "lost", 5: "duplicate", 7: "out_of_order"}
        spacing = plan.seconds / max(plan.conversations, 1)
        for i in range(plan.conversations):
            billing = plan.billing_every > 0 and i % plan.billing_every == plan.billing_every - 1
            service, far, route_a, route_b = BILLING if billing else ORDERS
            target = "ledger" if billing else STORES[i % 2]
            kind = violations.get(i, "")
            conv = _Conversation(
                cid=uuid.UUID(int=self.rng.getrandbits(128)),
                client=CLIENTS[i % 2 if billing else (i // 2) % 2],
                target=target,
                via_hub=billing,
                service=service,
                far_service=far,
                route=route_b if billing else (route_a if target == "store-1" else route_b),
                reply_route="Hub" if billing else "Shop",
                delayed=round(1.0 + (i % 7) * 0.5, 3)
                if plan.delayed_every
                and i % plan.delayed_every == plan.delayed_every - 1
                and not kind
                else 0.0,
                open=bool(plan.open_every)
                and i % plan.open_every == plan.open_every - 1
                and not kind,
                violation=kind,
            )
            if kind == "lost":  # acknowledged, never delivered, seq 3 was: a gap
                self.truth.violations.add(("gap", str(conv.cid), True, 2))
            elif kind == "duplicate":
                self.truth.violations.add(("duplicate", str(conv.cid), True, 3))
            elif kind == "out_of_order":
                self.truth.violations.add(("out_of_order", str(conv.cid), True, 2))
            self.conversation(conv, START + i * spacing)
            if i % 50 == 49:  # the writers rotate segments when they write
                for writer in self.writers.values():
                    await writer.flush()
        for writer in self.writers.values():
            await writer.stop()
            self.truth.events += writer.events_written
        if plan.torn_line:
            self._tear(self.writers["client-1"].directory)
        if plan.compact:
            for writer in self.writers.values():
                for path in sorted(writer.directory.glob(f"*{CLOSED_SUFFIX}")):
                    await asyncio.to_thread(writer.keeper.compact, path)
        return self.truth

    def _tear(self, directory: Path) -> None:
        """A crash's torn last line, and an event from a future schema version."""
        segment = sorted(directory.glob("*.jsonl"))[-1]
        with segment.open("a", encoding="utf-8") as f:
            f.write(
                '{"v":2,"instance":"client-1","ts":"2026-11-18T09:46:41.000000Z","event":"x"}\n'
            )
            f.write('{"v":1,"instance":"client-1","ts":"2026-11-18T09:4')
        self.truth.lines_skipped += 1
        self.truth.other_versions += 1


def generate(out: Path, plan: Plan | None = None) -> Truth:
    """Write a synthetic trace set under ``out`` (one directory per instance)."""
    return asyncio.run(_Simulation(out, plan or Plan()).run())


def plan_for_events(events: int, seed: int = 1) -> Plan:
    """A plan of about ``events`` events (about 100 per conversation)."""
    conversations = max(1, round(events / 100))
    return Plan(conversations=conversations, seconds=max(60.0, conversations / 100), seed=seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m brokerd.analytics.synthetic", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--events", type=int, default=1_000_000, help="about this many events")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--violations", action="store_true", help="inject audit violations")
    parser.add_argument(
        "--plain", action="store_true", help="leave the segments as JSON Lines (no compaction)"
    )
    args = parser.parse_args(argv)
    plan = plan_for_events(args.events, args.seed)
    plan.violations = args.violations
    plan.compact = not args.plain
    began = time.perf_counter()
    truth = generate(args.out, plan)
    took = time.perf_counter() - began
    size = sum(p.stat().st_size for p in segment_files([args.out]))
    print(
        f"wrote {truth.events:,} events ({size / 1e6:,.0f} MB, {plan.conversations:,} "
        f"conversations, {truth.messages_sent:,} messages) under {args.out} in {took:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
