"""What the daemons' delivery traces (``docs/traces.md``) tell of a soak: how the local
stream's messages travelled (read from A's: a message that went through the
transmission queue has an ``enqueued`` event; one delivered directly into its target
queue, R-DLG-13, has ``message_sent`` and ``delivered`` only), and how many messages
were cut again (every daemon's).

These are measurements for the summary, not part of the verdict (the checker reads only
the applications' ledgers). They are approximate: a SIGKILL loses the events of the
commits nobody was told of yet (the crash window, docs/traces.md "Durability"), and a
SEND cut by a kill may have been traced and then sent again under the same number.
"""

from __future__ import annotations

from pathlib import Path

from brokerd.traces.writer import read_events, segment_files

Message = tuple[str, bool, int]
"""(conversation id, sent by the initiator, sequence number): one message."""


def local_paths(trace_directory: Path, database: str) -> dict[str, int]:
    """Messages of ``database`` traced as sent, and how many of them took the transmission
    queue, for the initiators' messages (``requests``) and the targets' (``replies``)."""
    sent: set[Message] = set()
    enqueued: set[Message] = set()
    for event in read_events(segment_files([trace_directory])):
        name = event.get("event")
        if name not in ("message_sent", "enqueued") or event.get("database") != database:
            continue
        try:
            message = (str(event["conversation_id"]), bool(event["initiator"]), int(event["seq"]))
        except (KeyError, TypeError, ValueError):
            continue
        (sent if name == "message_sent" else enqueued).add(message)
    out: dict[str, int] = {}
    for side, initiator in (("requests", True), ("replies", False)):
        mine = {m for m in sent if m[1] is initiator}
        queued = {m for m in enqueued if m[1] is initiator}
        out[f"{side}_traced"] = len(mine)
        out[f"{side}_direct"] = len(mine - queued)
        out[f"{side}_transmission_queue"] = len(mine & queued)
    return out


def cut_again(trace_directories: list[Path]) -> int:
    """Messages a receiver took as cut again at another fragment size, dropping what it
    held of them (``cut_again`` events, R-DLG-7), in every daemon's traces: a daemon's
    counters start again with it, its traces do not."""
    directories = [d for d in trace_directories if d.is_dir()]
    return sum(
        1 for event in read_events(segment_files(directories)) if event.get("event") == "cut_again"
    )
