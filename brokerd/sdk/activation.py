"""Internal activation in the application: :class:`Activation` runs the readers of one
queue, as many as the queue needs, each handling batches in client transactions
(``BrokerClient.serve``; SPEC §6, **Decision** on activation).

Service Broker's queue monitor starts another activated reader when the queue is not
being drained: it has messages ready, no reader waits in a RECEIVE, and no RECEIVE
came back empty lately ("Understanding When Activation Occurs"). An application
cannot see the daemon's queue, so the SDK measures what its readers see: how long
the oldest message of each batch waited (``message_enqueue_time``). A reader is
added, one per :attr:`ReaderPolicy.interval`, up to ``max_readers``, while that wait
grows from one interval to the next and no RECEIVE of the interval came back empty;
a wait that grows is a queue its readers do not keep up with, and comparing two waits
measured against the same daemon clock cancels the skew between the two machines'
clocks. A reader whose RECEIVE comes back empty :attr:`ReaderPolicy.idle_receives`
times in a row goes away, down to one reader (to none with ``until_idle``, and then
:meth:`Activation.run` returns), as an activated stored procedure exits when its
WAITFOR RECEIVE times out.

Each batch: BEGIN TRANSACTION, RECEIVE up to ``top`` messages of one conversation
group, ``await handler(tx, messages)``, COMMIT; ROLLBACK if the handler raises (the
messages are back first in their group, and the daemon counts the rollback, with the
exception as its reason, for its poison-message handling). A raising handler is logged
and the reader goes on. A connection lost mid-batch (``TransactionLost``,
``OutcomeUnknown``) or a daemon away (``NotConnected``) is waited out: the client
reconnects by itself and the readers go on, also across a restart of the daemon.

May import: ``protocol`` and the SDK's own modules (not ``client``: the client is
handed in as a :class:`Reading`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

from brokerd.sdk.loops import unless_stopped
from brokerd.sdk.messages import ReceivedMessage
from brokerd.sdk.transaction import Transaction
from protocol.errors import (
    BrokerStopping,
    ClientError,
    NotConnected,
    OutcomeUnknown,
    QueueDisabled,
    RemoteError,
    TransactionLost,
    TransactionRolledBack,
)

log = logging.getLogger("brokerd.sdk.activation")

MAX_READERS = 16
"""The daemon's bound on open transactions per connection (docs/errors.md): one client's
readers at most."""

Handler = Callable[[Transaction, list[ReceivedMessage]], Awaitable[None]]
"""What ``serve`` calls with each batch: the transaction and the messages it received."""


class Reading(Protocol):
    """What an activation needs of the client: transactions, and whether it is closed."""

    @property
    def closed(self) -> bool: ...

    async def begin_transaction(self) -> Transaction: ...


@dataclass(frozen=True, slots=True)
class ReaderPolicy:
    """How an activation grows and shrinks its readers."""

    max_readers: int = 1
    """Readers at most (Service Broker's MAX_QUEUE_READERS)."""
    top: int = 100
    """Messages one RECEIVE takes at most (of one conversation group)."""
    timeout: float = 1.0
    """Seconds a reader's RECEIVE waits for a message (WAITFOR)."""
    interval: float = 1.0
    """Seconds between two decisions to add a reader (Service Broker's queue monitor
    decides "every few seconds")."""
    idle_receives: int = 3
    """Empty RECEIVEs in a row after which a reader goes away."""
    until_idle: bool = False
    """The last reader goes away too when idle, and ``run`` returns: a program started
    by external activation exits once the queue is drained."""
    retry_pause: float = 0.5
    """Seconds a reader waits after a failure that is not the handler's (the daemon
    away, the queue disabled) before it tries again."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_readers <= MAX_READERS:
            raise ValueError(
                f"max_readers must be 1 to {MAX_READERS} (each reader holds one of the "
                f"connection's {MAX_READERS} open transactions), not {self.max_readers}"
            )
        if self.top < 1 or self.idle_receives < 1:
            raise ValueError(f"need top and idle_receives >= 1: {self}")
        if self.timeout < 0 or self.interval <= 0 or self.retry_pause < 0:
            raise ValueError(f"need timeout >= 0, interval > 0, retry_pause >= 0: {self}")


class Monitor:
    """What the readers saw during the current interval, and the decision it makes at its
    end: add a reader when the longest wait of a batch's oldest message grew by more than
    ``margin`` seconds since the last interval that received, and no RECEIVE came back
    empty (the queue is not being drained). An empty RECEIVE forgets the last wait: the
    queue was drained, the next wait is measured afresh."""

    def __init__(self, margin: float) -> None:
        self.margin = margin
        """How much the wait must grow: jitter of a few milliseconds is no trend."""
        self.oldest_wait: float | None = None
        """The longest wait of a batch's oldest message in this interval (seconds)."""
        self.previous_wait: float | None = None
        self.empty = False
        """A RECEIVE of this interval came back empty."""

    def batch(self, messages: list[ReceivedMessage]) -> None:
        wait = time.time() - min(m.message_enqueue_time for m in messages)
        if self.oldest_wait is None or wait > self.oldest_wait:
            self.oldest_wait = wait

    def empty_receive(self) -> None:
        self.empty = True

    def decide(self) -> bool:
        """End the interval: whether to add a reader."""
        wait, empty = self.oldest_wait, self.empty
        self.oldest_wait, self.empty = None, False
        if empty:
            self.previous_wait = None
            return False
        if wait is None:
            return False
        previous, self.previous_wait = self.previous_wait, wait
        # growth needs two waits measured against the same daemon clock: a first wait
        # alone is the application's clock less the daemon's, skew included
        return previous is not None and wait > previous + self.margin


class Activation:
    """The readers of one queue: started by :meth:`run` (or ``await activation``), added
    and released by the queue's need, stopped when ``stop`` is set. Its counters:
    ``handled`` (messages committed), ``batches``, ``failures`` (batches the handler
    raised on, rolled back) and ``peak_readers``."""

    def __init__(
        self,
        client: Reading,
        queue: str,
        handler: Handler,
        policy: ReaderPolicy,
        *,
        database: str | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.client = client
        self.queue = queue
        self.handler = handler
        self.policy = policy
        self.database = database
        self.stop = stop if stop is not None else asyncio.Event()
        self.monitor = Monitor(policy.interval / 10)
        self.handled = 0
        """Messages received in committed transactions."""
        self.batches = 0
        """Batches committed."""
        self.failures = 0
        """Batches rolled back because the handler raised."""
        self.peak_readers = 0
        """The most readers at once."""
        self._readers: set[asyncio.Task[None]] = set()
        self._active = 0
        self._fatal: BaseException | None = None
        self._running = False

    @property
    def readers(self) -> int:
        """Readers running now (one that decided to go away no longer counts)."""
        return self._active

    def __await__(self) -> Generator[Any, None, int]:
        return self.run().__await__()

    async def run(self) -> int:
        """Run the readers until ``stop`` is set (or, ``until_idle``, until the last one
        went away); returns how many messages were handled. An error no retry can
        mend (the queue does not exist, the token may not read it) stops every reader
        and is raised."""
        if self._running:
            raise RuntimeError("this activation is running already")
        self._running = True
        try:
            self._add_reader()
            while not self.stop.is_set() and self.readers and self._fatal is None:
                await self._tick()
                if self.monitor.decide() and self.readers < self.policy.max_readers:
                    self._add_reader()
                    log.info("queue %s: reader added (%d now)", self.queue, self.readers)
        finally:
            self.stop.set()
            readers = list(self._readers)
            if readers:
                await asyncio.gather(*readers, return_exceptions=True)
            self._running = False
        if self._fatal is not None:
            raise self._fatal
        return self.handled

    async def _tick(self) -> None:
        """One interval, cut short by ``stop`` or by the last reader going away."""
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self.stop.wait())]
        waits += list(self._readers)
        try:
            await asyncio.wait(
                waits, timeout=self.policy.interval, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waits[0].cancel()

    def _add_reader(self) -> None:
        self._active += 1
        task = asyncio.get_running_loop().create_task(self._reader())
        self._readers.add(task)
        task.add_done_callback(self._readers.discard)
        self.peak_readers = max(self.peak_readers, self.readers)

    async def _reader(self) -> None:
        try:
            await self._read()
        except Exception as exc:  # raised by ``run``, not lost with the reader's task
            if self._fatal is None:
                self._fatal = exc
            self.stop.set()
        finally:
            self._active -= 1

    def _may_leave(self) -> bool:
        return self.policy.until_idle or self.readers > 1

    async def _read(self) -> None:
        """One reader: batches until ``stop``, or until it has been idle long enough."""
        empties = 0
        while not self.stop.is_set():
            try:
                received = await self._batch()
            except (TransactionLost, OutcomeUnknown) as exc:
                if self.client.closed:
                    return
                log.info("queue %s: batch lost with the connection (%s)", self.queue, exc)
                await self._pause()
                continue
            except NotConnected as exc:
                if self.client.closed:
                    return
                # no daemon for Reconnect.give_up_after: as idle as an empty RECEIVE (an
                # activated program whose daemon is gone exits in the end)
                log.warning("queue %s: %s", self.queue, exc)
                empties += 1
                if empties >= self.policy.idle_receives and self._may_leave():
                    return
                await self._pause()
                continue
            except TransactionRolledBack as exc:
                log.warning("queue %s: COMMIT refused, nothing took effect (%s)", self.queue, exc)
                continue
            except RemoteError as exc:
                if not exc.retriable:
                    self._fatal = exc
                    self.stop.set()
                    return
                log.warning("queue %s: %s; trying again", self.queue, exc)
                if isinstance(exc, QueueDisabled | BrokerStopping):
                    # nothing is received while the queue is off, nor from a daemon that
                    # stopped under a client that does not reconnect: as idle as an empty
                    # RECEIVE (``until_idle`` returns in the end)
                    empties += 1
                    if empties >= self.policy.idle_receives and self._may_leave():
                        return
                await self._pause()
                continue
            except ClientError:
                if self.client.closed:
                    return
                raise
            if received:
                empties = 0
                continue
            empties += 1
            if empties >= self.policy.idle_receives and self._may_leave():
                return

    async def _pause(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), self.policy.retry_pause)

    async def _begin(self) -> Transaction | None:
        """BEGIN TRANSACTION, or None when ``stop`` is set first: with the daemon away the
        begin waits for a connection (up to ``Reconnect.give_up_after``), and a stop does
        not wait for it. A begin given up is rolled back if it was written
        (``transaction.begin``)."""
        return await unless_stopped(self.client.begin_transaction(), self.stop)

    async def _batch(self) -> int:
        """One transaction: RECEIVE, the handler, COMMIT (or ROLLBACK if it raised).
        Returns how many messages it received (0: the RECEIVE came back empty, or
        ``stop`` was set before the transaction began)."""
        tx = await self._begin()
        if tx is None:
            return 0
        try:
            messages = await tx.receive(
                self.queue, database=self.database, top=self.policy.top, timeout=self.policy.timeout
            )
        except BaseException:
            await _end_quietly(tx)
            raise
        if not messages:
            self.monitor.empty_receive()
            await tx.rollback()  # it holds nothing: ending it costs no commit
            return 0
        self.monitor.batch(messages)
        try:
            await self.handler(tx, messages)
        except (TransactionLost, OutcomeUnknown):
            raise
        except Exception as exc:
            self.failures += 1
            log.exception(
                "queue %s: the handler raised on %d message(s) of group %s; rolled back",
                self.queue,
                len(messages),
                messages[0].conversation_group_id,
            )
            await roll_back(tx, exc)
            return len(messages)
        except BaseException:
            await _end_quietly(tx)
            raise
        if not tx.finished:
            await tx.commit()
        elif not tx.committed:  # the handler rolled the batch back itself
            return len(messages)
        self.handled += len(messages)
        self.batches += 1
        return len(messages)


async def roll_back(tx: Transaction, failure: BaseException) -> None:
    """ROLLBACK after the handler raised ``failure``, whose type and text are the
    rollback's reason: the daemon counts the rollback against each message of the batch
    for its poison-message handling and keeps the reason as their last error (SPEC §6).
    A rollback whose connection went is done already, and so is a transaction the
    handler ended itself before it raised."""
    if tx.finished:
        return
    with contextlib.suppress(TransactionLost, OutcomeUnknown):
        await tx.rollback(reason=f"{type(failure).__name__}: {failure}")


async def _end_quietly(tx: Transaction) -> None:
    """ROLLBACK on the way out of an error: its own failure would hide the first."""
    if tx.finished:
        return
    with contextlib.suppress(ClientError):
        await tx.rollback()
