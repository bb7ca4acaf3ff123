"""The SDK's connection to a daemon across the daemon's restarts: automatic reconnect
with backoff, and a clear outcome for every request (SPEC §6, outcomes).

A :class:`ConnectionKeeper` owns the current :class:`~brokerd.sdk.connection.Connection`.
When it is lost, each request left unanswered gets the outcome the SDK can vouch for:

* **not executed** (a daemon stopping gracefully said it never read it, or the socket
  went before the request was written): written again on the next connection, as if
  nothing had happened;
* **repeatable** (a read, or SENDs or a BEGIN DIALOG carrying idempotency keys): written
  again on the next connection; the daemon answers a repeated key with the first answer;
* a **client transaction**'s request: the daemon rolled the transaction back when the
  connection went, so it fails with :class:`TransactionLost` (a COMMIT that was
  written and not answered: :class:`OutcomeUnknown`; one not written is lost too);
* anything else: :class:`OutcomeUnknown` (it may or may not have taken effect).

Requests made while there is no connection wait for the next one, in order, for at
most :attr:`Reconnect.give_up_after` seconds (a timer: also while an attempt to connect
hangs); then they fail with :class:`NotConnected`: never sent, nothing happened. A
repeatable request kept from a connection lost before its answer that cannot be written
again fails with :class:`OutcomeUnknown` instead: it may have taken effect there.
A connection whose daemon said it stops may be replaced by a new one before it ends:
what it leaves is settled the same way, and written again on the new one.
Reconnecting waits
``initial`` seconds, doubling to ``maximum``, with jitter, as aio-pika's robust
connection and aiokafka's ``retry_backoff_ms`` do.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from brokerd.sdk.connection import Address, Connection, Ending, Request
from protocol.client_wire import MAX_META_BYTES
from protocol.errors import (
    AuthenticationFailed,
    BrokerStopping,
    ClientError,
    LocalProtocolError,
    MessageTooLarge,
    NotConnected,
    OutcomeUnknown,
    TransactionLost,
)


@dataclass(frozen=True, slots=True)
class Reconnect:
    """How a client reconnects after losing its connection."""

    initial: float = 0.1
    """Seconds before the first attempt; each failed attempt doubles the wait."""
    maximum: float = 5.0
    """The longest wait between attempts."""
    give_up_after: float = 60.0
    """How long a request waits for a connection before it fails with NotConnected."""

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum or self.give_up_after < 0:
            raise ValueError(f"Reconnect: need 0 < initial <= maximum, give_up_after >= 0: {self}")


@dataclass(slots=True)
class _Waiting:
    request: Request
    deadline: float


def _read_after(request_id: int, last_read: int) -> bool:
    """Whether request ``request_id`` was written after request ``last_read`` (0: none was
    read) on one connection, whose 32-bit ids wrap (serial number arithmetic)."""
    return last_read == 0 or 0 < (request_id - last_read) & 0xFFFFFFFF < 0x80000000


def _gone(request: Request, error: Exception) -> Exception:
    """How a request that goes no further fails: with ``error`` if it was never written,
    or written and not executed; with OutcomeUnknown if it was written on a connection
    lost before its answer (a repeatable request kept for the next connection), since
    it may have taken effect there."""
    if not request.maybe_executed:
        return error
    unknown = OutcomeUnknown(
        "the request was written on a connection lost before its answer and could not be "
        f"written again ({type(error).__name__}: {error}): it may or may not have taken effect"
    )
    unknown.__cause__ = error
    return unknown


class ConnectionKeeper:
    """The current connection, the requests waiting for one, and the reconnecting."""

    def __init__(self, address: Address, reconnect: Reconnect | None) -> None:
        self.address = address
        self.reconnect = reconnect
        self.connection: Connection | None = None
        self.generation = 0
        """Which connection this is (1 the first): a transaction is bound to one."""
        self.reconnects = 0
        """Connections made again after one was lost."""
        self.last_failure = ""
        """Why the last connection ended or the last attempt failed."""
        self.last_goodbye: BrokerStopping | None = None
        """The goodbye of the last connection lost, if its daemon was stopping: a request
        made after it closed is refused with it, not with a bare ``NotConnected``."""
        self.max_body: int | None = None
        """The longest request body the last daemon logged in to reads (its
        ``limits.max_message_size``): a longer one is refused here, before it is written,
        since the daemon would close the connection on it."""
        self.features: frozenset[str] = frozenset()
        """What the last daemon logged in to offers beyond the first client protocol (its
        login's ``features``)."""
        self._waiting: list[_Waiting] = []
        self._replaced: set[Connection] = set()
        """Connections replaced by a newer one before they ended (their daemon said it
        stops, and a new connection was made meanwhile): their end settles what they
        leave as the current one's would."""
        self._give_up: asyncio.TimerHandle | None = None
        """When the first request waiting for a connection gives up: on time, also while
        an attempt to connect takes long (up to ``timeout`` for each of its steps)."""
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def open(self) -> Connection:
        """The first connection; its failure is raised (nothing to retry yet)."""
        connection = Connection(self.address, self._ended)
        await connection.open()
        self._adopt(connection)
        return connection

    @property
    def connected(self) -> bool:
        return self.connection is not None and self.connection.usable

    @property
    def closed(self) -> bool:
        """:meth:`close` was called: no request goes out any more."""
        return self._closed

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Until a connection is up (TimeoutError after ``timeout`` s)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.connected:
            if self._closed:
                raise ClientError("client closed")
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no connection to {self.address} in {timeout} s")
            await asyncio.sleep(0.02)

    async def drain(self) -> None:
        """Until the socket has taken what was written down to its buffer's low-water mark:
        a producer that pipelines without awaiting each reply awaits it now and then, and
        holds no more than the kernel and the daemon take (asyncio's ``StreamWriter.drain``).
        Without a connection, until one is up and has taken what waited for it; raises
        NotConnected when none will come, or none came within
        :attr:`Reconnect.give_up_after` (as the requests that waited for it fail)."""
        deadline: float | None = None
        while True:
            connection = self.connection
            if connection is not None and connection.usable:
                deadline = None
                await connection.drain()
                if connection is self.connection and connection.usable:
                    return
                continue  # lost while it drained: what it carried is kept for the next one
            if self._closed or self.reconnect is None:
                raise NotConnected(f"not connected ({self.last_failure or 'closed'})")
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.reconnect.give_up_after
            elif now >= deadline:
                raise NotConnected(
                    f"no connection to brokerd at {self.address} within "
                    f"{self.reconnect.give_up_after} s ({self.last_failure})"
                )
            await asyncio.sleep(0.02)

    # -- requests ------------------------------------------------------------------------

    def reuse(self, body: bytearray) -> None:
        """A RECEIVE reply's large body whose messages have been copied out: the current
        connection reads the next one into it (``ClientFrameReader.reuse``)."""
        if self.connection is not None:
            self.connection.reader.reuse(body)

    def submit(self, request: Request) -> None:
        """Write ``request`` now, or keep it for the next connection; raises at once when
        it can never go (the client is closed, its transaction's connection is gone, or
        there is no connection and no reconnecting)."""
        if self._closed:
            raise NotConnected("client closed: the request was not sent")
        if len(request.meta) > MAX_META_BYTES:  # never writable: not kept for a connection
            raise LocalProtocolError(
                f"cannot encode: meta of {len(request.meta)} bytes exceeds the limit of "
                f"{MAX_META_BYTES}: not sent"
            )
        too_large = self._too_large(request)
        if too_large is not None:
            raise too_large
        connection = self.connection
        if request.bound_to is not None and (
            request.bound_to != self.generation or connection is None or connection.ended
        ):  # also without reconnecting: the transaction died with its connection
            raise TransactionLost(
                "the connection this transaction began on was lost; the daemon rolled "
                "the transaction back"
            )
        if connection is not None and connection.usable:
            connection.submit(request)
            return
        if request.bound_to is not None:  # its connection is going: the daemon stops
            raise TransactionLost(
                "the daemon is stopping; it rolls the transaction back as it closes"
            )
        if self.reconnect is None:
            if connection is not None and connection.stopping is not None:
                raise connection.stopping
            if connection is None and self.last_goodbye is not None:
                message = self.last_goodbye.remote_message
                raise BrokerStopping(message + " (not sent)", kind="BrokerStopping")
            raise NotConnected(f"not connected ({self.last_failure or 'closed'})")
        self._wait(request, time.monotonic())
        self._start_reconnecting()

    def _too_large(self, request: Request) -> MessageTooLarge | None:
        size = len(request.body)
        if self.max_body is None or size <= self.max_body:
            return None
        return MessageTooLarge(
            f"a request body of {size} bytes exceeds the daemon's limits.max_message_size "
            f"of {self.max_body} (a send_many's bodies count together): not sent"
        )

    def _wait(self, request: Request, since: float) -> None:
        assert self.reconnect is not None
        self._waiting.append(_Waiting(request, since + self.reconnect.give_up_after))
        self._arm_give_up()

    def _arm_give_up(self) -> None:
        if self._give_up is not None or not self._waiting or self._closed:
            return
        first = min(item.deadline for item in self._waiting)
        delay = max(0.0, first - time.monotonic())
        self._give_up = asyncio.get_running_loop().call_later(delay, self._gave_up)

    def _disarm_give_up(self) -> None:
        if self._give_up is not None:
            self._give_up.cancel()
            self._give_up = None

    def _gave_up(self) -> None:
        self._give_up = None
        self._give_up_expired()

    # -- losing a connection -------------------------------------------------------------

    def _ended(self, connection: Connection, ending: Ending) -> None:
        """``connection`` is gone: settle each request it leaves unanswered (also when a
        newer connection replaced it already: those written again go on that one)."""
        if connection is self.connection:
            self.connection = None
            self.last_failure = ending.reason
            self.last_goodbye = ending.stopping
        elif connection in self._replaced:
            self._replaced.discard(connection)
        else:  # one being opened: its login failed
            for _, request in ending.unanswered:
                if not request.reply.done():
                    request.reply.set_exception(ClientError(ending.reason))
            return
        now = time.monotonic()
        again: list[Request] = []
        for request_id, request in ending.unanswered:
            if request.reply.done():
                continue
            not_executed = request_id in ending.unwritten or (
                ending.last_read is not None and _read_after(request_id, ending.last_read)
            )
            failure = self._failure(request, not_executed, ending)
            if failure is None:
                if not not_executed:
                    request.maybe_executed = True
                again.append(request)
            else:
                request.reply.set_exception(failure)
        if self._closed or self.reconnect is None:
            return
        # what the lost connection left goes first, in the order it was written
        waiting, self._waiting = self._waiting, []
        for request in again:
            self._wait(request, now)
        self._waiting.extend(waiting)
        if self.connection is not None and self.connection.usable:
            self._write_waiting(self.connection)
        else:
            self._start_reconnecting()

    def _failure(self, request: Request, not_executed: bool, ending: Ending) -> Exception | None:
        """How an unanswered request ends; None: it is written again on the next
        connection. ``not_executed``: the daemon never read it (it said so as it stopped,
        or the socket went before the request was written)."""
        reason = ending.reason
        if request.bound_to is not None:
            if request.commits and not not_executed:
                return OutcomeUnknown(f"{reason}: the COMMIT may or may not have taken effect")
            return TransactionLost(f"{reason}: the daemon rolled the transaction back")
        if ending.refused is not None and not not_executed:  # it would be refused again
            return OutcomeUnknown(f"{reason}: the request may or may not have taken effect")
        if not_executed:
            if self.reconnect is not None and not self._closed:
                return None
            # not here, but perhaps on a connection lost before: _gone says so
            stopping = ending.stopping
            if stopping is None:  # the socket went before it was written
                return _gone(request, NotConnected(f"{reason}: the request was not sent"))
            message = stopping.remote_message + " (not executed)"
            return _gone(request, BrokerStopping(message, kind="BrokerStopping"))
        if request.repeatable and self.reconnect is not None and not self._closed:
            return None
        return OutcomeUnknown(f"{reason}: the request may or may not have taken effect")

    # -- reconnecting --------------------------------------------------------------------

    def _start_reconnecting(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        policy = self.reconnect
        assert policy is not None
        delay = policy.initial
        while not self._closed:
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            self._give_up_expired()
            if self.connected:
                break
            connection = Connection(self.address, self._ended)
            try:
                await connection.open()
            except AuthenticationFailed as exc:  # no retry helps until the token changes
                self.last_failure = str(exc)
                self._fail_waiting(exc)
                delay = policy.maximum
                continue
            except ClientError as exc:
                self.last_failure = str(exc)
                delay = min(delay * 2, policy.maximum)
                continue
            if self._closed:
                connection.close()
                return
            self.reconnects += 1
            self._adopt(connection)
            break

    def _adopt(self, connection: Connection) -> None:
        if self.connection is not None and not self.connection.ended:
            self._replaced.add(self.connection)  # its daemon is stopping: it ends later
        self.connection = connection
        self.last_goodbye = None
        self.generation += 1
        self.max_body = connection.max_body
        self.features = connection.features
        self._write_waiting(connection)

    def _write_waiting(self, connection: Connection) -> None:
        """Write on ``connection`` the requests waiting for one, in order."""
        waiting, self._waiting = self._waiting, []
        self._disarm_give_up()
        for item in waiting:
            if item.request.reply.done():
                continue
            too_large = self._too_large(item.request)  # this daemon's limit is lower
            if too_large is not None:
                item.request.reply.set_exception(_gone(item.request, too_large))
                continue
            try:
                connection.submit(item.request)
            except Exception as exc:  # it fails alone: the others still go, in order
                item.request.reply.set_exception(_gone(item.request, exc))

    def _give_up_expired(self) -> None:
        now = time.monotonic()
        keep: list[_Waiting] = []
        for item in self._waiting:
            if item.deadline > now:
                keep.append(item)
            elif not item.request.reply.done():
                error = NotConnected(
                    f"no connection to brokerd at {self.address} within "
                    f"{self.reconnect.give_up_after if self.reconnect else 0} s "
                    f"({self.last_failure}): the request was not sent"
                )
                item.request.reply.set_exception(_gone(item.request, error))
        self._waiting = keep
        self._arm_give_up()

    def _fail_waiting(self, error: Exception) -> None:
        waiting, self._waiting = self._waiting, []
        for item in waiting:
            if not item.request.reply.done():
                item.request.reply.set_exception(_gone(item.request, error))

    # -- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop reconnecting; requests waiting for a connection fail with NotConnected,
        those in flight with their outcome (OutcomeUnknown, mostly). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._disarm_give_up()
        if self._task is not None:
            self._task.cancel()
        self._fail_waiting(NotConnected("client closed: the request was not sent"))
        for replaced in list(self._replaced):
            replaced.close()
        if self.connection is not None:
            self.connection.close()
