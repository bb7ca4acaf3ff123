"""The producer: an OS process of its own that SENDs a run's messages through the SDK.

It begins ``dialogs`` dialogs (before the clock starts), then SENDs message ``k`` on
dialog ``k % dialogs`` for k = 0 .. messages-1. A SEND returns after the daemon's
durable commit; up to ``window`` SENDs await theirs at any time, pipelined on the one
SDK connection (as a RabbitMQ publisher keeps unconfirmed messages in flight), each
made with ``send_nowait`` and finished by a callback on its future, no task per SEND.
With ``batch`` above 1, the messages go ``batch`` at a time in one ``send_many``
request each (one commit, a transaction's worth), ``window // batch`` requests in
flight; each body carries the time its batch was made. The daemon numbers SENDs in
the order it reads them, so on each dialog the sequence numbers follow the indexes.
The result goes back to the parent through a pipe: the first send time, the time the
last commit returned, each index's sequence number, the CPU time the process used
while sending, and any error.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from array import array
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench import messages
from bench.deployments import CONTRACT, FROM_SERVICE, MESSAGE_TYPE, TO_SERVICE
from bench.system import own_cpu_seconds
from brokerd.sdk.client import BrokerClient
from brokerd.server.daemon import install_uvloop


@dataclass(frozen=True)
class ProducerJob:
    host: str
    port: int
    token_file: Path
    messages: int
    size: int
    dialogs: int
    window: int
    timeout: float
    batch: int = 1
    """SENDs per request: 1 pipelines single SENDs, more sends batches with ``send_many``."""


async def produce(job: ProducerJob) -> dict[str, Any]:
    client = await BrokerClient.connect(job.host, job.port, token_file=job.token_file)
    seqs = array("q", bytes(8 * job.messages))
    errors: list[str] = []
    try:
        handles: list[uuid.UUID] = []
        while len(handles) < job.dialogs:
            batch = min(job.window, job.dialogs - len(handles))
            dialogs = await asyncio.gather(
                *(client.begin_dialog(FROM_SERVICE, TO_SERVICE, CONTRACT) for _ in range(batch))
            )
            handles += [dialog.handle for dialog in dialogs]
        pad = messages.padding(job.size)
        window = asyncio.Semaphore(max(1, job.window // job.batch))
        pending: set[asyncio.Future[Any]] = set()
        committed = 0

        def sent(k: int, future: asyncio.Future[int]) -> None:
            nonlocal committed
            window.release()
            pending.discard(future)
            exc = future.exception()
            if exc is None:
                seqs[k] = future.result()
                committed += 1
            elif len(errors) < 5:
                errors.append(f"SEND {k}: {type(exc).__name__}: {exc}")

        async def send_batch(first: int, last: int) -> None:
            nonlocal committed
            try:
                now = time.monotonic_ns()
                batch = [
                    (handles[k % job.dialogs], MESSAGE_TYPE, messages.body(k, now, pad))
                    for k in range(first, last)
                ]
                seqs[first:last] = array("q", await client.send_many(batch))
                committed += last - first
            except Exception as exc:
                if len(errors) < 5:
                    errors.append(f"SEND {first}..{last - 1}: {type(exc).__name__}: {exc}")
            finally:
                window.release()

        cpu0 = own_cpu_seconds()
        t0 = time.monotonic_ns()
        deadline = time.monotonic() + job.timeout
        step = job.batch
        for k in range(0, job.messages, step):
            await window.acquire()
            if errors or time.monotonic() > deadline:
                break
            if step > 1:
                task = asyncio.create_task(send_batch(k, min(k + step, job.messages)))
                pending.add(task)
                task.add_done_callback(pending.discard)
            else:
                data = messages.body(k, time.monotonic_ns(), pad)
                future = client.send_nowait(handles[k % job.dialogs], MESSAGE_TYPE, data)
                pending.add(future)  # one callback a SEND: each is a turn of the loop's queue
                future.add_done_callback(functools.partial(sent, k))
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
        t_done = time.monotonic_ns()
        if committed < job.messages and not errors:
            errors.append(f"timed out after {job.timeout:g} s: {committed} SENDs committed")
        return {
            "t0": t0,
            "t_done": t_done,
            "committed": committed,
            "seqs": seqs.tobytes(),
            "cpu": own_cpu_seconds() - cpu0,
            "errors": errors,
        }
    finally:
        await client.close()


def main(job: ProducerJob, out: Connection) -> None:
    """The process's entry point (multiprocessing, spawn)."""
    install_uvloop()
    try:
        result = asyncio.run(produce(job))
    except Exception as exc:
        result = {"errors": [f"producer: {type(exc).__name__}: {exc}"]}
    out.send(result)
    out.close()
