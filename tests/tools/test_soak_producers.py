"""The soak's end of production is bounded: a producer whose SEND never returns (a
broker fault, such as commits held for ever by a principal waiting for its mirror) is
cancelled and reported, and the run goes on to its drain and verdict instead of
hanging; a producer's own failure still ends the run."""

from __future__ import annotations

import asyncio
import time

import pytest

from brokerd.tools.soak.producers import stop_producers


async def test_a_producer_stuck_on_a_send_is_cancelled_after_the_timeout() -> None:
    never = asyncio.get_running_loop().create_future()  # a SEND that never returns

    async def stuck() -> None:
        await never

    async def finishing() -> None:
        await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(stuck()), asyncio.create_task(finishing())]
    started = time.monotonic()
    assert await stop_producers(tasks, timeout=0.3) == 1
    assert 0.3 <= time.monotonic() - started < 2
    assert tasks[0].cancelled() and tasks[1].done() and not tasks[1].cancelled()


async def test_producers_that_end_are_waited_for_and_their_failure_raised() -> None:
    async def failing() -> None:
        await asyncio.sleep(0.01)
        raise RuntimeError("a producer's own bug")

    assert await stop_producers([], timeout=0.1) == 0
    with pytest.raises(RuntimeError, match="own bug"):
        await stop_producers([asyncio.create_task(failing())], timeout=5)
