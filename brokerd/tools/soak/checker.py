"""The independent checker: reads only the ledgers the producers and the consumer
applications wrote (:mod:`.records`), never the daemons, and reports violations of
exactly once in order (SPEC R-DLG-1).

A consumer's batch is *committed* if its ``K`` line is there, *rolled back* if its
``A`` line is, also rolled back if it has neither and no ``P`` line either (the consumer
died, or lost its connection, before it asked for the COMMIT: its messages must come
again, and one that never does is a loss), and otherwise (``P`` but no outcome: the
consumer died between asking for the COMMIT and learning its outcome) rolled back if
any of its messages was received again later in that ledger, committed if none was.
Over the committed batches:

* **loss**: a SEND whose commit was acknowledged (``C``), or a reply sent in a
  committed batch, that was never received;
* **duplicate**: a (key, index) received in two committed batches;
* **reorder**: within a key, an index received after a greater one;
* **corrupt**: a payload that does not match its length and checksum;
* **phantom**: a body that is not a soak body, or names a (key, index) that no
  producer tried to send, or that a SEND refused by the daemon (or rolled back with
  its transaction) carried, or a reply
  to a request that was not received;
* **dialog_error**: an Error or EndDialog message the applications did not cause;
* **misdelivered**: a message received on another conversation than the other messages
  of its key (each key is one dialog: all its messages come on one conversation
  handle, whichever consumer takes them, across restarts and failovers).

Besides the totals, the verdict counts the same per stream (:func:`.records.stream_of`):
``local`` (the dialogs inside one database of A, direct delivery) and ``remote`` (the
dialogs between A and B), so a reader sees each was exercised and where a violation is.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brokerd.tools.soak.consumer import REPLY, is_reply, wants_reply
from brokerd.tools.soak.records import stream_of

Key = tuple[str, int]
HANDLE_TEXT = 36
"""Characters of a conversation handle as a ledger writes it (a UUID)."""
LOCAL_CONSUMER_PREFIX = "l"
"""The local queues' consumers are named ``l1`` and ``l2`` (ledgers ``received-l*.log``)."""


@dataclass
class _Batch:
    position: int
    records: list[tuple[str, int, bool, str]] = field(default_factory=list)
    """(key, index, intact, conversation handle: empty in a ledger that did not say)"""
    others: list[str] = field(default_factory=list)
    state: str = "unknown"
    committing: bool = False
    """Its ``P`` line is there: the consumer asked for the COMMIT."""


@dataclass
class Verdict:
    committed_sends: int = 0
    uncertain_sends: int = 0
    refused_sends: int = 0
    received: int = 0
    replies_expected: int = 0
    batches: dict[str, int] = field(default_factory=dict)
    violations: dict[str, list[str]] = field(default_factory=dict)
    streams: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per stream (``local``, ``remote``): the counts above and ``violations`` (their number)."""

    @property
    def clean(self) -> bool:
        return not any(self.violations.values())

    def summary(self, examples: int = 10) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "committed_sends": self.committed_sends,
            "uncertain_sends": self.uncertain_sends,
            "refused_sends": self.refused_sends,
            "received": self.received,
            "replies_expected": self.replies_expected,
            "batches": self.batches,
            "streams": self.streams,
            "violations": {k: len(v) for k, v in self.violations.items()},
            "examples": {k: v[:examples] for k, v in self.violations.items() if v},
        }


def _sent(workdir: Path) -> tuple[set[Key], set[Key], set[Key]]:
    tried: set[Key] = set()
    committed: set[Key] = set()
    refused: set[Key] = set()
    for path in sorted(workdir.glob("sent-*.log")):
        for line in path.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) != 3:
                continue  # a line cut short by the end of the file
            target = {"T": tried, "C": committed, "F": refused}.get(parts[0])
            if target is not None:
                target.add((parts[1], int(parts[2])))
    return tried, committed, refused


def _batches(path: Path) -> list[_Batch]:
    batches: dict[str, _Batch] = {}
    for n, line in enumerate(path.read_text().splitlines()):
        parts = line.split(" ")
        if len(parts) < 2:
            continue
        kind, name = parts[0], parts[1]
        batch = batches.setdefault(name, _Batch(n))
        whole = len(parts) == 5 or (len(parts) == 6 and len(parts[5]) == HANDLE_TEXT)
        if kind == "R" and whole and parts[4] in ("0", "1"):  # not a line cut short
            handle = parts[5] if len(parts) == 6 else ""
            batch.records.append((parts[2], int(parts[3]), parts[4] == "1", handle))
        elif kind == "X":
            batch.others.append(" ".join(parts[2:]))
        elif kind == "P":
            batch.committing = True
        elif kind == "K":
            batch.state = "committed"
        elif kind == "A":
            batch.state = "rolled back"
    ordered = sorted(batches.values(), key=lambda b: b.position)
    seen_later: set[Key] = set()
    for batch in reversed(ordered):
        keys = {(k, i) for k, i, _, _ in batch.records}
        if batch.state == "unknown":
            resolved = batch.committing and not keys & seen_later
            batch.state = "committed (resolved)" if resolved else "rolled back"
        seen_later |= keys
    return ordered


def _by_stream(keys: set[Key]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for key, _ in keys:
        out[stream_of(key)] += 1
    return out


def check(workdir: Path, reply_every: int) -> Verdict:
    verdict = Verdict()
    tried, committed, refused = _sent(workdir)
    verdict.committed_sends = len(committed)
    verdict.uncertain_sends = len(tried - committed - refused)
    verdict.refused_sends = len(refused)
    streams: dict[str, dict[str, int]] = {name: defaultdict(int) for name in ("local", "remote")}
    for name, keys in (
        ("committed_sends", committed),
        ("uncertain_sends", tried - committed - refused),
        ("refused_sends", refused),
    ):
        for stream, n in _by_stream(keys).items():
            streams[stream][name] = n
    v: dict[str, list[str]] = defaultdict(list)

    def flag(kind: str, key: str, text: str) -> None:
        v[kind].append(text)
        streams[stream_of(key)]["violations"] += 1

    def flag_other(path: Path, other: str) -> None:
        # Not a soak body, so no key: the stream is the queue's (received-l*.log: local).
        kind = "phantom" if other.startswith("unparseable") else "dialog_error"
        v[kind].append(f"{path.name}: {other}")
        local = path.name.startswith(f"received-{LOCAL_CONSUMER_PREFIX}")
        streams["local" if local else "remote"]["violations"] += 1

    accepted: dict[Key, int] = defaultdict(int)
    handles: dict[str, str] = {}
    """The conversation handle each key's messages were first received on."""
    states: dict[str, int] = defaultdict(int)
    for path in sorted(workdir.glob("received-*.log")):
        last: dict[str, int] = {}
        for batch in _batches(path):
            states[batch.state] += 1
            if batch.state == "rolled back":
                continue
            for other in batch.others:
                flag_other(path, other)
            for key, index, intact, handle in batch.records:
                verdict.received += 1
                streams[stream_of(key)]["received"] += 1
                accepted[(key, index)] += 1
                where = f"{path.name}: {key} #{index}"
                if handle:
                    first = handles.setdefault(key, handle)
                    if handle != first:
                        flag("misdelivered", key, f"{where} on conversation {handle}, not {first}")
                if accepted[(key, index)] > 1:
                    flag("duplicate", key, where)
                    continue
                if not intact:
                    flag("corrupt", key, where)
                if key in last and index < last[key]:
                    flag("reorder", key, f"{where} after #{last[key]}")
                last[key] = max(index, last.get(key, index))
    verdict.batches = dict(states)
    requests = {k for k in accepted if not is_reply(k[0])}
    expected = {(k + REPLY, i) for k, i in requests if wants_reply(k, i, reply_every)}
    verdict.replies_expected = len(expected)
    for stream, n in _by_stream(expected).items():
        streams[stream]["replies_expected"] = n
    for key, index in sorted(committed | expected):
        if (key, index) not in accepted:
            flag("loss", key, f"{key} #{index}")
    for key, index in sorted(accepted):
        if is_reply(key):
            if (key, index) not in expected:
                flag("phantom", key, f"reply {key} #{index} to a request never received")
        elif (key, index) not in tried or (key, index) in refused:
            flag("phantom", key, f"{key} #{index} was never sent")
    for kind in (
        "loss",
        "duplicate",
        "reorder",
        "corrupt",
        "phantom",
        "dialog_error",
        "misdelivered",
    ):
        verdict.violations[kind] = v.get(kind, [])
    counts = ("committed_sends", "uncertain_sends", "refused_sends", "received")
    verdict.streams = {
        name: {k: c.get(k, 0) for k in (*counts, "replies_expected", "violations")}
        for name, c in streams.items()
    }
    return verdict
