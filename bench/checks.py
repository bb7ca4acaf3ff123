"""What makes a run ``ok``: every message exactly once and in order per dialog.

The consumer checks order and duplicates as messages arrive (:mod:`bench.consumer`);
here the producer's and the consumer's results are put together: every SEND committed,
every index received once, each index received with the sequence number its SEND
returned, nothing unexpected, and (with delivery traces on) the receiving broker's
``received`` events in increasing sequence per conversation, in commit order.
"""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

from brokerd.traces.writer import read_events, segment_files

MAX_PROBLEMS = 20


def run_problems(produced: dict[str, Any], consumed: dict[str, Any], messages: int) -> list[str]:
    problems = [*produced.get("errors", []), *consumed.get("errors", [])]
    problems += consumed.get("problems", [])
    if "seqs" not in produced or "seqs" not in consumed:
        return problems or ["no result"]
    if produced["committed"] != messages:
        problems.append(f"{produced['committed']} of {messages} SENDs committed")
    if consumed["count"] != messages:
        problems.append(f"{consumed['count']} of {messages} messages received")
    if consumed["duplicates"] or consumed["strays"]:
        problems.append(f"{consumed['duplicates']} duplicates, {consumed['strays']} strays")
    sent, got = array("q"), array("q")
    sent.frombytes(produced["seqs"])
    got.frombytes(consumed["seqs"])
    wrong = [k for k in range(messages) if got[k] and got[k] != sent[k]]
    for k in wrong[:5]:
        problems.append(f"index {k}: received as seq {got[k]}, its SEND returned {sent[k]}")
    if len(wrong) > 5:
        problems.append(f"... {len(wrong)} messages received with another sequence number")
    return problems[:MAX_PROBLEMS]


def broker_order_problems(trace_dir: Path) -> list[str]:
    """Per conversation, the receiving broker's ``received`` events (in commit order) must
    have increasing sequence numbers (R-DLG-1). Nothing to check without traces."""
    if not trace_dir.is_dir():
        return []
    last: dict[str, int] = {}
    problems: list[str] = []
    for event in read_events(segment_files([trace_dir])):
        if event.get("event") != "received":
            continue
        conversation, seq = str(event.get("conversation_id")), int(event.get("seq", 0))
        if seq <= last.get(conversation, 0) and len(problems) < MAX_PROBLEMS:
            problems.append(
                f"broker order: conversation {conversation} received seq {seq} after "
                f"{last[conversation]}"
            )
        last[conversation] = max(seq, last.get(conversation, 0))
    return problems
