"""The soak's count of how the local stream's messages travelled
(brokerd/tools/soak/delivery.py), on trace lines written here in the format of
docs/traces.md: a message with an ``enqueued`` event took the transmission queue, one
with ``message_sent`` only went directly into its target queue (R-DLG-13)."""

from __future__ import annotations

import json
from pathlib import Path

from brokerd.tools.soak.delivery import local_paths

CONVERSATION = "0b6f1c2e-8a4d-4f7e-9c1b-2d3e4f5a6b7c"


def _line(event: str, seq: int, initiator: bool = True, database: str = "SoakLocal") -> str:
    fields = {"v": 1, "instance": "a", "ts": "2026-11-24T00:00:00.000000Z", "event": event}
    fields |= {"conversation_id": CONVERSATION, "database": database}
    return json.dumps(fields | {"initiator": initiator, "seq": seq}) + "\n"


def test_messages_without_an_enqueued_event_went_directly(tmp_path: Path) -> None:
    lines = [_line("message_sent", 1), _line("enqueued", 1), _line("delivered", 1)]
    lines += [_line("message_sent", n) for n in (2, 3, 4)]
    lines += [_line("message_sent", 1, initiator=False), _line("enqueued", 1, initiator=False)]
    lines += [_line("message_sent", 9, database="SoakA"), '{"torn": ']
    (tmp_path / "a-20261124T000000Z-1-0.jsonl").write_text("".join(lines))
    assert local_paths(tmp_path, "SoakLocal") == {
        "requests_traced": 4,
        "requests_direct": 3,
        "requests_transmission_queue": 1,
        "replies_traced": 1,
        "replies_direct": 0,
        "replies_transmission_queue": 1,
    }
