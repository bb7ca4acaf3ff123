"""The conversation endpoint state machine as data (SPEC §5), pure: no I/O, no endpoint.

An endpoint's state (``sys.conversation_endpoints.state``) follows from a few
facts about its dialog (:class:`Facts`). :data:`RULES` maps them to a state,
first match wins, and :data:`TRANSITIONS` lists every change of state that is
legal; :func:`next_state` applies both and refuses anything else with
:class:`IllegalTransition`. Tests walk every combination of facts and every
transition.

May import: the standard library only.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import NamedTuple


class State(enum.StrEnum):
    STARTED_OUTBOUND = "SO"
    """BEGIN DIALOG done, nothing sent yet."""
    STARTED_INBOUND = "SI"
    """Started by a peer whose first message has not fully arrived (fragmented or out of order)."""
    CONVERSING = "CO"
    DISCONNECTED_INBOUND = "DI"
    """The other side ended; this side may still receive but not send."""
    DISCONNECTED_OUTBOUND = "DO"
    """This side ended and waits for the other side."""
    ERROR = "ER"
    """An Error message is in the queue."""
    CLOSED = "CD"


class Facts(NamedTuple):
    """What an endpoint's state is computed from."""

    initiator: bool
    sent: bool
    """This side has sent a sequenced message (its send sequence is above 0)."""
    received: bool
    """The first message from the other side has been accepted in order."""
    ended_local: bool
    ended_remote: bool
    error_received: bool
    """The other side ended with an error (a sequenced Error message)."""
    broker_error: bool
    """The other side's broker refused the dialog (an unsequenced Error)."""
    settled: bool
    """Everything this side sent has been acknowledged and nothing is being committed."""


Rule = tuple[str, Callable[[Facts], bool], State]

RULES: tuple[Rule, ...] = (
    (
        "this side ended, and the other side's broker refused the dialog or the other "
        "side ended too with everything acknowledged",
        lambda f: f.ended_local and (f.broker_error or (f.ended_remote and f.settled)),
        State.CLOSED,
    ),
    (
        "this side ended an initiator's dialog before sending anything: the far side never "
        "heard of it, so there is no one to tell and nothing to wait for",
        lambda f: f.ended_local and f.initiator and not f.sent,
        State.CLOSED,
    ),
    ("this side ended", lambda f: f.ended_local, State.DISCONNECTED_OUTBOUND),
    ("an Error arrived", lambda f: f.broker_error or f.error_received, State.ERROR),
    ("the other side ended", lambda f: f.ended_remote, State.DISCONNECTED_INBOUND),
    ("the initiator has sent", lambda f: f.initiator and f.sent, State.CONVERSING),
    ("the initiator has not sent", lambda f: f.initiator, State.STARTED_OUTBOUND),
    ("the target has received the first message", lambda f: f.received, State.CONVERSING),
    ("the target waits for the first message", lambda f: True, State.STARTED_INBOUND),
)
"""Facts to state, first match wins."""

_S = State
TRANSITIONS: dict[State, frozenset[State]] = {
    _S.STARTED_OUTBOUND: frozenset(
        {_S.CONVERSING, _S.DISCONNECTED_OUTBOUND, _S.ERROR, _S.DISCONNECTED_INBOUND, _S.CLOSED}
    ),
    _S.STARTED_INBOUND: frozenset(
        {_S.CONVERSING, _S.DISCONNECTED_INBOUND, _S.DISCONNECTED_OUTBOUND, _S.ERROR, _S.CLOSED}
    ),
    _S.CONVERSING: frozenset(
        {_S.DISCONNECTED_INBOUND, _S.DISCONNECTED_OUTBOUND, _S.ERROR, _S.CLOSED}
    ),
    _S.DISCONNECTED_INBOUND: frozenset({_S.DISCONNECTED_OUTBOUND, _S.ERROR, _S.CLOSED}),
    _S.DISCONNECTED_OUTBOUND: frozenset({_S.CLOSED}),
    _S.ERROR: frozenset({_S.DISCONNECTED_OUTBOUND, _S.CLOSED}),
    _S.CLOSED: frozenset(),
}
"""Every legal change of state: a dialog only moves towards its end, never back."""


DELIVERING: frozenset[State] = frozenset(State) - {_S.DISCONNECTED_OUTBOUND, _S.CLOSED}
"""States in which what arrives for this side reaches its application's queue. After this
side's END (DO, then CD) nothing does: the other side's messages are acknowledged and
discarded, and its EndDialog or Error only completes the close (R-DLG-10)."""


class IllegalTransition(Exception):
    """A change of state that :data:`TRANSITIONS` does not allow."""


def _by_rules(facts: Facts) -> State:
    for _, applies, state in RULES:
        if applies(facts):
            return state
    raise AssertionError("the last rule always applies")  # pragma: no cover


def _index(facts: Facts) -> int:
    return sum(1 << i for i, fact in enumerate(facts) if fact)


_TABLE: tuple[State, ...] = tuple(
    _by_rules(Facts(*(bool(n >> i & 1) for i in range(len(Facts._fields)))))
    for n in range(1 << len(Facts._fields))
)
"""RULES evaluated once for every combination of facts, indexed by the facts as bits."""


def derive(facts: Facts) -> State:
    """The state ``facts`` call for (:data:`RULES`)."""
    return _TABLE[_index(facts)]


def state_of(
    initiator: bool,
    sent: bool,
    received: bool,
    ended_local: bool,
    ended_remote: bool,
    error_received: bool,
    broker_error: bool,
    settled: bool,
) -> State:
    """:func:`derive` for the hot path: the facts as arguments, no tuple built."""
    return _TABLE[
        initiator
        | sent << 1
        | received << 2
        | ended_local << 3
        | ended_remote << 4
        | error_received << 5
        | broker_error << 6
        | settled << 7
    ]


def check(current: State, new: State) -> State:
    """``new`` if it may follow ``current`` (:data:`TRANSITIONS`); else IllegalTransition."""
    if new is not current and new not in TRANSITIONS[current]:
        raise IllegalTransition(f"{current.value} -> {new.value} is not a legal transition")
    return new


def next_state(current: State, facts: Facts) -> State:
    """The state after ``current`` given ``facts``; IllegalTransition if it may not follow."""
    return check(current, derive(facts))
