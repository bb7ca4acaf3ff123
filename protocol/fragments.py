"""Fragmentation and reassembly of dialog messages (SPEC R-DLG-7).

A small message travels as one fragment, a large one as many; each fragment
names its index, the fragment count, its byte offset and the message length, so
the receiver can rebuild the message from fragments arriving in any order, with
duplicates, and a lost fragment can be resent alone.

The :class:`Reassembler` keeps partial messages in memory within explicit
bounds (largest message, bytes held, fragments held, messages held); a fragment that would break
a bound is refused with :class:`ReassemblyFull` (retriable: do not acknowledge
it, the sender will retransmit) and one that cannot belong to the message with
:class:`ReassemblyError`. The daemon does not hold partial messages in memory: it
stores each fragment with its message's row in status 2 (R-OBJ-3), takes only a
fragment of one cut of its message (:func:`extent_problem`) and counts what it holds in
:class:`~protocol.acks.AckState`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

from protocol.errors import LocalProtocolError, ReassemblyError, ReassemblyFull

DEFAULT_FRAGMENT_SIZE = 64 * 1024
MIN_FRAGMENT_SIZE = 1024
"""The least size a broker cuts a message of several fragments at (its smallest
``limits.fragment_size``), and so the least every fragment but the last of such a
message carries: a receiver that holds a message's fragments one stored row each takes
no message in more than one fragment per this many bytes (:func:`extent_problem`'s
``min_size``)."""
DEFAULT_MAX_HELD_FRAGMENTS = 65_536
"""Fragments a :class:`Reassembler` holds at most, all messages together. Each costs
about 200 bytes of bookkeeping besides its data, so a peer cutting messages into
fragments of a byte or two would otherwise make the memory held a hundred times
``max_held_bytes``; at the default fragment size this bound is 4 GiB of data."""


@dataclass(frozen=True, slots=True)
class FragmentSlice:
    index: int
    count: int
    offset: int
    data: bytes


def fragment_count(message_length: int, fragment_size: int) -> int:
    return max(1, -(-message_length // fragment_size))


def cut_size(index: int, offset: int, length: int) -> int:
    """The fragment size a fragment of a message of several was cut at: its offset over its
    index, or, for the first, its own length (every fragment but the last is whole)."""
    return offset // index if index else length


def extent_problem(
    index: int, count: int, offset: int, length: int, message_length: int, min_size: int = 1
) -> str | None:
    """Why a fragment (``length`` bytes at ``offset``, ``index`` of ``count``) of a
    message of ``message_length`` bytes is not one of a cut of that message at one size
    of at least ``min_size`` bytes, as every sender cuts (:func:`split_message`); None if
    it is. The size is the one the fragment shows (:func:`cut_size`): the fragments of a
    message then tile it exactly, and joined by index they are the message, never more
    nor less; with ``min_size`` (a daemon gives :data:`MIN_FRAGMENT_SIZE`) a message is
    at most one fragment per ``min_size`` bytes."""
    if count == 1:
        return None
    size = cut_size(index, offset, length)
    if size <= 0 or offset != index * size:
        return f"fragment {index} of {count} at offset {offset} is not at a multiple of a size"
    if size < min_size:
        return (
            f"fragment {index} of {count} is of a message cut at {size} bytes, below the "
            f"least fragment size of {min_size}"
        )
    if fragment_count(message_length, size) != count:
        return f"a message of {message_length} bytes cut at {size} bytes is not {count} fragments"
    if length != min(size, message_length - offset):
        return (
            f"fragment {index} of {count} cut at {size} bytes carries {length} bytes, "
            f"not {min(size, message_length - offset)}"
        )
    return None


def split_message(
    body: bytes, fragment_size: int = DEFAULT_FRAGMENT_SIZE
) -> Iterator[FragmentSlice]:
    """The fragments of ``body``; an empty body is one empty fragment."""
    if fragment_size <= 0:
        raise LocalProtocolError("fragment size must be positive")
    count = fragment_count(len(body), fragment_size)
    view = memoryview(body)
    for index in range(count):
        offset = index * fragment_size
        yield FragmentSlice(index, count, offset, bytes(view[offset : offset + fragment_size]))


def fragment_at(body: bytes, index: int, fragment_size: int) -> FragmentSlice:
    """One fragment of ``body`` (to resend it alone)."""
    if fragment_size <= 0:
        raise LocalProtocolError("fragment size must be positive")
    count = fragment_count(len(body), fragment_size)
    if not 0 <= index < count:
        raise LocalProtocolError(f"fragment {index} of a {count}-fragment message")
    offset = index * fragment_size
    return FragmentSlice(index, count, offset, body[offset : offset + fragment_size])


@dataclass
class _Partial:
    count: int
    length: int
    pieces: dict[int, tuple[int, bytes]] = field(default_factory=dict)
    held: int = 0


class Reassembler:
    """Rebuilds messages from fragments, in bounded memory."""

    def __init__(
        self,
        max_message_size: int = 100 * 1024 * 1024,
        max_held_bytes: int = 256 * 1024 * 1024,
        max_held_messages: int = 10_000,
        max_held_fragments: int = DEFAULT_MAX_HELD_FRAGMENTS,
    ) -> None:
        self.max_message_size = max_message_size
        self.max_held_bytes = max_held_bytes
        self.max_held_messages = max_held_messages
        self.max_held_fragments = max_held_fragments
        self.held_bytes = 0
        self.held_fragments = 0
        self._partials: dict[Hashable, _Partial] = {}

    @property
    def held_messages(self) -> int:
        return len(self._partials)

    def add(
        self, key: Hashable, index: int, count: int, offset: int, length: int, data: bytes
    ) -> bytes | None:
        """Store one fragment; the whole message once its last fragment is in, else None.

        A duplicate fragment is accepted and ignored. ``key`` identifies the message,
        e.g. (conversation id, initiator flag, sequence number).
        """
        if length > self.max_message_size:
            raise ReassemblyError(
                f"message of {length} bytes exceeds the limit of {self.max_message_size}"
            )
        if not 0 <= index < count or offset + len(data) > length or count > max(1, length):
            raise ReassemblyError(
                f"fragment {index}/{count} at offset {offset} (+{len(data)}) does not fit "
                f"a message of {length} bytes"
            )
        partial = self._partials.get(key)
        if partial is not None and (partial.count != count or partial.length != length):
            raise ReassemblyError(
                f"fragment says {count} fragments / {length} bytes, earlier ones said "
                f"{partial.count} / {partial.length}"
            )
        if count == 1:
            if offset != 0 or len(data) != length:
                raise ReassemblyError(f"single fragment of {len(data)} bytes, expected {length}")
            return data
        if partial is not None:
            known = partial.pieces.get(index)
            if known is not None:
                if known[0] != offset or len(known[1]) != len(data):
                    raise ReassemblyError(f"fragment {index} arrived twice with different extents")
                return None
        # Every bound is checked before any state changes: a refusal leaves none behind.
        if partial is None and len(self._partials) >= self.max_held_messages:
            raise ReassemblyFull(f"already reassembling {len(self._partials)} messages")
        if self.held_bytes + len(data) > self.max_held_bytes:
            raise ReassemblyFull(
                f"holding {self.held_bytes} bytes of partial messages; limit {self.max_held_bytes}"
            )
        if self.held_fragments >= self.max_held_fragments:
            raise ReassemblyFull(
                f"holding {self.held_fragments} fragments of partial messages; "
                f"limit {self.max_held_fragments}"
            )
        if partial is None:
            partial = _Partial(count, length)
            self._partials[key] = partial
        partial.pieces[index] = (offset, data)
        partial.held += len(data)
        self.held_bytes += len(data)
        self.held_fragments += 1
        if len(partial.pieces) < count:
            return None
        return self._complete(key, partial)

    def _complete(self, key: Hashable, partial: _Partial) -> bytes:
        self.discard(key)
        position = 0
        parts: list[bytes] = []
        for index in range(partial.count):
            offset, data = partial.pieces[index]
            if offset != position:
                raise ReassemblyError(f"fragment {index} at offset {offset}, expected {position}")
            parts.append(data)
            position += len(data)
        if position != partial.length:
            raise ReassemblyError(f"fragments hold {position} bytes, message has {partial.length}")
        return b"".join(parts)

    def received(self, key: Hashable) -> list[int]:
        """Indexes of the fragments held for a partial message (for acknowledgements)."""
        partial = self._partials.get(key)
        return sorted(partial.pieces) if partial else []

    def discard(self, key: Hashable) -> None:
        partial = self._partials.pop(key, None)
        if partial is not None:
            self.held_bytes -= partial.held
            self.held_fragments -= len(partial.pieces)
