"""The consumer: an OS process of its own that RECEIVEs a run's messages through the SDK.

``receivers`` loops (one by default) on the one SDK connection each call
``RECEIVE TOP (top) FROM OrderQueue`` (autocommit: the RECEIVE's removal is committed
before it returns; with ``groups``, of up to that many conversation groups at once)
until every message of the run has arrived, then one more RECEIVE
waits ``linger`` seconds for anything that should not come (a duplicate or a stray).
Each message is checked as it arrives:

* exactly once: its index (from the body) has not been seen before;
* in order per dialog: per receiving loop and conversation, sequence numbers and
  indexes increase; every index of one dialog arrives on one conversation;
* the parent later compares each index's sequence number with the one its SEND returned.

The receive time of each message is ``time.monotonic_ns()`` when its RECEIVE returned;
the parent gets the send and receive times of every index, the first and last receive
time, the CPU time used while receiving and the problems found, through a pipe.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from array import array
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from bench import messages
from bench.deployments import MESSAGE_TYPE, QUEUE
from bench.system import own_cpu_seconds
from brokerd.sdk.client import BrokerClient, ReceivedMessage
from brokerd.server.daemon import install_uvloop
from protocol.errors import ClientError

MAX_PROBLEMS = 20


@dataclass(frozen=True)
class ConsumerJob:
    host: str
    port: int
    token_file: Path
    messages: int
    size: int
    dialogs: int
    top: int
    receivers: int
    timeout: float
    groups: int = 1
    """Conversation groups one RECEIVE may return (SPEC §6's ``groups``)."""
    linger: float = 0.5
    connect_timeout: float = 30.0
    """How long to retry connecting (the daemon may not be up yet)."""


@dataclass
class Tally:
    messages: int
    dialogs: int
    size: int
    sent_ns: array[int] = field(init=False)
    recv_ns: array[int] = field(init=False)
    seqs: array[int] = field(init=False)
    seen: bytearray = field(init=False)
    count: int = 0
    duplicates: int = 0
    strays: int = 0
    receive_calls: int = 0
    first_ns: int = 0
    last_ns: int = 0
    problems: list[str] = field(default_factory=list)
    conversation_of: dict[int, uuid.UUID] = field(default_factory=dict)
    dialog_of: dict[uuid.UUID, int] = field(default_factory=dict)
    last_seq: dict[tuple[int, uuid.UUID], int] = field(default_factory=dict)
    last_index: dict[tuple[int, int], int] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        zeros = bytes(8 * self.messages)
        self.sent_ns, self.recv_ns, self.seqs = (
            array("q", zeros),
            array("q", zeros),
            array("q", zeros),
        )
        self.seen = bytearray(self.messages)

    def complain(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    def record(self, batch: list[ReceivedMessage], receiver: int) -> None:
        now = time.monotonic_ns()
        self.receive_calls += 1
        if not batch:
            return
        if not self.first_ns:
            self.first_ns = now
        for m in batch:
            head = messages.header(m.message_body)
            if (
                head is None
                or m.message_type_name != MESSAGE_TYPE
                or len(m.message_body) != self.size
                or not 0 <= head[0] < self.messages
            ):
                self.strays += 1
                self.complain(
                    f"unexpected message {m.message_type_name} ({len(m.message_body)} bytes) "
                    f"on {m.conversation_handle}"
                )
                continue
            index, sent_ns = head
            if self.seen[index]:
                self.duplicates += 1
                self.complain(f"duplicate: index {index} (seq {m.message_sequence_number})")
                continue
            self.seen[index] = 1
            self.count += 1
            self.sent_ns[index], self.recv_ns[index] = sent_ns, now
            self.seqs[index] = m.message_sequence_number
            self.last_ns = now
            dialog, handle = index % self.dialogs, m.conversation_handle
            if (
                self.conversation_of.setdefault(dialog, handle) != handle
                or self.dialog_of.setdefault(handle, dialog) != dialog
            ):
                self.complain(f"dialog {dialog} arrived on two conversations, or vice versa")
            seq_key, index_key = (receiver, handle), (receiver, dialog)
            if m.message_sequence_number <= self.last_seq.get(seq_key, 0):
                self.complain(
                    f"order: seq {m.message_sequence_number} of {handle} after "
                    f"{self.last_seq[seq_key]}"
                )
            if index <= self.last_index.get(index_key, -1):
                self.complain(
                    f"order: index {index} of dialog {dialog} after {self.last_index[index_key]}"
                )
            self.last_seq[seq_key] = max(m.message_sequence_number, self.last_seq.get(seq_key, 0))
            self.last_index[index_key] = max(index, self.last_index.get(index_key, -1))
        if self.count >= self.messages:
            self.done.set()


async def connect(job: ConsumerJob) -> BrokerClient:
    """Connect, retrying while the daemon is not up yet (its token may not exist)."""
    deadline = time.monotonic() + job.connect_timeout
    while True:
        try:
            return await BrokerClient.connect(job.host, job.port, token_file=job.token_file)
        except (ClientError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)


async def consume(job: ConsumerJob, ready: Event | None = None) -> dict[str, Any]:
    tally = Tally(job.messages, job.dialogs, job.size)
    client = await connect(job)
    try:
        cpu0 = own_cpu_seconds()
        if ready is not None:
            ready.set()
        deadline = time.monotonic() + job.timeout

        async def loop(receiver: int) -> None:
            while not tally.done.is_set() and time.monotonic() < deadline:
                batch = await client.receive(QUEUE, top=job.top, timeout=0.5, groups=job.groups)
                tally.record(batch, receiver)

        await asyncio.gather(*(loop(n) for n in range(job.receivers)))
        errors: list[str] = []
        if not tally.done.is_set():
            errors.append(
                f"timed out after {job.timeout:g} s: received {tally.count} of {job.messages}"
            )
        # Anything arriving now should not exist.
        tally.record(await client.receive(QUEUE, top=job.top, timeout=job.linger), 0)
        return {
            "count": tally.count,
            "duplicates": tally.duplicates,
            "strays": tally.strays,
            "receive_calls": tally.receive_calls,
            "first_ns": tally.first_ns,
            "last_ns": tally.last_ns,
            "sent_ns": tally.sent_ns.tobytes(),
            "recv_ns": tally.recv_ns.tobytes(),
            "seqs": tally.seqs.tobytes(),
            "conversations": len(tally.dialog_of),
            "problems": tally.problems,
            "errors": errors,
            "cpu": own_cpu_seconds() - cpu0,
        }
    finally:
        await client.close()


def main(job: ConsumerJob, ready: Event, out: Connection) -> None:
    """The process's entry point (multiprocessing, spawn); ``ready`` is set once connected."""
    install_uvloop()
    try:
        result = asyncio.run(consume(job, ready))
    except Exception as exc:
        result = {"errors": [f"consumer: {type(exc).__name__}: {exc}"]}
    out.send(result)
    out.close()
