"""The messages RECEIVE may hand out, per queue and conversation group (R-OBJ-3 status 1).

A :class:`ReadyIndex` keeps, for one queue, each conversation group's ready
messages in the order they became ready, oldest group first, and which groups
are locked. RECEIVE takes messages of one unlocked group and locks it
(Service Broker's conversation group lock), or of several groups, each locked
(``groups``, SPEC §6); a lease
(``brokerd.dialogs.endpoints.database.Lease``) holds that lock until the messages are
removed by a commit, or put back, in front and in order, by a rollback. GET
CONVERSATION GROUP locks the oldest unlocked group with ready messages the same
way, with a lease that holds no message (SPEC §6).

A group a MOVE CONVERSATION moves a conversation into is not taken from until the
MOVE's commit is done: if it fails, the messages go back whole to the group they came
from, none of them in a reader's hands. A group whose conversation has an Error on its
way into the queue (accepted, its commit not done) is not taken from either: the Error
goes ahead of the conversation's waiting messages once it is ready (R-DLG-10), so
nothing of the group is handed out before it.

A conversation quarantined by poison-message handling (SPEC §6) has its ready
messages *set aside*: kept in order, out of every group, so that no RECEIVE takes
them, while the other conversations of its group and queue flow; the ones that become
ready (or are put back) later join them, until it is released.

A conversation whose END CONVERSATION is committing takes nothing back: what a rollback
gives back of it meanwhile waits for that END's outcome (``ending``), gone if it commits,
ready again in front of its group if it fails (the file still holds it).
"""

from __future__ import annotations

import asyncio
import enum
import uuid
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from protocol.dialog import DIALOG_TIMER, ERROR

Item = tuple[uuid.UUID, int]
"""(conversation handle, message sequence number)"""


class Rank(enum.IntEnum):
    """A message's place in its conversation's ready order (R-DLG-10): a DialogTimer, then
    an Error, comes before the conversation's other waiting messages; everything else,
    EndDialog included, keeps the order it became ready in (sequence order, R-DLG-1)."""

    TIMER = 0
    ERROR = 1
    IN_SEQUENCE = 2


_RANK_OF_TYPE = {DIALOG_TIMER: Rank.TIMER, ERROR: Rank.ERROR}


def rank_of(message_type: str) -> Rank:
    """A message's rank by its type. Only the broker sends DialogTimer and Error messages
    (SPEC §6), so the type says what the message is."""
    return _RANK_OF_TYPE.get(message_type, Rank.IN_SEQUENCE)


@dataclass
class ReadyIndex:
    """Messages of one queue that RECEIVE may hand out: group -> [(handle, seq)] in order."""

    groups: OrderedDict[uuid.UUID, list[Item]] = field(default_factory=OrderedDict)
    locked: set[uuid.UUID] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    count: int = 0
    ahead: dict[Item, Rank] = field(default_factory=dict)
    """The rank of ready messages that go ahead (TIMER, ERROR); the others are IN_SEQUENCE."""
    errors_coming: dict[uuid.UUID, int] = field(default_factory=dict)
    """Groups with an Error accepted and not yet committed, and how many: not taken from."""
    moves_coming: dict[uuid.UUID, int] = field(default_factory=dict)
    """Groups a MOVE CONVERSATION moved a conversation into, its commit not done, and how
    many: not taken from (a failed MOVE takes the messages back)."""
    aside: dict[uuid.UUID, list[Item]] = field(default_factory=dict)
    """Quarantined conversations (SPEC §6) -> their ready messages, in order, set aside."""
    leased: set[Item] = field(default_factory=set)
    """Messages a RECEIVE has taken (its lease holds them) and no commit removed nor
    rollback put back yet: still ready in the file, so a reload of the index from it
    (``Database.load_received``) leaves them out (R-DLG-1: they are the lease's)."""
    ending: dict[uuid.UUID, list[tuple[uuid.UUID, list[Item]]]] = field(default_factory=dict)
    """Conversations whose END CONVERSATION is committing (:meth:`end_begins`) -> what a
    rollback gave back meanwhile, (group, messages) in the order given back: the
    conversation no longer takes them back, but they are in the file until the END
    commits (:meth:`end_settled`)."""
    ending_arrivals: dict[uuid.UUID, list[tuple[uuid.UUID, int, Rank]]] = field(
        default_factory=dict
    )
    """Conversations whose END CONVERSATION is committing -> the messages of the other
    side that committed meanwhile, (group, number, rank) in order (:meth:`arrived_ending`):
    the END's commit removes them, and a failed END makes them ready."""
    waiting: int = 0
    """RECEIVEs and GET CONVERSATION GROUPs waiting on this queue for something to take
    (``tasks_waiting`` of Service Broker's queue monitor)."""
    last_empty: float = float("-inf")
    """When (the event loop's clock) a RECEIVE or GET CONVERSATION GROUP limited to no
    conversation or group last came back empty (``last_empty_rowset_time``)."""

    @property
    def readers(self) -> int:
        """The queue's readers as the daemon sees them: RECEIVEs waiting on it, and the
        conversation groups held by a reader (a RECEIVE being read and removed, or a
        transaction that received and has not ended yet)."""
        return self.waiting + len(self.locked)

    def error_coming(self, group: uuid.UUID) -> None:
        """An Error of a conversation of ``group`` is accepted; its commit is not done. The
        endpoint shows ER already, so RECEIVE takes nothing of the group until the Error
        is ready (:meth:`add`) or its commit failed (:meth:`error_settled` either way)."""
        _count(self.errors_coming, group, 1)

    def error_settled(self, group: uuid.UUID) -> None:
        """The Error :meth:`error_coming` announced is ready, or will not be."""
        _count(self.errors_coming, group, -1)
        self.changed.set()

    def add(
        self, group: uuid.UUID, handle: uuid.UUID, seq: int, rank: Rank = Rank.IN_SEQUENCE
    ) -> None:
        """A message becomes ready: after the group's others, unless its ``rank`` puts it
        before its conversation's messages of a higher rank (R-DLG-10). A quarantined
        conversation's message is set aside instead."""
        aside = self.aside.get(handle) if self.aside else None
        items = aside if aside is not None else self.groups.setdefault(group, [])
        item = (handle, seq)
        if rank is Rank.IN_SEQUENCE:
            items.append(item)
        else:
            self.ahead[item] = rank
            ahead = self.ahead
            at = next(
                (
                    i
                    for i, other in enumerate(items)
                    if other[0] == handle and ahead.get(other, Rank.IN_SEQUENCE) > rank
                ),
                len(items),
            )
            items.insert(at, item)
        if aside is None:
            self.count += 1
            self.changed.set()

    def take(
        self,
        top: int,
        handle: uuid.UUID | None,
        group: uuid.UUID | None,
        owned: Collection[uuid.UUID] = (),
    ) -> tuple[uuid.UUID, list[Item]] | None:
        """Up to ``top`` messages of one group, oldest group first, and lock the group.

        ``group`` limits it to that group (RECEIVE for one conversation group, or for
        ``handle``'s); ``handle`` to that conversation's messages. Locked groups are
        skipped unless they are among ``owned`` (the caller's transaction holds them
        already).
        """
        candidates: Iterable[tuple[uuid.UUID, list[Item]]] = self.groups.items()
        if group is not None:
            of_group = self.groups.get(group)
            candidates = () if of_group is None else ((group, of_group),)
        for gid, items in candidates:
            if not self.takeable(gid, owned):
                continue
            if handle is not None:
                chosen = [item for item in items if item[0] == handle][:top]
                if not chosen:
                    continue
                chosen_set = set(chosen)
                rest = [item for item in items if item not in chosen_set]
            else:
                # The group's head: no scan of (or hash per) message behind it, so a
                # RECEIVE costs what it takes, not what waits (a backlog of any size).
                chosen = items[:top]
                del items[:top]
                rest = items
            if rest:
                self.groups[gid] = rest
            else:
                del self.groups[gid]
            self.count -= len(chosen)
            self.leased.update(chosen)
            self.lock(gid)
            return gid, chosen
        return None

    def take_groups(
        self, top: int, groups: int, owned: Collection[uuid.UUID] = ()
    ) -> list[tuple[uuid.UUID, list[Item]]]:
        """RECEIVE of several conversation groups (SPEC §6): up to ``groups`` groups that
        :meth:`takeable` allows, oldest first, each one's messages from its head and in
        order, up to ``top`` messages in all; every group taken is locked, as
        :meth:`take` locks one. Empty when nothing can be taken."""
        chosen: list[tuple[uuid.UUID, list[Item]]] = []
        left = top
        for gid, items in self.groups.items():
            if len(chosen) >= groups or left <= 0:
                break
            if items and self.takeable(gid, owned):
                taken = items[:left]
                chosen.append((gid, taken))
                left -= len(taken)
        for gid, taken in chosen:
            items = self.groups[gid]
            del items[: len(taken)]
            if not items:
                del self.groups[gid]
            self.count -= len(taken)
            self.leased.update(taken)
            self.lock(gid)
        return chosen

    def takeable(self, group: uuid.UUID, owned: Collection[uuid.UUID] = ()) -> bool:
        """Whether a reader may take from ``group`` now: it is not locked by another
        transaction (``owned``: the groups the reader's transaction holds already), no
        MOVE into it is committing and no Error of it is on its way in (R-DLG-10)."""
        if group in self.locked and group not in owned:
            return False
        if self.moves_coming and group in self.moves_coming:
            return False
        return not (self.errors_coming and group in self.errors_coming)

    def next_group(self, owned: Collection[uuid.UUID] = ()) -> uuid.UUID | None:
        """GET CONVERSATION GROUP's choice (SPEC §6): the oldest group with ready messages
        that :meth:`takeable` allows, without locking it (:meth:`lock` does). None when
        there is none."""
        for gid, items in self.groups.items():
            if items and self.takeable(gid, owned):
                return gid
        return None

    def lock(self, group: uuid.UUID) -> None:
        """Lock ``group`` for a reader's transaction; a lease gives it back
        (``ReceiveVerbs.release``)."""
        self.locked.add(group)

    def put_back(self, group: uuid.UUID, items: list[Item]) -> None:
        """Return taken messages in front of their group, which moves to the front (those
        of a quarantined conversation in front of its messages set aside); a DialogTimer
        or Error that became ready while they were taken still goes ahead of its
        conversation's messages (R-DLG-10)."""
        if self.leased:
            self.leased.difference_update(items)
        if self.aside:
            back: dict[uuid.UUID, list[Item]] = {}
            kept = []
            for item in items:
                if item[0] in self.aside:
                    back.setdefault(item[0], []).append(item)
                else:
                    kept.append(item)
            for handle, taken in back.items():
                self.aside[handle] = _by_rank(taken + self.aside[handle], self.ahead)
            items = kept
            if not items:
                return
        self.groups[group] = _by_rank(items + self.groups.get(group, []), self.ahead)
        self.groups.move_to_end(group, last=False)
        self.count += len(items)
        self.changed.set()

    def received(self, items: list[Item]) -> None:
        """Taken messages are gone for good (a RECEIVE committed)."""
        if self.leased:
            self.leased.difference_update(items)
        if self.ahead:
            for item in items:
                self.ahead.pop(item, None)

    def clear(self) -> None:
        """Forget every ready message (they are loaded again); quarantined conversations
        stay quarantined, their messages set aside again as they are added. The messages
        leases hold (:attr:`leased`) stay theirs: the load leaves them out."""
        self.groups.clear()
        self.ahead.clear()
        self.errors_coming.clear()
        self.count = 0
        for handle in self.aside:
            self.aside[handle] = []

    def set_aside(self, handle: uuid.UUID) -> int:
        """Quarantine a conversation (SPEC §6): its ready messages leave their group, in
        order, and those that become ready later join them; returns how many."""
        if handle in self.aside:
            return len(self.aside[handle])
        moved: list[Item] = []
        for gid in list(self.groups):
            items = self.groups[gid]
            kept = [item for item in items if item[0] != handle]
            if len(kept) == len(items):
                continue
            moved += [item for item in items if item[0] == handle]
            if kept:
                self.groups[gid] = kept
            else:
                del self.groups[gid]
        self.count -= len(moved)
        self.aside[handle] = moved
        return len(moved)

    def release_aside(self, handle: uuid.UUID, group: uuid.UUID) -> int:
        """A quarantined conversation released: its messages set aside are ready again, in
        order, in front of its group; returns how many."""
        items = self.aside.pop(handle, [])
        if items:
            self.put_back(group, items)
        return len(items)

    def end_begins(self, handle: uuid.UUID) -> bool:
        """An END CONVERSATION of ``handle`` is committing: what a rollback gives back of it
        meanwhile waits for its outcome (:meth:`give_back_ending`). False if one already
        is (that one's outcome settles it)."""
        if handle in self.ending:
            return False
        self.ending[handle] = []
        return True

    def end_committing(self, handle: uuid.UUID) -> bool:
        """Whether an END CONVERSATION of ``handle`` is committing (:meth:`end_begins`,
        until :meth:`end_settled`)."""
        return handle in self.ending

    def give_back_ending(self, handle: uuid.UUID, group: uuid.UUID, items: list[Item]) -> bool:
        """Taken messages given back (a rollback) of a conversation that has ended; kept
        for the outcome of its END if that is committing (True), else gone (False)."""
        waiting = self.ending.get(handle)
        if waiting is None:
            return False
        waiting.append((group, items))
        return True

    def arrived_ending(
        self, handle: uuid.UUID, group: uuid.UUID, seqs: list[int], rank: Rank
    ) -> bool:
        """Messages ``seqs`` of ``handle`` committed into the queue (the last of ``rank``,
        the others in sequence) after its END CONVERSATION was applied and before that
        END's commit: kept for its outcome (True), or False if no END of it is
        committing."""
        if handle not in self.ending:
            return False
        kept = self.ending_arrivals.setdefault(handle, [])
        last = seqs[-1] if seqs else None
        kept += [(group, s, rank if s == last else Rank.IN_SEQUENCE) for s in seqs]
        return True

    def end_settled(self, handle: uuid.UUID, committed: bool) -> list[int]:
        """The END CONVERSATION of :meth:`end_begins` committed (what was given back
        meanwhile is gone with the conversation's rows) or failed (it is ready again, in
        front of its group; called after the END has put back its own, which come after
        them, and the messages that arrived meanwhile come last, in order). Returns the
        numbers of those arrived meanwhile (:meth:`arrived_ending`)."""
        given = self.ending.pop(handle, [])
        for group, items in given:
            if committed:
                self.received(items)
            else:
                self.put_back(group, items)
        arrived = self.ending_arrivals.pop(handle, [])
        if not committed:
            for group, seq, rank in arrived:
                self.add(group, handle, seq, rank)
        return [seq for _, seq, _ in arrived]

    def drop_conversation(self, handle: uuid.UUID) -> list[tuple[uuid.UUID, list[Item]]]:
        """Remove a conversation's ready messages (and those set aside, SPEC §6: the
        conversation stays quarantined until its quarantine is ended); returns the
        ready ones per group, for put_back."""
        if handle in self.aside:
            self.received(self.aside[handle])
            self.aside[handle] = []
        dropped: list[tuple[uuid.UUID, list[Item]]] = []
        for gid in list(self.groups):
            items = self.groups[gid]
            kept = [item for item in items if item[0] != handle]
            if len(kept) == len(items):
                continue
            gone = [item for item in items if item[0] == handle]
            dropped.append((gid, gone))
            self.received(gone)
            self.count -= len(items) - len(kept)
            if kept:
                self.groups[gid] = kept
            else:
                del self.groups[gid]
        return dropped

    def move_conversation(self, handle: uuid.UUID, old: uuid.UUID, new: uuid.UUID) -> None:
        """MOVE CONVERSATION: the conversation's ready messages join group ``new``; until
        :meth:`move_settled`, nothing of it is taken (its commit may fail, and the
        messages go back to ``old``: none of them may be in a reader's hands then, to be
        given back to ``new``)."""
        _count(self.moves_coming, new, 1)
        self._move(handle, old, new)

    def move_settled(self, group: uuid.UUID) -> None:
        """The MOVE into ``group`` of :meth:`move_conversation` committed, or failed and
        moved the messages back (:meth:`move_back`)."""
        _count(self.moves_coming, group, -1)
        self.changed.set()

    def move_back(self, handle: uuid.UUID, new: uuid.UUID, old: uuid.UUID) -> None:
        """A MOVE's commit failed: the conversation's ready messages go back to ``old``."""
        self._move(handle, new, old)
        self.move_settled(new)

    def _move(self, handle: uuid.UUID, old: uuid.UUID, new: uuid.UUID) -> None:
        items = self.groups.get(old, [])
        moving = [item for item in items if item[0] == handle]
        if not moving:
            return
        kept = [item for item in items if item[0] != handle]
        if kept:
            self.groups[old] = kept
        else:
            del self.groups[old]
        self.groups.setdefault(new, []).extend(moving)
        self.changed.set()


def _by_rank(items: list[Item], ahead: dict[Item, Rank]) -> list[Item]:
    """``items`` with each conversation's messages in order of rank (TIMER and ERROR ahead,
    R-DLG-10), each rank's in the order given; the places a conversation's messages take
    among the others stay its own."""
    if not ahead or not any(item in ahead for item in items):
        return items
    places: dict[uuid.UUID, list[int]] = {}
    for at, item in enumerate(items):
        places.setdefault(item[0], []).append(at)
    out = list(items)
    for at_list in places.values():
        ranked = sorted((items[at] for at in at_list), key=lambda i: ahead.get(i, Rank.IN_SEQUENCE))
        for at, item in zip(at_list, ranked, strict=True):
            out[at] = item
    return out


def _count(commits: dict[uuid.UUID, int], group: uuid.UUID, step: int) -> None:
    """One more (``step`` 1) or one fewer (-1) commit in flight that keeps readers off
    ``group`` (an Error on its way in, a MOVE into it); a group with none leaves
    ``commits``."""
    left = commits.get(group, 0) + step
    if left > 0:
        commits[group] = left
    else:
        commits.pop(group, None)
