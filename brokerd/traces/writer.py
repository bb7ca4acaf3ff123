"""Delivery traces: what happened to each message, written as append-only JSON Lines.

Owns the trace file format (schema version 1, documented in ``docs/traces.md``; R-TRACE-1)
and the writer every daemon runs:

* on the event loop an event is only appended to an in-memory buffer; a
  background flush every ``trace.flush_interval`` seconds formats the buffered
  events (orjson) and writes them in a worker thread, so the broker never
  waits for the trace disk;
* durability (``trace.durable``, on by default): every flush is fsynced, and
  :meth:`TraceWriter.barrier` gives the store a future that is done once every
  event emitted so far is on disk: a commit's outcome reaches the application only
  then, so the events of a change the application saw (:data:`DURABLE`) survive a
  crash. Concurrent barriers share one write and one fsync (a group commit of the
  trace);
* every line carries ``n``, its number on this instance, continued across restarts;
  a start writes ``started`` naming the last event it found on disk, the one with the
  highest ``n`` (:mod:`brokerd.traces.last_event`; ``last_n``, ``last_ts``,
  ``last_event``; ``clean`` when it was the ``stopped`` event a graceful
  stop writes last): between the two lies the *crash window* whose events were lost
  (the audit, :mod:`brokerd.analytics.audit`, says "unknown: trace missing" there);
* files are segments ``<instance>-<UTC start>-<n>.jsonl`` in
  ``trace.directory``, closed (and a new one begun) at ``trace.segment_mb`` or
  after ``trace.segment_seconds``; a segment being written has the suffix
  ``.jsonl.open`` until it is closed, so readers may skip it;
* a crash can leave a torn last line; readers skip lines that do not parse
  (:func:`read_events` does, and the Spark jobs read with a permissive mode);
* closed segments are compacted into Parquet and old ones deleted in the background
  (:class:`~brokerd.traces.segments.SegmentKeeper`); files are 0600 in a 0700 directory;
* ``trace.sample`` keeps a fraction of conversations, chosen by conversation
  id so a conversation is traced on every broker or on none; events without a
  conversation (connections) are always kept; ``trace.enabled = false`` turns
  tracing off.

Trace writing never raises into the broker: a write error (a full disk) is logged once
per episode, its events are dropped and counted (``trace_events_lost``), what was written
of them is cut off, and a barrier is then done all the same, so commits go on (R-TRACE-4).
The first write that succeeds again begins with ``trace_resumed``, naming the last event
written before the episode: the audit treats the time between as a window whose events
are missing, as it does a crash's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson

from brokerd.config import TraceConfig
from brokerd.directories import sync_directory
from brokerd.traces.last_event import last_event
from brokerd.traces.names import (
    CLOSED_SUFFIX,
    COMPACT_SUFFIXES,
    LIFE_ORDER,
    OPEN_SUFFIX,
    latest_names,
    regular_files,
    stem,
)
from brokerd.traces.segments import (
    STOP_COMPACT_SECONDS,
    SegmentKeeper,
    create_private,
    instance_segments,
    private_directory,
    segment_lines,
)

SCHEMA_VERSION = 1
log = logging.getLogger("brokerd.traces.writer")

EVENTS: dict[str, str] = {
    "dialog_begun": "BEGIN DIALOG by the application (initiator) or the first message (target)",
    "dialog_ended": "the endpoint reached CD (closed)",
    "message_sent": "SEND by the application committed (seq, size)",
    "enqueued": "the message entered the transmission queue",
    "route_chosen": "routing decided for a conversation (route, step, address, decision)",
    "delayed": "no route: the conversation is DELAYED (reason)",
    "released": "a DELAYED conversation found a route",
    "fragment_sent": "one fragment handed to a connection (seq, fragment, size, attempt)",
    "retransmission": "a message sent again (seq, attempt, wait before the next)",
    "fragment_received": "one fragment arrived (seq, fragment, size, peer)",
    "corrupted_message": "a frame failed its integrity check (peer, reason)",
    "duplicate": "a fragment already received arrived again and was acknowledged again",
    "cut_again": "a message arrived cut at another fragment size than the fragments held "
    "of it, which were dropped (seq, fragments, dropped)",
    "ack_sent": "an acknowledgement was given to the connection to send (through); while "
    "it waits there, a newer one of the same endpoint takes its place",
    "ack_received": "an acknowledgement arrived (through; acked = messages it released)",
    "forwarded": "a fragment relayed to the next broker (hop count, address)",
    "dropped": "a message dropped, not acknowledged (reason)",
    "discarded": "messages removed unacknowledged from the transmission queue, or arrived "
    "after the receiving side ended (seqs, reason)",
    "delivered": "a message stored in the target queue, ready to RECEIVE (seq)",
    "received": "the application RECEIVEd the message (seq)",
    "timer_fired": "a conversation timer put a DialogTimer message in this side's queue",
    "lifetime_expired": "the dialog's lifetime passed: an Error in this side's queue (reason)",
    "connection_opened": "a broker connection completed its handshake (peer)",
    "connection_closed": "a broker connection closed (peer, reason)",
    "connection_refused": "an outgoing connection attempt failed (peer, reason)",
    "activation_started": "an activated queue's command was started (database, queue, pid, reason)",
    "activation_exited": "an activated command exited (database, queue, pid, reason)",
    "activation_failed": "an activated queue's command could not be started (database, "
    "queue, reason)",
    "inherited": "a promoted mirror's endpoint as its file holds it, before it serves "
    "(sent_through, received_through)",
    "started": "the writer started; the last event it found on disk (last_n, last_ts, "
    "last_event; clean: that was a graceful stop's)",
    "stopped": "the daemon stopped gracefully: the last event before a clean start",
    "trace_resumed": "the trace could be written again after write errors: the last event "
    "written before them (last_n, last_ts, last_event), the events dropped (dropped, reason)",
}
"""Every event name of schema version 1, with what it means."""

DURABLE = frozenset(
    {
        "dialog_begun",
        "dialog_ended",
        "message_sent",
        "enqueued",
        "discarded",
        "delivered",
        "received",
        "ack_received",
        "timer_fired",
        "lifetime_expired",
        "rolled_back",
        "quarantined",
        "quarantine_released",
        "quarantine_ended",
        "queue_disabled",
        "inherited",
        "started",
        "stopped",
        "trace_resumed",
    }
)
"""Events that describe a change of a database file (or the writer's own start and stop).
They are emitted at or before the commit that makes the change, so with
``trace.durable`` they are on disk before its outcome reaches the application. The
others (fragments, retransmissions, routing, drops, connections) describe what
happened in memory or on the wire: ``durable: false`` in docs/traces.md, and a crash
loses up to one flush of them."""

CONVERSATIONS_KEPT = 100_000
"""Conversations whose line piece the writer keeps between flushes (then it starts over)."""

GROUP_SECONDS = 0.001
"""How far apart two events :meth:`TraceWriter.emit_grouped` folds into one entry may be."""

Event = tuple[float, str, uuid.UUID | None, dict[str, Any]]
"""An event as buffered: wall-clock time, name, conversation and fields."""

Events = tuple[float, str, uuid.UUID | None, dict[str, Any], str, list[int], list[Any]]
"""Several events buffered as one (:meth:`TraceWriter.emit_each`): the fields they share,
and the name and values of the one field that differs (one line per value). The last
list is empty while every line has the entry's conversation; once events of other
conversations join, it holds each line's conversation (:meth:`TraceWriter._fold`)."""


def _jstr(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


@lru_cache(maxsize=4)
def _second(whole: int) -> str:
    return datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def iso_micros(t: float) -> str:
    """A UTC timestamp with microseconds, as traces carry it (``2026-11-21T09:08:50.098996Z``)."""
    micros = round(t * 1_000_000)
    whole, fraction = divmod(micros, 1_000_000)
    return f"{_second(whole)}.{fraction:06d}Z"


class TraceWriter:
    """Buffered, rotated, crash-tolerant trace segments of one broker instance."""

    def __init__(self, config: TraceConfig, instance: str, clock: Any = time.time) -> None:
        self.config = config
        self.enabled = config.enabled
        self.instance = instance
        self.directory = Path(config.directory or "traces")
        self.clock = clock
        self._threshold = int(config.sample * 10_000)
        self._head = f'{{"v":{SCHEMA_VERSION},"instance":{_jstr(instance)},'.encode()
        """Every line's start; the event's own fields follow."""
        self._buffer: list[Event | Events] = []
        self._buffered = 0
        """Events (lines) in the buffer: an ``emit_each`` entry holds several."""
        self._open: dict[tuple[str, int | None], Events] = {}
        """The last :meth:`emit_grouped` or :meth:`emit_each` entry of each event name and
        conversation (its integer: a UUID's hash is a Python call), while it is in the
        buffer: later events may still join it."""
        self._latest: dict[str, Events] = {}
        """The last entry begun of each event name, which events of other conversations
        may join (:meth:`_fold`)."""
        self._conversations: dict[int, bytes] = {}
        """The ``conversation_id`` piece of a line, by the conversation's integer: a
        conversation's events recur over many flushes (used by the one flush at a time)."""
        self._segment: Any = None
        self._segment_path: Path | None = None
        self._segment_bytes = 0
        self._segment_started = 0.0
        self._segment_count = 0
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self.events_written = 0
        self.events_lost = 0
        self.segments_closed = 0
        self.barriers = 0
        """Durable flushes a barrier asked for (each covers every barrier waiting then)."""
        self._next_n = 1
        """The ``n`` of the next line (used by the one flush at a time)."""
        self._taken = 0
        """Flushes that took lines from the buffer and have not written them yet: one may
        wait for the lock, which is free for a step of the loop between the flush before it
        letting go and this one taking it."""
        self._waiters: list[asyncio.Future[None]] = []
        """Barriers waiting for the next durable flush."""
        self._syncing: asyncio.Task[None] | None = None
        self.keeper = SegmentKeeper(config, self.directory, instance)
        """Compaction and retention of the closed segments, in the background."""
        self._tidying: asyncio.Task[None] | None = None
        self._untidy = False
        """A segment was closed since the keeper last ran."""
        self._last_written: tuple[int, float, str] | None = None
        """The ``n``, time and name of the last line written (used by the one flush)."""
        self._formatted_last: tuple[int, float, str] | None = None
        self._last_on_disk: dict[str, Any] = {}
        """The last event a crash or a stop left on disk, found at the start: where a gap
        begins when nothing of this process could be written."""
        self._started = False
        """Between a :meth:`start` that got as far as its marker and :meth:`stop`."""
        self._gap: dict[str, Any] | None = None
        """While writes fail: the ``trace_resumed`` fields the next good write begins with."""
        self.write_failures = 0
        """Episodes of failing writes (each logged once)."""

    # -- the hot path ---------------------------------------------------------------------

    def sampled(self, conversation_id: uuid.UUID | None) -> bool:
        """Whether events of this conversation are traced (``trace.sample``). The emitters
        ask only when a sample below 1 is set: at the default every event is kept."""
        if not self.enabled:
            return False
        if conversation_id is None or self._threshold >= 10_000:
            return True
        return (conversation_id.int >> 64) % 10_000 < self._threshold

    def emit(self, event: str, conversation_id: uuid.UUID | None = None, **fields: Any) -> None:
        """Record one event now; ``None`` fields are left out.

        The hot path only appends ``(time, event, conversation, fields)``; lines are
        formatted in batches, by the flush, in its worker thread.
        """
        if not self.enabled or (self._threshold < 10_000 and not self.sampled(conversation_id)):
            return
        self._buffer.append((self.clock(), event, conversation_id, fields))
        self._buffered += 1

    def emit_each(
        self,
        event: str,
        conversation_id: uuid.UUID | None,
        key: str,
        values: list[int],
        **fields: Any,
    ) -> None:
        """Record one event per value of ``values`` now, each with ``key`` set to its value
        and the shared ``fields``: the lines :meth:`emit` would write called once per value,
        buffered as one entry (the messages one commit delivered, for example), folded
        into a recent one as :meth:`emit_grouped` folds."""
        if not self.enabled or not values:
            return
        if self._threshold < 10_000 and not self.sampled(conversation_id):
            return
        self._fold(event, conversation_id, key, fields, len(values)).extend(values)
        self._buffered += len(values)

    def emit_grouped(
        self,
        event: str,
        conversation_id: uuid.UUID,
        key: str,
        value: int,
        **fields: Any,
    ) -> None:
        """Record the event :meth:`emit` would with ``key=value`` among ``fields``, folded
        into the previous one of the same name and conversation when that one has the
        same other fields and was recorded less than :data:`GROUP_SECONDS` ago: it then
        becomes one more line of that entry (as :meth:`emit_each` buffers), with that
        entry's time.

        For the events of every message (``message_sent``, ``enqueued``,
        ``fragment_sent``, ``fragment_received``, ``delivered``, ``received``): those of
        one batch (the SENDs of one read, the messages one commit released, the
        fragments of one read) cost one entry, not one formatted line each, and their
        times stay within a millisecond.
        """
        if not self.enabled or (self._threshold < 10_000 and not self.sampled(conversation_id)):
            return
        self._fold(event, conversation_id, key, fields).append(value)
        self._buffered += 1

    def _fold(
        self,
        event: str,
        conversation_id: uuid.UUID | None,
        key: str,
        fields: dict[str, Any],
        count: int = 1,
    ) -> list[int]:
        """The values list that ``count`` events join: the open entry of this event name and
        conversation, else the latest entry of this event name if it has the same fields
        (one of another conversation: each line then names its own), recorded less than
        :data:`GROUP_SECONDS` ago; else a new entry's. W4's messages go round-robin over
        10,000 dialogs: their events share entries this way, formatted once per entry."""
        now = self.clock()
        group = (event, None if conversation_id is None else conversation_id.int)
        entry = self._open.get(group)
        if (
            entry is None
            or now - entry[0] >= GROUP_SECONDS
            or entry[4] != key
            or entry[3] != fields
        ):
            entry = self._latest.get(event)
            if (
                entry is None
                or now - entry[0] >= GROUP_SECONDS
                or entry[4] != key
                or entry[3] != fields
            ):
                entry = (now, event, conversation_id, fields, key, [], [])
                self._buffer.append(entry)
                self._open[group] = self._latest[event] = entry
                return entry[5]
            # This conversation's next event may join only this entry or a newer one:
            # an older entry of its own would put that line before this one.
            self._open[group] = entry
        conversations = entry[6]
        if conversations:
            conversations.extend([conversation_id] * count)
        elif entry[2] is not conversation_id and entry[2] != conversation_id:
            conversations.extend([entry[2]] * len(entry[5]))
            conversations.extend([conversation_id] * count)
        return entry[5]

    # -- writing -------------------------------------------------------------------------

    async def start(self) -> None:
        """Close the segments a crash left open, write ``started`` (naming the last event
        on disk) at once, and begin the periodic flush."""
        if not self.enabled:
            return
        private_directory(self.directory)
        self._recover_open_segments()
        await asyncio.to_thread(self.keeper.recover)
        self._untidy = True
        last = await asyncio.to_thread(self._last_event)
        fields: dict[str, Any] = {}
        if last is not None:
            n = last.get("n")
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                self._next_n = n + 1
                fields["last_n"] = n
            fields["last_ts"] = last.get("ts")
            fields["last_event"] = last.get("event")
            # until this process writes a line, a gap (a full disk) begins after it
            self._last_on_disk = {k: v for k, v in fields.items() if v is not None}
            fields["clean"] = last.get("event") == "stopped"
        self.emit("started", **fields)
        self._started = True
        await self.flush()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="trace-writer")
        self._tidy()

    async def stop(self) -> None:
        # The flush loop is told to stop, not cancelled: a cancelled flush would lose the
        # lines it had taken from the buffer (while waiting for the lock) or close the
        # segment under a write still running in its thread.
        self._stopping.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._syncing is not None:
            await self._syncing
        # compaction goes on for a few seconds at most; the rest is the next start's
        self.keeper.stop_by(time.monotonic() + STOP_COMPACT_SECONDS)
        if self._tidying is not None:
            await self._tidying
        if self._started:  # a start that failed before it leaves no "stopped" behind
            self._started = False
            self.emit("stopped")
            await self.flush()
            async with self._lock:
                await asyncio.to_thread(self._close_segment)
            await asyncio.to_thread(self.keeper.tidy, stopping=True)

    async def _run(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.config.flush_interval)
            await self.flush()
            if self._untidy and not self._stopping.is_set():
                self._tidy()

    def _tidy(self) -> None:
        """Run the keeper (compaction, retention) in a worker thread unless it runs."""
        if self._tidying is not None and not self._tidying.done():
            return
        self._untidy = False
        self._tidying = asyncio.get_running_loop().create_task(
            asyncio.to_thread(self.keeper.tidy), name="trace-keeper"
        )

    async def flush(self) -> None:
        """Write what is buffered (in a worker thread)."""
        if not self._buffer:
            if self._segment is not None and self._segment_expired():
                async with self._lock:
                    await asyncio.to_thread(self._close_segment)
            return
        lines, self._buffer = self._buffer, []
        count, self._buffered = self._buffered, 0
        self._open = {}  # what is taken is formatted now: nothing may join it any more
        self._latest = {}
        self._taken += 1
        try:
            async with self._lock:
                await asyncio.to_thread(self._write, lines, count)
        finally:
            self._taken -= 1

    def barrier(self) -> asyncio.Future[None] | None:
        """A future done once every event emitted so far is written and fsynced, or None
        when nothing is to wait for (all of them are, or ``trace.durable`` is off).

        The store holds a commit's outcome until then (docs/design.md "Storage"), so what
        the application is told has its events on disk. Barriers asked for while a
        durable flush runs share the next one: one future, shared by every barrier asked
        for until that flush takes it (a reply gated per SEND costs no future of its own).
        A waiter that may be cancelled shields it."""
        if self._task is None or not self.config.durable:
            return None
        if not self._buffer and not self._taken and not self._lock.locked():
            return None
        if self._waiters:  # not taken yet: the flush that takes it covers these events too
            return self._waiters[-1]
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiters.append(future)
        if self._syncing is None:
            self._syncing = loop.create_task(self._sync(), name="trace-barrier")
        return future

    async def _sync(self) -> None:
        """Durable flushes while barriers wait; each one's waiters are done after it."""
        try:
            while self._waiters:
                waiters, self._waiters = self._waiters, []
                self.barriers += 1
                try:
                    if self._buffer:
                        await self.flush()
                    else:  # flushes took the lines: they hold the lock or wait before us
                        async with self._lock:
                            pass
                finally:
                    for future in waiters:
                        if not future.done():
                            future.set_result(None)
        finally:
            self._syncing = None

    def _segment_expired(self) -> bool:
        age: float = self.clock() - self._segment_started
        return age >= self.config.segment_seconds

    def _format(self, events: list[Event | Events]) -> bytes:
        """JSON Lines for ``events``, in their order.

        A line is the instance's constant prefix, then ``ts``, ``event`` and
        ``conversation_id`` from byte pieces cached for the batch (a timestamp's
        second, an event name) or from one flush to the next (a conversation's, keyed
        by its integer: a UUID's own hash is a Python call), then the event's own
        fields (orjson, one call per event; one per :meth:`emit_each` entry,
        whose lines differ only in one integer field).
        """
        dumps = orjson.dumps
        head = self._head
        seconds: dict[int, bytes] = {}
        names: dict[str, bytes] = {}
        conversations = self._conversations
        if len(conversations) > CONVERSATIONS_KEPT:
            conversations.clear()
        out: list[bytes] = []
        add = out.append
        n = self._next_n
        for entry in events:
            t, event, conversation_id, fields = entry[0], entry[1], entry[2], entry[3]
            if None in fields.values():
                fields = {k: v for k, v in fields.items() if v is not None}
            whole, fraction = divmod(round(t * 1_000_000), 1_000_000)
            second = seconds.get(whole)
            if second is None:
                second = seconds[whole] = b'"ts":"%s.' % _second(whole).encode()
            name = names.get(event)
            if name is None:
                name = names[event] = b'Z","event":' + dumps(event)
            conversation = _conversation_piece(conversations, conversation_id)
            body = b"%s%06d%s%s" % (second, fraction, name, conversation)
            rest = dumps(fields, default=str)[1:] if fields else b"}"
            if len(entry) == 4:
                add(b'%s"n":%d,%s%s\n' % (head, n, body, b"," + rest if fields else rest))
                n += 1
                continue
            key, values, lines_conversations = entry[4], entry[5], entry[6]
            tail = b"," + rest[:-1] if fields else b""
            tail += b"," + dumps(key) + b":"
            if not lines_conversations:
                body += tail
                for value in values:
                    add(b'%s"n":%d,%s%d}\n' % (head, n, body, value))
                    n += 1
                continue
            body = b"%s%06d%s" % (second, fraction, name)
            for value, line_conversation in zip(values, lines_conversations, strict=True):
                piece = _conversation_piece(conversations, line_conversation)
                add(b'%s"n":%d,%s%s%s%d}\n' % (head, n, body, piece, tail, value))
                n += 1
        if events:
            last = events[-1]
            self._formatted_last = (n - 1, last[0], last[1])
        self._next_n = n
        return b"".join(out)

    def _write(self, lines: list[Event | Events], count: int) -> None:
        gap = self._gap
        if gap is not None:  # the first lines written again say what is missing
            lines = [(self.clock(), "trace_resumed", None, gap), *lines]
        data = self._format(lines)
        try:
            if self._segment is not None and (
                self._segment_bytes >= self.config.segment_mb * 1024 * 1024
                or self._segment_expired()
            ):
                self._close_segment()
            if self._segment is None:
                self._open_segment()
            rest = memoryview(data)
            while rest:  # an unbuffered write may be short (a disk filling up)
                rest = rest[self._segment.write(rest) :]
            if self.config.durable:
                os.fdatasync(self._segment.fileno())
            self._segment_bytes += len(data)
            self.events_written += count
        except OSError as exc:
            self._cut_back()
            self.events_lost += count
            if gap is None:
                self.write_failures += 1
                log.error(
                    "cannot write trace segment %s: %s; trace events are dropped (and "
                    "counted) until it can be written again, delivery goes on",
                    self._segment_path,
                    exc,
                )
                gap = {"dropped": 0, "reason": str(exc)}
                if self._last_written is not None:
                    n, t, event = self._last_written
                    gap.update(last_n=n, last_ts=iso_micros(t), last_event=event)
                else:  # nothing written yet (the start's own line among the dropped)
                    gap.update(self._last_on_disk)
            gap["dropped"] += count
            self._gap = gap
            return
        self._last_written = self._formatted_last
        if gap is not None:
            log.warning(
                "trace segment %s written again: %d trace events were dropped",
                self._segment_path,
                gap["dropped"],
            )
            self._gap = None

    def _cut_back(self) -> None:
        """Cut a failed write's part off the segment, so it ends with a whole line."""
        if self._segment is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._segment.fileno(), self._segment_bytes)

    def _open_segment(self) -> None:
        self._segment_started = self.clock()
        stamp = datetime.fromtimestamp(self._segment_started, UTC).strftime("%Y%m%dT%H%M%S")
        while True:  # a writer restarted in the same second and process must not reuse a name
            self._segment_count += 1
            name = f"{self.instance}-{stamp}-{os.getpid()}-{self._segment_count:05d}{OPEN_SUFFIX}"
            self._segment_path = self.directory / name
            base = name.removesuffix(OPEN_SUFFIX)
            if not any(
                self.directory.joinpath(base + suffix).exists()
                for suffix in (CLOSED_SUFFIX, *COMPACT_SUFFIXES)
            ):
                break
        self.keeper.holding = base  # from now on this process's last event is in it
        self._segment = create_private(self._segment_path)
        self._segment_bytes = 0
        if self.config.durable:  # the events it will hold are fsynced: so is its name
            sync_directory(self.directory)

    def _close_segment(self) -> None:
        if self._segment is None or self._segment_path is None:
            return
        self._segment.close()
        self._segment = None
        final = self._segment_path.with_name(self._segment_path.name.removesuffix(".open"))
        try:
            self._segment_path.rename(final)
            if self.config.durable:
                sync_directory(self.directory)
        except OSError as exc:  # moved or deleted from outside: its lines are where it went
            log.error("cannot close trace segment %s: %s", self._segment_path, exc)
        self._segment_path = None
        self.segments_closed += 1
        self._untidy = True

    def _recover_open_segments(self) -> None:
        """Segments left open by a crash are closed as they are (a torn line is skipped)."""
        for path in instance_segments(self.directory, self.instance, OPEN_SUFFIX):
            path.rename(path.with_name(path.name.removesuffix(".open")))

    def _last_event(self) -> dict[str, Any] | None:
        """The last whole event of this instance on disk, the one with the highest ``n``
        (:func:`~brokerd.traces.last_event.last_event`), or None without any. Its segment
        is kept by retention until this process opens one (:attr:`SegmentKeeper.holding`)."""
        found = last_event(self.directory, self.instance)
        if found is None:
            return None
        self.keeper.holding = stem(found.segment)
        return found.event

    def view(self) -> dict[str, Any]:
        return {
            "trace_enabled": self.enabled,
            "trace_directory": str(self.directory),
            "trace_events_written": self.events_written,
            "trace_events_buffered": self._buffered,
            "trace_events_lost": self.events_lost,
            "trace_write_failures": self.write_failures,
            "trace_incomplete": self._gap is not None,
            "trace_segments_closed": self.segments_closed,
            "trace_barriers": self.barriers,
            **self.keeper.view(),
        }


def _conversation_piece(known: dict[int, bytes], conversation_id: uuid.UUID | None) -> bytes:
    """The ``conversation_id`` piece of a line (none without a conversation), made once
    per conversation and kept in ``known`` by its integer."""
    if conversation_id is None:
        return b""
    key = conversation_id.int
    piece = known.get(key)
    if piece is None:
        piece = known[key] = b',"conversation_id":"%s"' % str(conversation_id).encode()
    return piece


def segment_files(directories: Iterable[Path], include_open: bool = True) -> list[Path]:
    """Every trace segment under ``directories`` (recursively, plain or compacted), oldest
    name first, each once under its latest name (:func:`latest_names`: a segment closed or
    compacted while it was listed; one whose compaction is done but for deleting it). What
    is not a regular file (a FIFO named like a segment) is noted and left out: reading it
    would wait for ever."""
    out: list[Path] = []
    for directory in directories:
        for suffix in LIFE_ORDER:  # a segment renamed between two looks is found once
            if include_open or suffix != OPEN_SUFFIX:
                out += directory.rglob(f"*{suffix}")
    return sorted(latest_names(regular_files(out, _skipped)))


def _skipped(path: Path, why: str) -> None:
    log.warning("trace file %s skipped: %s", path, why)


def read_events(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """Events from segment files in order; lines that do not parse (a torn tail) are skipped,
    and so is a file that is not a regular one (:func:`segment_lines` notes it)."""
    for path in paths:
        for raw in segment_lines(path):
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if isinstance(event, dict):
                yield event
