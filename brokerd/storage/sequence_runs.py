"""Statements over many numbered messages of many conversations, as RECEIVE takes them.

Owns how the (conversation handle, sequence number) items of a RECEIVE become few
statements (:func:`by_sequence_numbers`): for one conversation, one ``BETWEEN`` per run
of consecutive numbers and one ``IN`` per thousand numbers alone; for several (a RECEIVE
of many conversation groups), one statement per :data:`SPANS_PER_STATEMENT` spans
(handle, first, last) joined on the primary key (:func:`in_spans`) (R-DLG-1: exactly the
messages taken, never a neighbour), and the statements of ``queue_messages`` and
``message_fragments`` that end in such a condition (:data:`REMOVE_MANY`,
:data:`RETAIN_MANY`, :data:`REMOVE_FRAGMENTS`; :func:`over_spans` for spans already cut,
:func:`by_conversation_keyed` for each handle's text with its integer). RECEIVE's writes
(``queries.received``) and its read, which removes as it reads
(``reads.read_received``), both build on them.

May import: ``brokerd.storage.schema``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from functools import lru_cache
from itertools import chain

from brokerd.storage.schema import Statement

REMOVE_MANY = (
    "DELETE FROM queue_messages WHERE conversation_handle = ? AND message_sequence_number "
)
"""RECEIVE: the messages taken leave their queue."""
RETAIN_MANY = (
    "UPDATE queue_messages SET status = 0 WHERE conversation_handle = ? "
    "AND message_sequence_number "
)
"""RECEIVE under RETENTION: the messages taken stay, with status 0."""
REMOVE_FRAGMENTS = (
    "DELETE FROM message_fragments WHERE conversation_handle = ? AND message_sequence_number "
)
"""RECEIVE: the fragments of the messages taken that were kept in them
(``schema.IN_FRAGMENTS``) leave with them."""


_OF_SPANS = {
    REMOVE_MANY: ("queue_messages", "DELETE FROM queue_messages WHERE rowid IN ({})"),
    RETAIN_MANY: ("queue_messages", "UPDATE queue_messages SET status = 0 WHERE rowid IN ({})"),
    REMOVE_FRAGMENTS: ("message_fragments", "DELETE FROM message_fragments WHERE rowid IN ({})"),
}
"""Each verb's form over many conversations: its table, and the statement around the
rowids :func:`in_spans` selects."""

SPANS_PER_STATEMENT = 256
"""Spans (handle, first, last) of one statement over many conversations (3 variables
each: far below SQLite's 32,766)."""

Span = tuple[str, int, int]
"""A conversation handle's text and a run of its sequence numbers, first to last."""


def by_sequence_numbers(verb: str, items: Sequence[tuple[uuid.UUID, int]]) -> list[Statement]:
    """``verb`` (a statement ending in ``... AND message_sequence_number ``) for ``items``.

    For one conversation: one ``BETWEEN`` per run of consecutive numbers and one ``IN``
    per thousand numbers alone. A run's range holds exactly its numbers, and SQLite
    walks it in the primary key's index without a parameter per number (a RECEIVE of
    700 messages read and removed in 3.2 µs a row, against 5.3 with ``IN`` lists). For
    several, one statement per :data:`SPANS_PER_STATEMENT` of their runs (a number
    alone is a run of one): a RECEIVE of a few messages of each of hundreds of
    conversations is a few statements, not one or two per conversation, each stepped
    with a GIL hand-off."""
    conversations = by_conversation(items)
    if len(conversations) > 1 and verb in _OF_SPANS:
        return over_spans(verb, span_chunks(conversations))
    statements: list[Statement] = []
    for key, seqs in conversations.items():
        statements += numbered(verb, key, seqs)
    return statements


def over_spans(verb: str, chunks: list[list[Span]]) -> list[Statement]:
    """``verb`` (one of :data:`REMOVE_MANY`, :data:`RETAIN_MANY`,
    :data:`REMOVE_FRAGMENTS`) over the spans of many conversations that
    :func:`span_chunks` cut, one statement a chunk: what :func:`by_sequence_numbers`
    makes of them, for a caller that has cut them already (RECEIVE reads the rows of
    the spans it then removes)."""
    table, around = _OF_SPANS[verb]
    return [
        (around.format(in_spans(table, len(chunk))), list(chain.from_iterable(chunk)))
        for chunk in chunks
    ]


def span_chunks(conversations: dict[str, list[int]]) -> list[list[Span]]:
    """The runs of every conversation's numbers as spans, :data:`SPANS_PER_STATEMENT` a
    chunk."""
    spans: list[Span] = []
    for key, seqs in conversations.items():
        if len(seqs) == 1:  # a group of one message (many dialogs taking turns)
            spans.append((key, seqs[0], seqs[0]))
            continue
        runs, alone = _runs(seqs)
        spans += [(key, first, last) for first, last in runs]
        spans += [(key, seq, seq) for seq in alone]
    return [spans[i : i + SPANS_PER_STATEMENT] for i in range(0, len(spans), SPANS_PER_STATEMENT)]


@lru_cache(maxsize=64)
def spans_join(table: str, count: int) -> str:
    """``table``'s rows (as ``r``) in ``count`` spans (handle, first, last): a ``VALUES``
    list joined on the primary key, each span a range of its index."""
    values = ", ".join(["(?, ?, ?)"] * count)
    return (
        f"(VALUES {values}) AS v JOIN {table} AS r ON r.conversation_handle = v.column1 "
        "AND r.message_sequence_number BETWEEN v.column2 AND v.column3"
    )


def in_spans(table: str, count: int) -> str:
    """The rowids of ``table``'s rows in ``count`` spans (:func:`spans_join`)."""
    return f"SELECT r.rowid FROM {spans_join(table, count)}"


def numbered(verb: str, key: str, seqs: list[int]) -> list[Statement]:
    """``verb`` for the numbers ``seqs`` of the conversation whose handle's text is ``key``
    (an empty ``verb``: the conditions alone, which a read appends to its own text)."""
    runs, alone = _runs(seqs)
    statements: list[Statement] = [
        (f"{verb}BETWEEN ? AND ?", [key, first, last]) for first, last in runs
    ]
    statements += [
        (f"{verb}IN ({','.join('?' * len(part))})", [key, *part]) for part in chunks(alone)
    ]
    return statements


def _runs(seqs: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """The runs (first, last) of two or more consecutive numbers in ``seqs``, and the
    numbers in no run (duplicates count once)."""
    runs: list[tuple[int, int]] = []
    alone: list[int] = []
    ordered = sorted(set(seqs))
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            if i - start > 1:
                runs.append((ordered[start], ordered[i - 1]))
            else:
                alone.append(ordered[start])
            start = i
    return runs, alone


def by_conversation(items: Sequence[tuple[uuid.UUID, int]]) -> dict[str, list[int]]:
    """The numbers of ``items`` per conversation handle's text, in their order."""
    return by_conversation_keyed(items)[0]


def by_conversation_keyed(
    items: Sequence[tuple[uuid.UUID, int]],
) -> tuple[dict[str, list[int]], dict[str, int]]:
    """:func:`by_conversation`, and each handle's text's integer (``UUID.int``): a reader
    that matches the rows it reads (handles as text) to ``items`` (UUIDs) needs not parse
    the text again (a UUID parsed from text is a Python call, per conversation)."""
    by_int: dict[int, tuple[uuid.UUID, list[int]]] = {}
    for handle, seq in items:
        entry = by_int.get(handle.int)
        if entry is None:
            entry = by_int[handle.int] = (handle, [])
        entry[1].append(seq)
    conversations: dict[str, list[int]] = {}
    ints: dict[str, int] = {}
    for handle_int, (handle, seqs) in by_int.items():
        text = str(handle)
        conversations[text] = seqs
        ints[text] = handle_int
    return conversations, ints


def chunks(seqs: list[int], size: int = 1000) -> list[list[int]]:
    """At most ``size`` sequence numbers per statement (SQLite allows 32,766 variables)."""
    return [seqs[i : i + size] for i in range(0, len(seqs), size)]
