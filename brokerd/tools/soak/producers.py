"""The soak's load: the producers that SEND, and how their end is bounded.

Producers send over long-lived dialogs in both directions (A to B and B to A,
through F): single SENDs, ``send_many`` batches and client transactions of several
SENDs, a few bodies of 100-300 KiB (several fragments). They pause while too many
committed messages wait to be received, so the drain stays bounded. The producers
from B and B's consumer follow B's principal (:mod:`.follow`). When the faults stop,
each producer finishes the SENDs it has in flight; one still waiting after
``drain_timeout`` (a SEND that never returns) is cancelled and reported
(``stuck_producers``, an error, and the run is not clean), so a broker that hangs
still gets a verdict (:func:`stop_producers`).

The local stream (``local_dialogs``, 0: none): dialogs between two services of one
database of A (``//soak/L1`` to ``//soak/L2`` in ``SoakLocal``, :mod:`.topology`).
Its producers SEND mostly outside transactions, one at a time or pipelined
(``send_nowait``, several in flight on a dialog), so after a dialog's first message
they go straight into the target queue (direct delivery, R-DLG-13); a few
``send_many`` batches and client transactions take the transmission queue between
them. A producer moves to a new dialog now and then, so dialogs' first messages keep
coming. Consumers of both local queues (``l2``, and ``l1`` for the replies, which
the consumer sends in its transaction, through the transmission queue) are killed
and stalled like the others, and A is killed like every daemon. The checker judges
the local stream with the others; the summary gives its counts apart (``local``),
with how many of its messages A's traces show delivered directly (:mod:`.delivery`).

Every SEND is written down in the producer's ledger (:mod:`.records`): tried before,
committed or refused after.

May import: ``brokerd.sdk``, ``protocol.errors``, :mod:`.topology`, :mod:`.records`,
:mod:`.clients`.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from brokerd.sdk.client import BrokerClient
from brokerd.tools.soak import topology
from brokerd.tools.soak.clients import Clients
from brokerd.tools.soak.records import LOCAL_STREAM, Ledger, make_body
from protocol.errors import ClientError, NotPrincipal, RemoteError

DIRECTIONS = {
    "ab": ("a", topology.SERVICE_A, topology.SERVICE_B),
    "ba": ("b", topology.SERVICE_B, topology.SERVICE_A),
}
"""Producer direction: (sending daemon, from service, to service)."""


class LoadSettings(Protocol):
    """What the producers read of the soak's ``Settings``."""

    @property
    def seed(self) -> int: ...

    @property
    def dialogs(self) -> int: ...

    @property
    def local_dialogs(self) -> int: ...

    @property
    def large_fraction(self) -> float: ...

    @property
    def max_backlog(self) -> int: ...


class Producers:
    """The producers of a run, what they committed, and what the consumers received."""

    def __init__(
        self,
        settings: LoadSettings,
        ledgers: Path,
        sizes: random.Random,
        error: Callable[[str], None],
    ) -> None:
        self.committed = 0
        self.received = 0
        self.large = 0
        self.stop_producing = asyncio.Event()
        self._settings = settings
        self._ledgers = ledgers
        self._sizes = sizes
        """Draws the remote producers' body sizes (the soak's generator)."""
        self._error = error
        self._offsets: dict[Path, int] = {}

    def start(self, clients: Clients) -> list[asyncio.Task[None]]:
        """Start every producer: ``dialogs`` per direction, then the local stream's."""
        s = self._settings
        producers = [
            asyncio.create_task(self._producer(direction, slot, clients))
            for direction in DIRECTIONS
            for slot in range(s.dialogs)
        ]
        producers += [
            asyncio.create_task(self._local_producer(slot, clients))
            for slot in range(s.local_dialogs)
        ]
        return producers

    def tail(self) -> None:
        """Count the R lines the consumers appended since the last look (for back-pressure)."""
        for path in self._ledgers.glob("received-*.log"):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read()
            end = data.rfind(b"\n") + 1
            self._offsets[path] = offset + end
            self.received += data[:end].count(b"\nR ") + int(data.startswith(b"R "))

    def _size(self, rng: random.Random) -> int:
        """A body size: mostly up to 2,000 bytes, ``large_fraction`` of 100-300 KiB."""
        if rng.random() < self._settings.large_fraction:
            self.large += 1
            return rng.randint(100 * 1024, 300 * 1024)
        return rng.randint(0, 2000)

    async def _send(
        self,
        client: BrokerClient,
        handle: uuid.UUID,
        mode: str,
        batch: list[tuple[str, int]],
        bodies: list[bytes],
        ledger: Ledger,
    ) -> None:
        """SEND ``bodies`` on one dialog as ``mode`` says (``send``: one SEND, ``many``:
        one ``send_many``, ``tx``: a client transaction, ``pipelined``: see
        :meth:`_pipelined`), and write down the outcome: committed (``C``) or refused
        (``F``, the error raised); a broken connection leaves the outcome unknown."""
        if mode == "pipelined":
            await self._pipelined(client, handle, batch, bodies, ledger)
            return
        try:
            if mode == "send":
                await client.send(handle, "DEFAULT", bodies[0])
            elif mode == "many":
                await client.send_many([(handle, "DEFAULT", b) for b in bodies])
            else:
                async with client.transaction() as tx:
                    for body in bodies:
                        await tx.send(handle, "DEFAULT", body)
        except RemoteError:
            ledger.write([f"F {k} {i}" for k, i in batch])
            raise
        ledger.write([f"C {k} {i}" for k, i in batch])
        self.committed += len(batch)

    async def _producer(self, direction: str, slot: int, clients: Clients) -> None:
        daemon, from_service, to_service = DIRECTIONS[direction]
        ledger = Ledger(self._ledgers / f"sent-{direction}{slot}.log", sync=False)
        rng = random.Random(f"{self._settings.seed}/{direction}/{slot}")
        generation = 0
        handle = None
        index = 0
        key = ""
        try:
            while not self.stop_producing.is_set():
                client = await self._producer_client(clients, daemon)
                if client is None:
                    continue
                try:
                    if handle is None:
                        dialog = await client.begin_dialog(from_service, to_service, database=None)
                        handle = dialog.handle
                        generation += 1
                        key, index = f"{direction}{slot}.{generation}", 0
                    count = 1 if rng.random() < 0.6 else rng.randint(2, 5)
                    mode = "send" if count == 1 else rng.choice(("many", "tx"))
                    first, index = index, index + count  # never reused, even if it fails
                    await self._send_batch(
                        client, handle, mode, key, first, count, self._sizes, rng, ledger
                    )
                except ClientError:
                    await clients.drop(daemon, client, moved=True)
                    await asyncio.sleep(0.1)
                except NotPrincipal:
                    # R-ROUTE-10: this partner is the mirror now; the dialog lives on at
                    # the principal (R-ROUTE-16), so keep it and move there.
                    await clients.drop(daemon, client, moved=True)
                    await asyncio.sleep(0.1)
                except RemoteError as exc:
                    self._error(f"{direction}{slot}: {type(exc).__name__}: {exc}")
                    handle = None  # start a new dialog
                await asyncio.sleep(rng.uniform(0, 0.01))
        finally:
            ledger.close()

    async def _producer_client(self, clients: Clients, daemon: str) -> BrokerClient | None:
        """The client a producer sends with next, or None after a pause: the backlog is
        over ``max_backlog``, or ``daemon`` cannot be reached now."""
        if self.committed - self.received > self._settings.max_backlog:
            await asyncio.sleep(0.2)
            return None
        try:
            return await clients.get(daemon)
        except (ClientError, RemoteError, OSError):
            await asyncio.sleep(0.3)
            return None

    async def _send_batch(
        self,
        client: BrokerClient,
        handle: uuid.UUID,
        mode: str,
        key: str,
        index: int,
        count: int,
        sizes: random.Random,
        rng: random.Random,
        ledger: Ledger,
    ) -> None:
        """Messages ``index .. index + count - 1`` of dialog ``key``: written down as tried
        (``T``), then sent as ``mode`` says (:meth:`_send`). ``sizes`` draws their sizes,
        ``rng`` their bodies."""
        batch = [(key, index + n) for n in range(count)]
        bodies = [make_body(k, i, self._size(sizes), rng) for k, i in batch]
        ledger.write([f"T {k} {i}" for k, i in batch])
        await self._send(client, handle, mode, batch, bodies, ledger)

    async def _local_producer(self, slot: int, clients: Clients) -> None:
        """The local stream's producer ``slot``: dialogs from ``//soak/L1`` to ``//soak/L2``
        in A's ``SoakLocal``, mostly SENDs outside transactions (direct delivery after a
        dialog's first message, R-DLG-13), some pipelined, a few batched or transacted."""
        stream = f"{LOCAL_STREAM}{slot}"
        ledger = Ledger(self._ledgers / f"sent-{stream}.log", sync=False)
        rng = random.Random(f"{self._settings.seed}/{LOCAL_STREAM}/{slot}")
        generation = 0
        handle = None
        index = left = 0
        key = ""
        try:
            while not self.stop_producing.is_set():
                client = await self._producer_client(clients, "a")
                if client is None:
                    continue
                try:
                    if handle is None or left <= 0:
                        dialog = await client.begin_dialog(
                            topology.SERVICE_L1,
                            topology.SERVICE_L2,
                            database=topology.DATABASE_LOCAL,
                        )
                        handle = dialog.handle
                        generation += 1
                        key, index = f"{stream}.{generation}", 0
                        left = rng.randint(20, 400)  # then a new dialog: a first message again
                    roll = rng.random()
                    mode = "send" if roll < 0.35 else "pipelined" if roll < 0.85 else "many"
                    count = 1 if mode == "send" else rng.randint(2, 8)
                    if mode == "many" and rng.random() < 0.5:
                        mode = "tx"
                    left -= count
                    first, index = index, index + count  # never reused, even if it fails
                    await self._send_batch(
                        client, handle, mode, key, first, count, rng, rng, ledger
                    )
                except ClientError:
                    await clients.drop("a", client)
                    await asyncio.sleep(0.1)
                except RemoteError as exc:
                    self._error(f"{stream}: {type(exc).__name__}: {exc}")
                    handle = None  # start a new dialog
                await asyncio.sleep(rng.uniform(0, 0.01))
        finally:
            ledger.close()

    async def _pipelined(
        self,
        client: BrokerClient,
        handle: uuid.UUID,
        batch: list[tuple[str, int]],
        bodies: list[bytes],
        ledger: Ledger,
    ) -> None:
        """SEND ``bodies`` on one dialog without waiting between them (``send_nowait``), and
        write down each one's outcome: committed (``C``), refused (``F``), or unknown (the
        connection broke: no line). Raises the first error after all are answered."""
        futures: list[asyncio.Future[int]] = []
        first: BaseException | None = None
        try:
            for body in bodies:
                futures.append(client.send_nowait(handle, "DEFAULT", body))
        except ClientError as exc:
            first = exc  # the rest were never sent
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        lines: list[str] = []
        for (k, i), outcome in zip(batch, outcomes, strict=False):
            if isinstance(outcome, int):
                lines.append(f"C {k} {i}")
                self.committed += 1
            elif isinstance(outcome, RemoteError):
                lines.append(f"F {k} {i}")
            if isinstance(outcome, BaseException) and first is None:
                first = outcome
        ledger.write(lines)
        if first is not None:
            raise first


async def stop_producers(producers: list[asyncio.Task[None]], timeout: float) -> int:
    """Wait for the producers to end once told to stop (each finishes the SENDs it has in
    flight); cancel those still waiting after ``timeout`` seconds. A SEND that never
    returns is a fault of the broker (a commit held for ever, for instance): the run
    reports it and goes on to its drain and verdict instead of hanging. Returns how many
    were cancelled; a producer's own failure is raised, as before."""
    if not producers:
        return 0
    done, pending = await asyncio.wait(producers, timeout=timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        task.result()
    return len(pending)
