"""Order processing with brokerd: the complete example of the application guide
(``docs/guide.md``). Runnable as it is:

    .venv/bin/python examples/order_processing.py

It starts two brokers of its own in a temporary directory, a shop on 127.0.0.1:4022
and a warehouse on 127.0.0.2:4022 (client ports 127.0.0.x:4023), runs the story
below through the SDK, prints what happens, checks every outcome, and stops them.
``--workdir DIR`` keeps their files (databases, logs, traces) for a look afterwards.

The story (each part is a function below, in this order):

1. **Request and reply, with a large attachment.** The shop begins one dialog per
   order and SENDs the order, and for one of them a 3 MiB attachment, each with an
   idempotency key. The warehouse, served by activated readers, answers each order
   with a ``Shipped`` reply (the attachment's SHA-256 in it) and ends the dialog; the
   shop receives the reply and the EndDialog and ends its side.
2. **A timer and an error ending.** The warehouse puts an order for an unknown item
   on hold and answers nothing. The shop set a conversation timer when it sent the
   order; the DialogTimer arrives, and the shop ends the dialog WITH ERROR. The
   warehouse receives the Error and ends its side.
3. **A poison message, quarantined and released.** An order the warehouse cannot
   parse makes its handler raise: each time, the transaction rolls back and the order
   is back in the queue. After three rollbacks (``poison_rollbacks = 3``) only that
   conversation is quarantined, with the handler's error, while the other orders
   flow. The operator deploys a fix and releases it; it is handled once.
4. **Activation under load.** 300 orders, 20 ms of work each: the warehouse's readers
   grow from one towards ``max_readers`` while the orders wait, and go away when idle.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import os
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

from brokerd.sdk.client import BrokerClient, Dialog, ReceivedMessage, Transaction
from brokerd.sdk.views import QuarantinedConversation
from brokerd.tools.launcher import Deployment

SHOP, WAREHOUSE = "//shop/Purchasing", "//warehouse/Fulfilment"
CONTRACT = "//shop/FulfilmentContract"
ORDER, ATTACHMENT = "//shop/Order", "//shop/Attachment"
SHIPPED, ON_HOLD = "//warehouse/Shipped", "//warehouse/OnHold"
SHOP_QUEUE, ORDER_QUEUE = "ShopQueue", "OrderQueue"
NO_ANSWER = 5001
"""The error code the shop ends a dialog with when the warehouse did not answer in time."""


def database(name: str, queue: str, service: str, peer_service: str, peer_host: str) -> str:
    """One broker's database: the message types, the contract, a queue with
    poison-message quarantine after three rollbacks, a service and a route to the
    peer's service."""
    return f"""
[[database]]
name = "{name}"
[[database.message_type]]
name = "{ORDER}"
validation = "none"
[[database.message_type]]
name = "{ATTACHMENT}"
validation = "none"
[[database.message_type]]
name = "{SHIPPED}"
validation = "none"
[[database.message_type]]
name = "{ON_HOLD}"
validation = "none"
[[database.contract]]
name = "{CONTRACT}"
messages = [
    {{ message_type = "{ORDER}", sent_by = "initiator" }},
    {{ message_type = "{ATTACHMENT}", sent_by = "initiator" }},
    {{ message_type = "{SHIPPED}", sent_by = "target" }},
    {{ message_type = "{ON_HOLD}", sent_by = "target" }},
]
[[database.queue]]
name = "{queue}"
poison_message_handling = "quarantine"
poison_rollbacks = 3
[[database.service]]
name = "{service}"
queue = "{queue}"
contracts = ["{CONTRACT}"]
[[database.route]]
name = "To{peer_service.rsplit("/", 1)[-1]}"
remote_service_name = "{peer_service}"
address = "tcp://{peer_host}:4022"
"""


def deployment(root: Path) -> Deployment:
    """The shop and the warehouse, declared (``Deployment.start`` runs them)."""
    d = Deployment(root)
    d.add("shop", "127.0.0.1", database("shop", SHOP_QUEUE, SHOP, WAREHOUSE, "127.0.0.2"))
    d.add(
        "warehouse", "127.0.0.2", database("warehouse", ORDER_QUEUE, WAREHOUSE, SHOP, "127.0.0.1")
    )
    return d


# -- the warehouse: a service whose handler runs in a transaction per batch ----------------


@dataclass
class Warehouse:
    """The warehouse's order handler. Every message of a batch is handled in the
    batch's transaction: the reply and the END CONVERSATION commit together with the
    RECEIVE, or nothing does."""

    stock: set[str] = field(default_factory=lambda: {"widget", "gadget", "sprocket"})
    strict: bool = True
    """Before the fix: an order that is not XML makes the handler raise."""
    attachments: dict[str, bytes] = field(default_factory=dict)
    """Attachments by conversation, until their order comes."""
    work: float = 0.0
    """Seconds each order takes (to show activation under load)."""
    shipped: int = 0

    async def handle(self, tx: Transaction, messages: list[ReceivedMessage]) -> None:
        for m in messages:
            key = str(m.conversation_handle)
            if m.is_error or m.is_end_dialog:  # the shop gave up, or is done
                await tx.end_conversation(m.conversation_handle)
            elif m.message_type_name == ATTACHMENT:
                self.attachments[key] = m.message_body
            elif m.message_type_name == ORDER:
                await self._order(tx, m, self.attachments.pop(key, b""))

    async def _order(self, tx: Transaction, m: ReceivedMessage, attachment: bytes) -> None:
        try:
            order = ET.fromstring(m.message_body)
        except ET.ParseError as exc:
            if self.strict:
                raise ValueError(f"order is not XML: {exc}") from exc
            reply = b"<on-hold reason='unreadable order: please send it again'/>"
            await tx.send(m.conversation_handle, ON_HOLD, reply)
            await tx.end_conversation(m.conversation_handle)
            return
        if self.work:
            await asyncio.sleep(self.work)
        item = order.get("item", "")
        if item not in self.stock:
            return  # on hold, silently: the shop's timer will notice
        digest = hashlib.sha256(attachment).hexdigest() if attachment else ""
        reply = f"<shipped order='{order.get('id')}' attachment='{digest}'/>".encode()
        await tx.send(m.conversation_handle, SHIPPED, reply)
        await tx.end_conversation(m.conversation_handle)
        self.shipped += 1


# -- the shop ------------------------------------------------------------------------------


@dataclass
class Shop:
    """The shop's side: what it ordered, and the answers that came back. ``service``
    orders from ``target`` and receives the answers on ``queue`` (the example's own
    names by default; ``brokerd demo`` passes the local cluster's)."""

    client: BrokerClient
    service: str = SHOP
    target: str = WAREHOUSE
    queue: str = SHOP_QUEUE
    replies: dict[Dialog, ReceivedMessage] = field(default_factory=dict)
    timed_out: set[Dialog] = field(default_factory=set)

    async def order(
        self, order_id: str, item: str, *, attachment: bytes = b"", answer_within: float = 0
    ) -> Dialog:
        """BEGIN DIALOG, then the attachment (if any) and the order, each SEND with an
        idempotency key so that the SDK can write it again after a lost connection.
        ``answer_within``: a conversation timer (R-DLG-11)."""
        dialog = await self.client.begin_dialog(self.service, self.target, CONTRACT)
        if attachment:
            await dialog.send(ATTACHMENT, attachment, key=f"{order_id}/attachment")
        body = f"<order id='{order_id}' item='{item}'/>".encode()
        await dialog.send(ORDER, body, key=f"{order_id}/order")
        if answer_within:
            await dialog.begin_timer(answer_within)
        return dialog

    async def answers(self, dialogs: list[Dialog], timeout: float = 60) -> None:
        """RECEIVE until each dialog is answered (a reply, or a timer that fired), ending
        each side as Service Broker wants: plainly after the warehouse's EndDialog,
        WITH ERROR when the timer fired first."""
        waiting = set(dialogs)
        deadline = time.monotonic() + timeout
        while waiting:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(waiting)} orders unanswered after {timeout} s")
            for m in await self.client.receive(self.queue, top=100, timeout=1):
                dialog = next((d for d in waiting if d == m.conversation_handle), None)
                if m.is_timer and dialog is not None:
                    await dialog.end(error_code=NO_ANSWER, description="no answer in time")
                    self.timed_out.add(dialog)
                    waiting.discard(dialog)
                elif m.is_end_dialog:
                    await self.client.end_conversation(m.conversation_handle)
                    if dialog is not None and dialog in self.replies:
                        waiting.discard(dialog)
                elif dialog is not None:
                    self.replies[dialog] = m


def say(text: str) -> None:
    print(text, flush=True)


# -- the story ----------------------------------------------------------------------------


async def request_and_reply(shop: Shop, warehouse: Warehouse) -> None:
    attachment = os.urandom(3 * 1024 * 1024)
    dialogs = [
        await shop.order("A-1", "widget", attachment=attachment),
        await shop.order("A-2", "gadget"),
    ]
    await shop.answers(dialogs)
    first = ET.fromstring(shop.replies[dialogs[0]].message_body)
    assert first.get("attachment") == hashlib.sha256(attachment).hexdigest()
    say(
        f"1. two orders shipped; the warehouse hashed the 3 MiB attachment as "
        f"{first.get('attachment', '')[:16]}..., the shop's own hash"
    )


async def timer_and_error(shop: Shop) -> None:
    late = await shop.order("B-1", "unobtainium", answer_within=2)
    started = time.monotonic()
    await shop.answers([late])
    assert late in shop.timed_out
    say(
        f"2. no answer for the unobtainium order: the shop's timer fired after "
        f"{time.monotonic() - started:.1f} s and it ended the dialog WITH ERROR {NO_ANSWER}"
    )


async def poison_quarantined_and_released(
    shop: Shop, warehouse: Warehouse, admins: Sequence[BrokerClient]
) -> None:
    """``admins``: a client of each broker the orders may reach (the quarantine is where
    the unreadable order landed)."""
    bad = await shop.client.begin_dialog(shop.service, shop.target, CONTRACT)
    await bad.send(ORDER, b"<order id='C-1' item='widget'", key="C-1/order")  # not XML
    good = [await shop.order(f"C-{n}", "sprocket") for n in range(2, 6)]
    await shop.answers(good)
    quarantined: list[tuple[BrokerClient, QuarantinedConversation]] = []
    while not quarantined:
        quarantined = [(admin, row) for admin in admins for row in await admin.quarantined()]
        await asyncio.sleep(0.1)
    ((admin, row),) = quarantined
    say(
        f"3. the unreadable order was rolled back {row.rollbacks} times and its conversation "
        f"quarantined ({row.last_error!r}); the four other orders shipped meanwhile"
    )
    warehouse.strict = False  # the fix: an unreadable order is put on hold, not raised on
    released = await admin.release_quarantine(row.conversation_handle)
    await shop.answers([bad])
    assert shop.replies[bad].message_type_name == ON_HOLD
    say(f"   after the fix the operator released it ({released} message): answered ON HOLD")


async def activation_under_load(
    shop: Shop, warehouse: Warehouse, readers: list[int], orders: int = 300
) -> None:
    warehouse.work = 0.02  # each order takes 20 ms: one reader would need 6 s for 300
    shipped = warehouse.shipped
    started = time.monotonic()
    dialogs = [await shop.order(f"D-{n}", "widget") for n in range(orders)]
    await shop.answers(dialogs, timeout=120)
    say(
        f"4. {warehouse.shipped - shipped} orders shipped in {time.monotonic() - started:.1f} s "
        f"by up to {max(readers)} activated readers"
    )


Step = Callable[[str], AbstractAsyncContextManager[None]]
"""Wraps each part of the story (``brokerd demo`` shows a live status line with it)."""


@contextlib.asynccontextmanager
async def _quietly(title: str) -> AsyncIterator[None]:
    yield


async def tell(
    shop: Shop,
    warehouses: Sequence[BrokerClient],
    *,
    orders: int = 300,
    step: Step = _quietly,
) -> Warehouse:
    """The whole story: ``shop`` orders; each client of ``warehouses`` serves the
    warehouse's queue with the one :class:`Warehouse` handler (activated readers, up to
    four per broker). Returns the handler (its ``shipped`` count)."""
    warehouse = Warehouse()
    stop = asyncio.Event()
    activations = [
        client.serve(ORDER_QUEUE, warehouse.handle, max_readers=4, top=10, interval=0.2, stop=stop)
        for client in warehouses
    ]
    serving = [asyncio.ensure_future(a.run()) for a in activations]
    readers: list[int] = []

    def now_reading() -> int:
        return sum(a.readers for a in activations)

    async def watch() -> None:
        while not stop.is_set():
            readers.append(now_reading())
            await asyncio.sleep(0.05)

    watching = asyncio.ensure_future(watch())
    try:
        async with step("request and reply, a 3 MiB attachment"):
            await request_and_reply(shop, warehouse)
        async with step("a timer and an error ending"):
            await timer_and_error(shop)
        async with step("a poison message, quarantined and released"):
            await poison_quarantined_and_released(shop, warehouse, warehouses)
        async with step(f"activation under load: {orders} orders"):
            await activation_under_load(shop, warehouse, readers, orders)
            quiet = time.monotonic() + 30
            while now_reading() > len(activations) and time.monotonic() < quiet:
                await asyncio.sleep(0.1)
        say(f"   idle again: {now_reading()} reader(s) left")
    finally:
        stop.set()
        await asyncio.gather(*serving, watching, return_exceptions=True)
    return warehouse


async def story(d: Deployment) -> None:
    shop_daemon, warehouse_daemon = d.daemons["shop"], d.daemons["warehouse"]
    async with (
        BrokerClient.connect(
            shop_daemon.client_host, shop_daemon.client_port, token_file=shop_daemon.token_file
        ) as shop_client,
        BrokerClient.connect(
            warehouse_daemon.client_host,
            warehouse_daemon.client_port,
            token_file=warehouse_daemon.token_file,
        ) as warehouse_client,
    ):
        await tell(Shop(shop_client), [warehouse_client])


def _without_traceback(record: logging.LogRecord) -> bool:
    record.exc_info = None
    record.exc_text = None
    return True


def quiet_logging() -> None:
    """Warnings only, and the handler's error in one line, without its traceback."""
    logging.basicConfig(format="   log: %(message)s", level=logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_without_traceback)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="keep the brokers' files here")
    args = parser.parse_args(argv)
    quiet_logging()
    with tempfile.TemporaryDirectory(prefix="brokerd-orders-") as tmp:
        root = args.workdir or Path(tmp)
        d = deployment(root)
        try:
            for name in ("shop", "warehouse"):
                d.start(name)
            asyncio.run(story(d))
        finally:
            d.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
