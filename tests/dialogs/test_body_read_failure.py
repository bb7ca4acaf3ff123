"""A body read back from the file that cannot be read, with real daemons on
127.0.59.2x:4022.

SPEC ids: R-DLG-5 (the sender keeps every unacknowledged message until acknowledged),
R-DLG-6 (an unacknowledged message is sent again), R-DLG-13 (bodies not held in memory
are read back from the file when sent).
"""

from __future__ import annotations

from pathlib import Path

from brokerd.tools.launcher import Deployment
from tests.daemons import FAST_RETRY, drain, wait_until
from tests.routing.deploy import R, addr, database, queue_of

A, B = "127.0.59.21", "127.0.59.22"
SENDER = "//bodyread/Sender"
TARGET = "//bodyread/Target"
NOT_HELD = "[limits]\nheld_bodies_mb = 0\n"
"""No body stays in memory from its SEND: each is read back from the file when sent."""


async def test_a_message_whose_body_could_not_be_read_back_is_sent_once_it_can(
    tmp_path: Path,
) -> None:
    """R-DLG-6, R-DLG-13: a message waits for its peer with its body only in the file (in
    a segment file: it is large, and its sender was restarted). When the peer comes,
    reading the body back fails (the segment is out of the way for a moment). The
    message is sent again once the body can be read: it must not stay behind, counted in
    its link's window and never due again, while the connection stays up."""
    deployment = Deployment(tmp_path, FAST_RETRY)
    deployment.add(
        "a", A, database("A", [SENDER], [R("ToTarget", addr(B), TARGET)]), extra=NOT_HELD
    )
    deployment.add("b", B, database("B", [TARGET], [R("Back", addr(A), SENDER)]))
    try:
        deployment.start("a")
        a = await deployment.daemons["a"].client()
        handle = await a.begin_dialog(SENDER, TARGET, database="A")
        body = bytes(range(256)) * 6 * 1024  # 1.5 MiB: stored in a segment file
        await a.send(handle, body=body)
        await a.close()
        deployment.stop("a")  # restarted, it reads no body: each is read when sent
        segments = sorted((tmp_path / "a").rglob("*.seg"))
        assert segments, "the body is in a segment file"
        for segment in segments:
            segment.rename(segment.with_name(segment.name + ".away"))
        log = tmp_path / "a" / "brokerd.log"

        async def read_failed() -> bool:
            return "cannot read message bodies back" in log.read_text(errors="replace")

        deployment.start("a")
        deployment.start("b")
        await wait_until(read_failed, 15)
        for segment in segments:
            segment.with_name(segment.name + ".away").rename(segment)
        b = await deployment.daemons["b"].client()
        (got,) = await drain(b, queue_of(TARGET), 1, timeout=15)
        assert got.message_body == body

        async def acknowledged() -> bool:
            return await a.view("transmission_queue") == []

        a = await deployment.daemons["a"].client()
        await wait_until(acknowledged, 10)
    finally:
        deployment.stop_all()
