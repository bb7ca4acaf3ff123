"""The receiving application: one process per queue, receiving with the SDK's
exactly-once loop :meth:`BrokerClient.consume` (SPEC R-DLG-1, §6).

For every batch, inside its transaction, it writes an ``R`` record per message to
its ledger (fsynced; a batch's name is unique across the consumer's lives, pid and a
random part), replies on some of them through the same transaction, writes
``P batch`` as its last step before the COMMIT is asked for, and after the COMMIT
returned writes ``K batch`` (fsynced). Now and then it raises
from its handler on purpose, so the batch rolls back, and writes ``A batch``.
The soak SIGKILLs and SIGSTOPs this process at any point, so a batch may be left
without its ``K`` or ``A`` line: the checker resolves it (see :mod:`.checker`).
With ``--partner-host`` the queue's database is a mirrored pair and the consumer
follows its principal (:mod:`.follow`): it moves to the other partner when the one
it uses breaks the connection or answers ``not_principal``.

    python -m brokerd.tools.soak consume --host 127.0.0.201 --token-file T \\
        --queue SoakQueueA --database SoakA --ledger received-a.log
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import random
import secrets
import signal
import uuid
from pathlib import Path

from brokerd.sdk.client import BrokerClient, ReceivedMessage, Transaction
from brokerd.tools.soak.follow import Follower
from brokerd.tools.soak.records import Ledger, make_body, parse_body
from protocol.errors import ClientError, NotPrincipal, RemoteError

REPLY = "~r"
"""Suffix of the key of a reply dialog direction: replies to ``key`` are ``key~r``."""


class _Rollback(Exception):
    """Raised by the handler to roll a batch back on purpose."""


def is_reply(key: str) -> bool:
    return key.endswith(REPLY)


def wants_reply(key: str, index: int, reply_every: int) -> bool:
    return reply_every > 0 and not is_reply(key) and index % reply_every == 0


class Consumer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ledger = Ledger(args.ledger, sync=True)
        self.rng = random.Random(f"{args.seed}/{os.getpid()}")
        self.stop = asyncio.Event()
        self.batches = 0
        self.life = f"{os.getpid()}-{secrets.token_hex(4)}"
        """Prefix of this process's batch names: the pid alone may be an earlier life's
        (pids wrap), and the checker tells batches apart by name only."""
        partners = [(args.host, args.port, args.token_file)]
        if args.partner_host:
            partners.append((args.partner_host, args.port, args.partner_token_file))
        epoch_file = args.ledger.with_suffix(".epoch") if args.partner_host else None
        self.follower = Follower(partners, args.database, epoch_file)

    async def _handle_batch(
        self, batch: str, tx: Transaction, messages: list[ReceivedMessage]
    ) -> None:
        lines: list[str] = []
        replies: list[tuple[uuid.UUID, str, bytes]] = []
        for m in messages:
            if m.is_end_dialog or m.is_error or m.is_timer:
                detail = m.message_body[:200].decode(errors="replace").replace("\n", " ")
                lines.append(f"X {batch} {m.message_type_name} {detail}")
                continue
            parsed = parse_body(m.message_body)
            if parsed is None:
                lines.append(f"X {batch} unparseable {len(m.message_body)}")
                continue
            lines.append(
                f"R {batch} {parsed.key} {parsed.index} {int(parsed.intact)} "
                f"{m.conversation_handle}"
            )
            if wants_reply(parsed.key, parsed.index, self.args.reply_every):
                body = make_body(
                    parsed.key + REPLY, parsed.index, self.rng.randint(8, 400), self.rng
                )
                replies.append((m.conversation_handle, "DEFAULT", body))
        self.ledger.write(lines)
        if replies:
            await tx.send_many(replies)
        if self.rng.random() < self.args.rollback_rate:
            raise _Rollback
        if self.rng.random() < 0.2:
            await asyncio.sleep(self.rng.uniform(0, 0.05))  # widen the window for a kill
        # The last thing before consume() asks for the COMMIT: a batch without this line
        # (and no K or A) never committed, so the checker expects its messages again.
        self.ledger.write([f"P {batch}"])

    async def run(self) -> None:
        while not self.stop.is_set():
            try:
                client = await self.follower.connect(timeout=5)
            except (ClientError, OSError):
                await asyncio.sleep(0.3)
                continue
            try:
                await self._loop(client)
            except (ClientError, NotPrincipal):
                if self.follower.mirrored:
                    self.follower.switch()  # R-ROUTE-10: try the other partner
                await asyncio.sleep(0.2)
            except RemoteError:
                await asyncio.sleep(0.2)
            finally:
                await client.close()

    async def _loop(self, client: BrokerClient) -> None:
        while not self.stop.is_set():
            self.batches += 1
            batch = f"{self.life}.{self.batches}"
            handler = functools.partial(self._handle_batch, batch)
            try:
                got = await client.consume(
                    self.args.queue,
                    handler,
                    database=self.args.database,
                    top=self.rng.choice((1, 10, 50, 100)),
                    timeout=0.5,
                    stop=self.stop,
                    batches=1,
                )
            except _Rollback:
                self.ledger.write([f"A {batch}"])
                continue
            if got:
                self.ledger.write([f"K {batch}"])


async def _main(args: argparse.Namespace) -> None:
    consumer = Consumer(args)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, consumer.stop.set)
    try:
        await consumer.run()
    finally:
        consumer.ledger.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=4023)
    parser.add_argument("--partner-host", help="the mirror partner of --host, if any")
    parser.add_argument("--partner-token-file", type=Path, help="its admin token")
    parser.add_argument("--token-file", required=True, type=Path)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--database", required=True)
    parser.add_argument("--ledger", required=True, type=Path)
    parser.add_argument("--reply-every", type=int, default=0)
    parser.add_argument("--rollback-rate", type=float, default=0.02)
    parser.add_argument("--seed", default="0")


def run(args: argparse.Namespace) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args))
    return 0
