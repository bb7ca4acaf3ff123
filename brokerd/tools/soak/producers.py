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
committed or refused after. Every SEND outside a transaction carries an idempotency
key (:func:`send_key`); one whose connection broke before its answer (its outcome
unknown) is sent again under the same key, on a new connection, before anything else
on its dialog and even after the faults stopped, until the daemon answers it
(SPEC §6: a key seen is answered with the first SEND's number, never queued twice):
so it is settled, committed or refused, and the checker requires it like any other
(``settled``). A client transaction whose connection broke is rolled back (refused,
``F``) unless its COMMIT was in flight: only such SENDs stay unknown
(``commits_unknown``), with those of a producer cancelled.

May import: ``brokerd.sdk``, ``protocol.errors``, :mod:`.topology`, :mod:`.records`,
:mod:`.clients`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from brokerd.sdk.client import BrokerClient
from brokerd.tools.soak import topology
from brokerd.tools.soak.clients import Clients
from brokerd.tools.soak.records import LOCAL_STREAM, Ledger, make_body
from protocol.errors import (
    BrokerStopping,
    ClientError,
    NotPrincipal,
    RemoteError,
    TransactionLost,
)

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


def send_key(key: str, index: int) -> str:
    """The idempotency key of message ``index`` of dialog ``key`` (SPEC §6: unique per
    conversation, and each dialog of the soak has its own key)."""
    return f"{key}/{index}"


@dataclass(frozen=True)
class Unsettled:
    """SENDs of one dialog whose outcome is unknown (the connection broke before their
    answer), in SEND order, with their bodies: sent again under the same idempotency keys
    until each is committed or refused (:meth:`Producers._settle`)."""

    handle: uuid.UUID
    batch: list[tuple[str, int]]
    bodies: list[bytes]


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
        self.settled = 0
        """SENDs of unknown outcome settled by sending them again under their keys."""
        self.commits_unknown = 0
        """SENDs of client transactions whose COMMIT's outcome is unknown (they carry no
        idempotency key): the only SENDs left unknown, but for a producer cancelled."""
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
    ) -> Unsettled | None:
        """SEND ``bodies`` on one dialog as ``mode`` says (``send``: one SEND, ``many``:
        one ``send_many``, ``tx``: a client transaction, ``pipelined``: see
        :meth:`_pipelined`), and write down the outcome: committed (``C``) or refused
        (``F``, the error raised). Every SEND but a transaction's carries its idempotency
        key (:func:`send_key`): those whose connection broke before their answer are
        returned, to be settled by :meth:`_settle`. A transaction whose connection broke
        is rolled back (``F``) unless its COMMIT was in flight: then its SENDs stay
        unknown (no key in a transaction, SPEC §6; counted in ``commits_unknown``); the
        ClientError is raised either way."""
        if mode == "pipelined":
            return await self._pipelined(client, handle, batch, bodies, ledger)
        keys = [send_key(k, i) for k, i in batch]
        committing = False
        try:
            if mode == "send":
                await client.send(handle, "DEFAULT", bodies[0], key=keys[0])
            elif mode == "many":
                await client.send_many([(handle, "DEFAULT", b) for b in bodies], list(keys))
            else:
                async with client.transaction() as tx:
                    for body in bodies:
                        await tx.send(handle, "DEFAULT", body)
                    committing = True  # the COMMIT is asked for as the block ends
        except RemoteError:
            ledger.write([f"F {k} {i}" for k, i in batch])
            raise
        except ClientError as exc:
            if mode != "tx":
                return Unsettled(handle, batch, bodies)
            if committing and not isinstance(exc, TransactionLost):
                self.commits_unknown += len(batch)  # no key can tell: they stay unknown
            else:  # the COMMIT was not asked for, or not executed: rolled back
                ledger.write([f"F {k} {i}" for k, i in batch])
            raise
        ledger.write([f"C {k} {i}" for k, i in batch])
        self.committed += len(batch)
        return None

    async def _settle(
        self, client: BrokerClient, unsettled: Unsettled, ledger: Ledger
    ) -> Unsettled | None:
        """Send again, in order and under the same idempotency keys, the SENDs of
        ``unsettled`` (SPEC §6: the daemon commits a key once and answers a SEND of a
        key it has seen with the first one's number), and write down their outcome; those
        still unknown are returned. A refusal that says the SEND was not executed there
        (``NotPrincipal``: a mirror; ``BrokerStopping``) says nothing of the first one:
        such a SEND stays unknown, to be sent again elsewhere or later."""
        left = await self._pipelined(
            client, unsettled.handle, unsettled.batch, unsettled.bodies, ledger, settling=True
        )
        self.settled += len(unsettled.batch) - (len(left.batch) if left else 0)
        return left

    async def _producer(self, direction: str, slot: int, clients: Clients) -> None:
        daemon, from_service, to_service = DIRECTIONS[direction]
        ledger = Ledger(self._ledgers / f"sent-{direction}{slot}.log", sync=False)
        rng = random.Random(f"{self._settings.seed}/{direction}/{slot}")
        generation = 0
        handle = None
        index = 0
        key = ""
        unsettled: Unsettled | None = None
        """SENDs of unknown outcome, settled before anything else is sent on the dialog
        (so that its order stays the order of the SENDs), even once told to stop."""
        try:
            while unsettled is not None or not self.stop_producing.is_set():
                client = await self._producer_client(clients, daemon, unsettled is not None)
                if client is None:
                    continue
                try:
                    if unsettled is not None:
                        unsettled = await self._settle(client, unsettled, ledger)
                    else:
                        if handle is None:
                            dialog = await client.begin_dialog(
                                from_service, to_service, database=None
                            )
                            handle = dialog.handle
                            generation += 1
                            key, index = f"{direction}{slot}.{generation}", 0
                        count = 1 if rng.random() < 0.6 else rng.randint(2, 5)
                        mode = "send" if count == 1 else rng.choice(("many", "tx"))
                        first, index = index, index + count  # never reused, even if it fails
                        unsettled = await self._send_batch(
                            client, handle, mode, key, first, count, self._sizes, rng, ledger
                        )
                    if unsettled is not None:  # the connection broke: settle on the next
                        await clients.drop(daemon, client, moved=True)
                        await asyncio.sleep(0.1)
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
                    handle, unsettled = None, None  # start a new dialog
                await asyncio.sleep(rng.uniform(0, 0.01))
        finally:
            ledger.close()

    async def _producer_client(
        self, clients: Clients, daemon: str, settling: bool
    ) -> BrokerClient | None:
        """The client a producer sends with next, or None after a pause: the backlog is
        over ``max_backlog`` (unless ``settling``: SENDs already made are settled whatever
        the backlog), or ``daemon`` cannot be reached now."""
        if not settling and self.committed - self.received > self._settings.max_backlog:
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
    ) -> Unsettled | None:
        """Messages ``index .. index + count - 1`` of dialog ``key``: written down as tried
        (``T``), then sent as ``mode`` says (:meth:`_send`, whose SENDs of unknown outcome
        it returns). ``sizes`` draws their sizes, ``rng`` their bodies."""
        batch = [(key, index + n) for n in range(count)]
        bodies = [make_body(k, i, self._size(sizes), rng) for k, i in batch]
        ledger.write([f"T {k} {i}" for k, i in batch])
        return await self._send(client, handle, mode, batch, bodies, ledger)

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
        unsettled: Unsettled | None = None
        """As the remote producers': settled first, even once told to stop."""
        try:
            while unsettled is not None or not self.stop_producing.is_set():
                client = await self._producer_client(clients, "a", unsettled is not None)
                if client is None:
                    continue
                try:
                    if unsettled is not None:
                        unsettled = await self._settle(client, unsettled, ledger)
                    else:
                        if handle is None or left <= 0:
                            dialog = await client.begin_dialog(
                                topology.SERVICE_L1,
                                topology.SERVICE_L2,
                                database=topology.DATABASE_LOCAL,
                            )
                            handle = dialog.handle
                            generation += 1
                            key, index = f"{stream}.{generation}", 0
                            left = rng.randint(20, 400)  # then a new dialog: a first message
                        roll = rng.random()
                        mode = "send" if roll < 0.35 else "pipelined" if roll < 0.85 else "many"
                        count = 1 if mode == "send" else rng.randint(2, 8)
                        if mode == "many" and rng.random() < 0.5:
                            mode = "tx"
                        left -= count
                        first, index = index, index + count  # never reused, even if it fails
                        unsettled = await self._send_batch(
                            client, handle, mode, key, first, count, rng, rng, ledger
                        )
                    if unsettled is not None:  # the connection broke: settle on the next
                        await clients.drop("a", client)
                        await asyncio.sleep(0.1)
                except ClientError:
                    await clients.drop("a", client)
                    await asyncio.sleep(0.1)
                except RemoteError as exc:
                    self._error(f"{stream}: {type(exc).__name__}: {exc}")
                    handle, unsettled = None, None  # start a new dialog
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
        *,
        settling: bool = False,
    ) -> Unsettled | None:
        """SEND ``bodies`` on one dialog without waiting between them (``send_nowait``, each
        with its idempotency key), and write down each one's outcome: committed (``C``) or
        refused (``F``). Returns those whose outcome is unknown (the connection broke
        first; ``settling``: also those a retry found not executed, see :meth:`_settle`).
        Raises the first refusal after all are answered (then the unknown ones beside it
        stay unknown: the dialog is given up)."""
        futures: list[asyncio.Future[int]] = []
        with contextlib.suppress(ClientError):  # the rest were never sent: unknown
            for (k, i), body in zip(batch, bodies, strict=True):
                futures.append(client.send_nowait(handle, "DEFAULT", body, key=send_key(k, i)))
        answered = await asyncio.gather(*futures, return_exceptions=True)
        outcomes: list[int | BaseException | None] = [*answered]
        outcomes += [None] * (len(batch) - len(outcomes))
        lines: list[str] = []
        unknown: list[int] = []
        raised: BaseException | None = None
        """The first refusal, or a failure that is no answer of the broker's (a bug)."""
        for n, ((k, i), outcome) in enumerate(zip(batch, outcomes, strict=True)):
            if isinstance(outcome, int):
                lines.append(f"C {k} {i}")
                self.committed += 1
            elif settling and isinstance(outcome, (NotPrincipal, BrokerStopping)):
                unknown.append(n)
            elif isinstance(outcome, RemoteError):
                lines.append(f"F {k} {i}")
                raised = raised or outcome
            elif outcome is None or isinstance(outcome, ClientError):
                unknown.append(n)
            else:
                raised = raised or outcome
        ledger.write(lines)
        if raised is not None:
            raise raised
        if not unknown:
            return None
        return Unsettled(handle, [batch[n] for n in unknown], [bodies[n] for n in unknown])


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
