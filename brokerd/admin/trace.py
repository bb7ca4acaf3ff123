"""``brokerctl trace CONVERSATION [SEQ]``: follow messages across the daemons' trace files.

Where is my message, and why did it wait? This reads the delivery traces
(docs/traces.md) of every daemon of a deployment, from the folders given or from
the daemons' configuration files (``[trace] directory``, by default
``<data_dir>/traces``), without Spark and without a running daemon, and prints the
path of each message of one conversation (or of message SEQ only): every step, on
which broker, when, how long after the step before, and why it waited that long
(the route's DELAYED reason, connections the far broker refused, retransmissions
after a missing acknowledgement, a forwarder, the queue until the application's
RECEIVE ...).

Reading is streaming and bounded: the segments are read line by line, a line is parsed
only when it names the conversation (or is a refused connection, which is only
counted), and at most :data:`MAX_EVENTS` events of the conversation are kept: past that
the command says so and asks for one SEQ. The writer's lines have no length limit of
their own (a ``discarded`` or ``ack_received`` event lists every message it concerns),
so a line is read in pieces of :data:`READ_PIECE` bytes: one longer than that is read
whole when its start names the conversation or a refused connection (where the writer
puts them), up to :data:`MAX_LINE` bytes; any other long line is passed over piece by
piece. A line that names the conversation and is not read (over :data:`MAX_LINE`) is
said on standard error, never dropped without a word; a line that does not parse (a
torn tail) is skipped.

The trace format is read here directly: JSON Lines, one event a line, in segments
``*.jsonl``, ``*.jsonl.open`` and, compacted, ``*.parquet`` (turned back into lines by
:mod:`brokerd.traces.columnar`, the one part of ``brokerd.traces`` that ``brokerd.admin``
may import) or, compacted by an earlier version, ``*.jsonl.gz``.
"""

from __future__ import annotations

import gzip
import json
import sys
import uuid
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from brokerd.errors import TraceNotFound
from brokerd.shown_text import one_line
from brokerd.traces import columnar
from brokerd.traces.names import (
    LIFE_ORDER,
    NOT_REGULAR,
    is_regular,
    later_names,
    latest_names,
    open_regular,
    regular_files,
    require_regular,
)

__all__ = ["Conversation", "TraceNotFound", "follow", "format_paths", "read_conversation"]

READ_PIECE = 1 << 20
"""Bytes of a line read at a time: a line no longer than this costs no more."""
MAX_LINE = 256 << 20
"""The longest line read whole (bytes): a ``discarded`` event listing some 30 million
messages. A longer one that names the conversation is said, and skipped."""
REFUSED = b'"connection_refused"'
"""What a refused connection's line holds (its event name)."""
MAX_EVENTS = 100_000
"""Events of one conversation kept at most; a longer one must be followed one SEQ at a time."""
MAX_REFUSALS = 100_000
"""Refused connections whose times are kept (to name the waits they explain)."""

SENDER_EVENTS = ("route_chosen", "delayed", "released")
"""Conversation events of the sending endpoint: part of each of its messages' paths."""
LISTING_EVENTS = ("ack_received", "discarded")
"""Events that name messages in ``seqs``."""
SETTLED = frozenset({"delivered", "received", "ack_received", "discarded"})
"""Events after which a message no longer waits for its far broker."""
TRAVEL = frozenset(
    {
        "message_sent",
        "enqueued",
        "fragment_sent",
        "retransmission",
        "fragment_received",
        "forwarded",
        "delivered",
        "received",
    }
)
"""Events that show where the message itself is."""
STAGE = {
    name: n
    for n, name in enumerate(
        (
            "dialog_begun",
            "message_sent",
            "enqueued",
            "delayed",
            "released",
            "route_chosen",
            "retransmission",
            "fragment_sent",
            "fragment_received",
            "duplicate",
            "dropped",
            "forwarded",
            "delivered",
            "ack_sent",
            "ack_received",
            "discarded",
            "received",
            "dialog_ended",
        )
    )
}
"""The life of a message: the order of events of one instant."""


@dataclass(frozen=True)
class Event:
    t: float
    ts: str
    instance: str
    name: str
    fields: dict[str, Any]

    def sort_key(self) -> tuple[float, int]:
        return (self.t, STAGE.get(self.name, len(STAGE)))


@dataclass
class Step:
    """One step of a message's path, with the wait before it and why."""

    event: Event
    wait: float
    why: str

    def view(self) -> dict[str, Any]:
        return {
            "ts": self.event.ts,
            "broker": self.event.instance,
            "event": self.event.name,
            "wait_seconds": round(self.wait, 6),
            "why": self.why,
            "detail": describe(self.event),
            **{k: v for k, v in self.event.fields.items() if k not in ("v", "instance", "ts")},
        }


@dataclass
class Path_:
    """One message's path: (initiator, seq) and its steps in time order."""

    initiator: bool
    seq: int
    steps: list[Step] = field(default_factory=list)
    waiting: str | None = None
    """Why it still waits after its last step, when the traces say (not delivered, and
    its sender could not reach the far broker since): :func:`add_refusals`."""

    @property
    def brokers(self) -> list[str]:
        """The brokers the message went through, sender to receiver (acknowledgements and
        routing aside)."""
        out: list[str] = []
        for s in self.steps:
            if s.event.name not in TRAVEL:
                continue
            if not out or out[-1] != s.event.instance:
                out.append(s.event.instance)
        return out

    def longest(self) -> Step | None:
        return max(self.steps[1:], key=lambda s: s.wait, default=None)

    def view(self) -> dict[str, Any]:
        return {
            "initiator": self.initiator,
            "seq": self.seq,
            "brokers": self.brokers,
            "steps": [s.view() for s in self.steps],
            "waiting": self.waiting,
        }


@dataclass
class Refusals:
    """Connections an instance could not open: per (instance, peer), the time, event number
    and reason of each (at most :data:`MAX_REFUSALS`; later ones are only counted)."""

    times: dict[tuple[str, str], list[tuple[float, int, str]]] = field(default_factory=dict)
    kept: int = 0
    uncounted: int = 0
    _texts: dict[str, str] = field(default_factory=dict)
    """Each reason text once: a link's reasons repeat (the same few attempts and delays)."""

    def add(self, e: Event) -> None:
        if self.kept >= MAX_REFUSALS:
            self.uncounted += 1
            return
        key = (e.instance, str(e.fields.get("peer", "")))
        reason = str(e.fields.get("reason", ""))
        reason = self._texts.setdefault(reason, reason)
        self.times.setdefault(key, []).append((e.t, _int(e.fields.get("n")) or 0, reason))
        self.kept += 1

    def between(
        self, instance: str, start: float, end: float, peers: set[str] | None = None
    ) -> tuple[int, str]:
        """Refusals on ``instance`` from ``start`` to ``end`` (of connections to ``peers``
        only, when given): how many, and the latest one's peer and reason (of one
        microsecond, the later by its event number: one instance's, ``n`` orders them)."""
        total = 0
        latest: tuple[float, int, str] | None = None
        for (where, peer), refusals in self.times.items():
            if where != instance or (peers is not None and peer not in peers):
                continue
            for t, n, why in refusals:
                if start <= t <= end:
                    total += 1
                    if latest is None or (t, n) > latest[:2]:
                        latest = (t, n, f"{peer}: {why}" if why else peer)
        return total, latest[2] if latest is not None else ""


# -- reading ----------------------------------------------------------------------------------


def segments(directories: Iterable[Path]) -> list[Path]:
    """Every trace segment under ``directories`` (searched recursively), each once: a
    directory named twice (two daemons' configurations naming the one they share, each
    relative to itself) is read once. What is not a regular file (a FIFO named like a
    segment) is said, and skipped unopened: reading it would wait for ever."""
    found: set[Path] = set()
    for directory in directories:
        if directory.is_file():
            found.add(directory.resolve())
            continue
        if not directory.is_dir():
            if directory.exists():
                _skipped(directory, NOT_REGULAR)
                continue
            raise TraceNotFound(f"{directory}: no such trace directory")
        for suffix in LIFE_ORDER:  # a segment renamed between two looks is found once
            found.update(p.resolve() for p in directory.rglob(f"*{suffix}"))
    return sorted(latest_names(regular_files(found, _skipped)))


def _skipped(path: Path, why: str) -> None:
    print(f"brokerctl trace: skipped {path}: {why}", file=sys.stderr)


def _lines(path: Path, wanted: Sequence[bytes] = ()) -> Iterator[bytes]:
    """The file's lines. A line over :data:`READ_PIECE` bytes is read whole only when its
    first piece holds one of ``wanted`` (the conversation's id, a refusal's event name),
    and at most :data:`MAX_LINE` bytes (:func:`_long_line`). A segment closed or compacted
    since it was listed is read under its new name; one that does not read (damaged, or
    deleted meanwhile by retention) is said, and skipped, as is one that is not a regular
    file (never opened)."""
    if not is_regular(path):
        _skipped(path, NOT_REGULAR)
        return
    if path.name.endswith(".parquet"):
        try:  # Arrow's errors are ValueErrors: a damaged file is said, and skipped
            for line in columnar.lines(path):  # a row group's lines are in memory already
                if len(line) <= MAX_LINE:
                    yield line
                elif any(w in line for w in wanted):
                    _over_long(path, len(line))
        except FileNotFoundError:
            _skipped(path, "deleted while the traces were read (retention)")
        except (OSError, ValueError) as exc:
            _skipped(path, f"not a readable segment ({exc})")
        return
    if not path.exists():  # closed, compacted or deleted since it was listed
        for later in later_names(path):
            if later.exists():
                yield from _lines(later, wanted)
                return
        _skipped(path, "deleted while the traces were read (retention)")
        return
    try:
        with _open(path) as f:
            while line := f.readline(READ_PIECE):
                if line.endswith(b"\n") or len(line) < READ_PIECE:  # whole, or a torn tail
                    if len(line) <= MAX_LINE:
                        yield line
                    elif any(w in line for w in wanted):
                        _over_long(path, len(line))
                    continue
                whole = _long_line(path, f, line, wanted)
                if whole is not None:
                    yield whole
    except FileNotFoundError:  # gone between the two: the next look finds where
        yield from _lines(path, wanted)
    except (OSError, EOFError, zlib.error) as exc:  # a gzip segment cut short, damaged
        _skipped(path, f"not a readable segment ({' '.join(str(exc).split())})")


def _long_line(path: Path, f: BinaryIO, head: bytes, wanted: Sequence[bytes]) -> bytes | None:
    """The rest of a line longer than :data:`READ_PIECE` whose first piece is ``head``,
    read piece by piece: the whole line if ``head`` holds one of ``wanted`` and the line
    is at most :data:`MAX_LINE` bytes, else None (the pieces passed over, each looked at
    for ``wanted``: a line that names them and is not read is said)."""
    keep = any(w in head for w in wanted)
    pieces = [head] if keep else []
    size = len(head)
    named = keep
    overlap = max((len(w) for w in wanted), default=1) - 1
    tail = head[len(head) - overlap :] if overlap else b""
    while True:
        piece = f.readline(READ_PIECE)
        size += len(piece)
        if not named and wanted:
            seen = tail + piece
            named = any(w in seen for w in wanted)
            tail = seen[len(seen) - overlap :] if overlap else b""
        if keep:
            if size <= MAX_LINE:
                pieces.append(piece)
            else:
                keep, pieces = False, []
        if not piece or piece.endswith(b"\n"):
            break
    if keep:
        return b"".join(pieces)
    if named:
        _over_long(path, size)
    return None


def _over_long(path: Path, size: int) -> None:
    """A line that names what is followed, not read for its length: said."""
    _skipped(
        path,
        f"a line of {size:,} bytes that names the conversation or a refused connection "
        f"is over {MAX_LINE:,} bytes: not read",
    )


def _open(path: Path) -> BinaryIO:
    """A plain segment, or one compacted into gzip by an earlier version, as it is read
    (a plain one opened without waiting: one made a FIFO since it was looked at raises
    ``OSError``)."""
    if path.name.endswith(".gz"):
        require_regular(path)
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open_regular(path)


def _event(raw: bytes) -> Event | None:
    try:
        d = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(d, dict):
        return None
    ts, name, instance = d.get("ts"), d.get("event"), d.get("instance")
    if not (isinstance(ts, str) and isinstance(name, str) and isinstance(instance, str)):
        return None
    try:
        t = datetime.fromisoformat(ts).timestamp()
    except ValueError:
        return None
    return Event(t, ts, instance, name, d)


@dataclass
class Conversation:
    """What the traces hold of one conversation (:func:`read_conversation`)."""

    events: list[Event] = field(default_factory=list)
    """Its events in time order (those one message's path can hold, when one is asked for)."""
    refusals: Refusals = field(default_factory=Refusals)
    """The deployment's refused connections."""
    seen: int = 0
    """Its events in the traces, kept or not."""
    lowest: int | None = None
    highest: int | None = None
    """The lowest and highest message sequence numbers among them."""


def read_conversation(
    files: Sequence[Path],
    conversation: uuid.UUID,
    limit: int = MAX_EVENTS,
    seq: int | None = None,
) -> Conversation:
    """The conversation's events from ``files`` in time order, and the refused connections;
    with ``seq``, only those message ``seq``'s path can hold (:func:`_on_path`), so that
    one message of a conversation of any length can be followed: ``limit`` counts what is
    kept."""
    needle = str(conversation).encode()
    found = Conversation()
    events, refusals = found.events, found.refusals
    first_acks: dict[tuple[str, bool], Event] = {}
    for path in files:
        for raw in _lines(path, (needle, REFUSED)):
            if needle in raw:
                e = _event(raw)
                if e is None or e.fields.get("conversation_id") != str(conversation):
                    continue
                found.seen += 1
                n = _int(e.fields.get("seq"))
                if n is not None and n > 0:
                    found.lowest = n if found.lowest is None else min(found.lowest, n)
                    found.highest = n if found.highest is None else max(found.highest, n)
                if seq is not None:
                    if e.name == "ack_sent":  # only the first to cover it is on the path
                        if (_int(e.fields.get("through")) or 0) >= seq:
                            key = (e.instance, bool(e.fields.get("initiator")))
                            known = first_acks.get(key)
                            if known is None or e.sort_key() < known.sort_key():
                                first_acks[key] = e
                        continue
                    if not _on_path(e, seq):
                        continue
                if len(events) >= limit:
                    more = "message" if seq is not None else "conversation"
                    raise TraceNotFound(
                        f"{more} {conversation}{'' if seq is None else f' {seq}'} has more "
                        f"than {limit:,} trace events"
                        + ("" if seq is not None else ": follow one message (give its SEQ)")
                    )
                events.append(e)
            elif b'"connection_refused"' in raw:
                e = _event(raw)
                if e is not None and e.name == "connection_refused":
                    refusals.add(e)
    events += first_acks.values()
    events.sort(key=Event.sort_key)
    return found


def _on_path(e: Event, seq: int) -> bool:
    """Whether ``e`` can be a step of message ``seq``'s path (:func:`_path`): its own
    events, those that list it, and the sending endpoint's routing events."""
    if _int(e.fields.get("seq")) == seq:
        return True
    if e.name in LISTING_EVENTS:
        return seq in _seqs(e)
    return e.name in SENDER_EVENTS


# -- paths and reasons -------------------------------------------------------------------------


def _seqs(e: Event) -> set[int]:
    text = e.fields.get("seqs")
    if not isinstance(text, str):
        return set()
    return {int(s) for s in text.split(",") if s.strip().isdigit()}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def paths(events: Sequence[Event], seq: int | None = None) -> list[Path_]:
    """Each message's path (only message ``seq``'s, in both directions, when given)."""
    keys = sorted(
        {
            (bool(e.fields.get("initiator")), n)
            for e in events
            if (n := _int(e.fields.get("seq"))) is not None and n > 0
        },
        key=lambda k: (not k[0], k[1]),
    )
    if seq is not None:
        keys = [k for k in keys if k[1] == seq]
    return [_path(events, initiator, n) for initiator, n in keys]


def _path(events: Sequence[Event], initiator: bool, n: int) -> Path_:
    """The steps of message (``initiator``, ``n``): its own events, the acknowledgements and
    discards that list it, the first acknowledgement sent for it, and the sending endpoint's
    routing events from its SEND until it is acknowledged (and the DELAYED state it was
    sent in)."""
    mine = [e for e in events if bool(e.fields.get("initiator")) == initiator]
    sent = next(
        (e for e in mine if e.name == "message_sent" and _int(e.fields.get("seq")) == n), None
    )
    chosen: list[Event] = []
    routing_before: Event | None = None
    acked_on: set[str] = set()
    for e in mine:
        if _int(e.fields.get("seq")) == n or (e.name in LISTING_EVENTS and n in _seqs(e)):
            chosen.append(e)
        elif e.name == "ack_sent" and (_int(e.fields.get("through")) or 0) >= n:
            if e.instance not in acked_on and any(c.name == "delivered" for c in chosen):
                acked_on.add(e.instance)
                chosen.append(e)
        elif e.name in SENDER_EVENTS and sent is not None and e.instance == sent.instance:
            if e.t < sent.t:
                routing_before = e
            else:
                chosen.append(e)
    if routing_before is not None and routing_before.name == "delayed":
        chosen.insert(0, routing_before)  # sent while the conversation was DELAYED
    settled = [e.sort_key() for e in chosen if e.name in LISTING_EVENTS]
    if settled:
        # acknowledged (or discarded): routing the conversation later is other messages'
        # story, not a wait of this one
        over = min(settled)
        chosen = [e for e in chosen if e.name not in SENDER_EVENTS or e.sort_key() <= over]
    chosen.sort(key=Event.sort_key)
    path = Path_(initiator, n)
    previous: Event | None = None
    for e in chosen:
        wait = e.t - previous.t if previous is not None else 0.0
        path.steps.append(Step(e, max(wait, 0.0), _why(e, previous)))
        previous = e
    return path


def _why(e: Event, before: Event | None) -> str:
    f = e.fields
    n = e.name
    if n == "message_sent":
        return "the application's SEND"
    if before is None:
        return "sent while the conversation was DELAYED" if n == "delayed" else "first step seen"
    if n == "enqueued":
        return "the SEND committed: into the transmission queue"
    if n == "delayed":
        return f"no route: {f.get('reason', 'DELAYED')}"
    if n == "released":
        return "DELAYED until a route was found (the route was retried)"
    if n == "route_chosen":
        return "routing decided"
    if n == "fragment_sent":
        attempt = _int(f.get("attempt")) or 1
        if attempt > 1:
            return "sent again"
        if before.name in ("delayed", "released"):
            return "waited DELAYED, without a route"
        return "waited its turn in the transmission queue"
    if n == "retransmission":
        return "no acknowledgement came within the retry wait"
    if n == "fragment_received":
        if f.get("peer") == "local" and before.name in ("fragment_sent", "retransmission"):
            return "handed to the target database in the same broker (a LOCAL route)"
        if e.instance == before.instance:
            return "arrived again"
        return f"on the network from {before.instance}"
    if n == "forwarded":
        return f"held by the forwarder {e.instance} (hop {f.get('hop')})"
    if n == "dropped":
        return f"dropped, not acknowledged: {f.get('reason', '')} (the sender retries)"
    if n == "duplicate":
        return "a copy arrived again: its acknowledgement was lost or late"
    if n == "delivered":
        return "reassembled and stored in its queue (after any earlier message of the dialog)"
    if n == "ack_sent":
        return "acknowledged once stored"
    if n == "ack_received":
        return "the acknowledgement reached the sender: removed from its transmission queue"
    if n == "received":
        return "waited in the queue for the application's RECEIVE"
    if n == "discarded":
        return f"discarded: {f.get('reason', '')}"
    return n.replace("_", " ")


def far_brokers(instance: str, initiator: bool, events: Iterable[Event]) -> set[str]:
    """The addresses the sending endpoint (``initiator``'s side on ``instance``) sent to
    (``peer``) or was routed to (``route_chosen``'s ``address``: a mirrored route's
    principal, whose refusals send it to the partner): the only refused connections that
    explain a wait of its messages."""
    peers: set[str] = set()
    for e in events:
        if e.instance != instance or bool(e.fields.get("initiator")) != initiator:
            continue
        if e.name in ("fragment_sent", "retransmission"):
            address = e.fields.get("peer")
        elif e.name == "route_chosen":
            address = e.fields.get("address")
        else:
            continue
        if isinstance(address, str) and address:
            peers.add(address)
    return peers


def add_refusals(path: Path_, refusals: Refusals, events: Sequence[Event] = ()) -> None:
    """Name refused connections as the reason of the waits they explain (a first send or a
    retransmission that waited while the sender could not reach the far broker, and the
    wait since the last step of a message not delivered: refusals of connections to other
    brokers explain nothing of it; ``events``, the conversation's, name the far brokers,
    :func:`far_brokers`, worked out once per sending instance)."""
    if not refusals.times or not path.steps:
        return
    known: dict[str, set[str]] = {}

    def far(instance: str, step: Event | None = None) -> set[str] | None:
        if instance not in known:
            known[instance] = far_brokers(instance, path.initiator, events)
        peers = known[instance] | far_brokers(instance, path.initiator, (step,) if step else ())
        return peers or None  # none named: every refusal of the sending broker may explain

    for n, step in enumerate(path.steps):
        if n == 0 or step.event.name not in ("fragment_sent", "retransmission"):
            continue
        instance = step.event.instance
        start = path.steps[n - 1].event.t
        count, reason = refusals.between(instance, start, step.event.t, far(instance, step.event))
        if count:
            step.why = (
                f"waited for a connection: the far broker could not be reached "
                f"({count} connection(s) refused; {reason})"
            )
    sent = next((s.event for s in path.steps if s.event.name == "message_sent"), None)
    if sent is None or any(s.event.name in SETTLED for s in path.steps):
        return
    # not delivered: it still waits for the far broker (retransmitted once it is back)
    count, reason = refusals.between(
        sent.instance, path.steps[-1].event.t, float("inf"), far(sent.instance)
    )
    if count:
        path.waiting = (
            f"waiting for a connection: the far broker could not be reached "
            f"({count} connection(s) refused; {reason})"
        )


def describe(e: Event) -> str:
    """What the event says, in a few words."""
    f = e.fields
    parts: list[str] = []
    for key, label in (
        ("attempt", "attempt"),
        ("fragment", "fragment"),
        ("size", "bytes"),
        ("hop", "hop"),
        ("through", "through"),
        ("seqs", "seqs"),
        ("route", "route"),
        ("step", "step"),
        ("address", "to"),
        ("peer", "peer"),
        ("queue", "queue"),
        ("wait", "next try in s"),
        ("reason", "reason"),
    ):
        if key in f and f[key] not in (None, ""):
            parts.append(f"{label} {f[key]}")
    return ", ".join(parts)


# -- the command ---------------------------------------------------------------------------------


def follow(directories: Sequence[Path], conversation: str, seq: int | None = None) -> list[Path_]:
    """Every path of ``conversation`` (message ``seq`` only, when given) in ``directories``."""
    try:
        cid = uuid.UUID(conversation)
    except ValueError:
        raise TraceNotFound(f"{conversation!r} is not a conversation id (a UUID)") from None
    files = segments(directories)
    if not files:
        shown = ", ".join(str(d) for d in directories)
        raise TraceNotFound(f"no trace segments (*.jsonl) under {shown}")
    read = read_conversation(files, cid, seq=seq)
    if not read.seen:
        raise TraceNotFound(
            f"conversation {cid}: no trace event in {len(files)} segment(s) of "
            f"{', '.join(str(d) for d in directories)} (unknown here, not sampled, or its "
            f"segments deleted)"
        )
    found = paths(read.events, seq)
    if not found:
        if read.lowest is None:
            raise TraceNotFound(
                f"conversation {cid}: no message in the traces ({read.seen} event(s) of it: "
                "begun, nothing sent yet?)"
            )
        have = f"it has messages {read.lowest}..{read.highest}"
        raise TraceNotFound(f"conversation {cid}: no message {seq} in the traces ({have})")
    for p in found:
        add_refusals(p, read.refusals, read.events)
    return found


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    return f"{seconds * 1000:.1f} ms"


def format_paths(conversation: str, found: Sequence[Path_]) -> str:
    """The paths as text: a header per message, one line per step, the longest wait; a
    control character (an escape sequence in a reason) is shown as an escape
    (:func:`brokerd.shown_text.one_line`)."""
    lines: list[str] = []
    for p in found:
        side = "initiator" if p.initiator else "target"
        lines.append(
            f"conversation {conversation} message {p.seq} (sent by the {side}): "
            f"{' -> '.join(p.brokers)}"
        )
        width = max((len(s.event.instance) for s in p.steps), default=6)
        ename = max((len(s.event.name) for s in p.steps), default=10)
        for s in p.steps:
            wait = f"+{_duration(s.wait)}" if s is not p.steps[0] else ""
            detail = describe(s.event)
            lines.append(
                f"  {s.event.ts}  {wait:>11}  {s.event.instance:<{width}}  "
                f"{s.event.name:<{ename}}  {s.why}" + (f" [{detail}]" if detail else "")
            )
        first, last = p.steps[0].event, p.steps[-1].event
        summary = f"  {_duration(last.t - first.t)} from first to last step"
        sent = next((s.event for s in p.steps if s.event.name == "message_sent"), None)
        delivered = next((s.event for s in p.steps if s.event.name == "delivered"), None)
        if sent and delivered:
            summary += f"; SEND to delivery {_duration(delivered.t - sent.t)}"
        elif sent:
            summary += "; not delivered in these traces"
            if p.waiting:
                summary += f"; {p.waiting}"
        longest = p.longest()
        if longest is not None and longest.wait > 0:
            summary += (
                f"; longest wait {_duration(longest.wait)} before {longest.event.name} on "
                f"{longest.event.instance}: {longest.why}"
            )
        lines.append(summary)
        lines.append("")
    # what the traces say came partly from the network (a peer's Close reason, in a
    # refusal's): each line one line, its control characters as escapes, as in a view
    return "\n".join(one_line(line) for line in lines).rstrip() + "\n"


def directories_of(traces: Sequence[str] | None, configs: Sequence[str] | None) -> list[Path]:
    """The trace folders to read: the ``traces`` folders, and each configuration file's
    ``[trace] directory``."""
    directories = [Path(d) for d in traces or []]
    files = list(configs or [])
    if files:
        from brokerd.config import load_config
        from brokerd.errors import BrokerError

        for path in files:
            try:
                config = load_config(path)
            except (BrokerError, OSError, ValueError) as exc:
                raise TraceNotFound(str(exc)) from None
            if config.trace.directory is not None:
                directories.append(config.trace.directory)
    if not directories:
        raise TraceNotFound(
            "no traces to read: give --traces DIR or --config FILE (once per daemon)"
        )
    return directories


def run(
    conversation: str,
    seq: int | None,
    traces: Sequence[str] | None,
    configs: Sequence[str] | None,
    as_json: bool,
) -> None:
    """``brokerctl trace``: print the paths (text, or JSON with ``as_json``)."""
    found = follow(directories_of(traces, configs), conversation, seq)
    if as_json:
        print(json.dumps([p.view() for p in found], indent=1, default=str))
    else:
        sys.stdout.write(format_paths(conversation, found))
