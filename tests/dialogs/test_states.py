"""The endpoint state machine as data (SPEC §5), tested without I/O."""

from __future__ import annotations

import itertools

import pytest

from brokerd.dialogs.endpoints.states import (
    DELIVERING,
    RULES,
    TRANSITIONS,
    Facts,
    IllegalTransition,
    State,
    derive,
    next_state,
    state_of,
)

ALL_FACTS = [
    Facts(*values) for values in itertools.product((False, True), repeat=len(Facts._fields))
]


def test_every_state_has_a_transition_entry_and_closed_is_final() -> None:
    assert set(TRANSITIONS) == set(State)
    assert TRANSITIONS[State.CLOSED] == frozenset()
    for state, following in TRANSITIONS.items():
        assert state not in following


def test_every_combination_of_facts_gives_exactly_the_first_matching_rule() -> None:
    for facts in ALL_FACTS:
        matching = [state for _, applies, state in RULES if applies(facts)]
        assert matching, facts
        assert derive(facts) is matching[0]


@pytest.mark.parametrize(
    ("facts", "state"),
    [
        (Facts(True, False, False, False, False, False, False, True), State.STARTED_OUTBOUND),
        (Facts(True, True, False, False, False, False, False, False), State.CONVERSING),
        (Facts(False, False, False, False, False, False, False, True), State.STARTED_INBOUND),
        (Facts(False, False, True, False, False, False, False, True), State.CONVERSING),
        (Facts(False, False, True, False, True, False, False, True), State.DISCONNECTED_INBOUND),
        (Facts(True, True, False, True, False, False, False, False), State.DISCONNECTED_OUTBOUND),
        (Facts(True, True, False, True, True, False, False, True), State.CLOSED),
        (Facts(True, True, False, True, True, False, False, False), State.DISCONNECTED_OUTBOUND),
        (Facts(True, True, False, False, False, True, False, True), State.ERROR),
        (Facts(True, False, False, False, False, False, True, True), State.ERROR),
        (Facts(True, False, False, True, False, False, True, False), State.CLOSED),
        (Facts(True, False, False, True, False, False, False, True), State.CLOSED),
    ],
)
def test_the_states_service_broker_documents(facts: Facts, state: State) -> None:
    """SO before the first SEND, SI until the first message, CO, DI, DO waiting for the
    other side, CD once both ended and everything is acknowledged, ER on an Error; an
    initiator ended before its first SEND is CD at once (the far side never heard of it,
    SPEC §6)."""
    assert derive(facts) is state


def test_a_dialog_never_moves_back_towards_its_start() -> None:
    order = {
        State.STARTED_OUTBOUND: 0,
        State.STARTED_INBOUND: 0,
        State.CONVERSING: 1,
        State.DISCONNECTED_INBOUND: 2,
        State.ERROR: 2,
        State.DISCONNECTED_OUTBOUND: 3,
        State.CLOSED: 4,
    }
    for state, following in TRANSITIONS.items():
        for new in following:
            assert order[new] > order[state] or {state, new} <= {
                State.DISCONNECTED_INBOUND,
                State.ERROR,
            }, (state, new)


def test_next_state_refuses_what_the_table_does_not_list() -> None:
    conversing = Facts(True, True, False, False, False, False, False, True)
    with pytest.raises(IllegalTransition, match="CD -> CO"):
        next_state(State.CLOSED, conversing)
    started = Facts(True, False, False, False, False, False, False, True)
    with pytest.raises(IllegalTransition, match="CO -> SO"):
        next_state(State.CONVERSING, started)
    assert next_state(State.STARTED_OUTBOUND, conversing) is State.CONVERSING
    assert next_state(State.CONVERSING, conversing) is State.CONVERSING


def test_every_state_a_rule_gives_is_reachable_from_a_start() -> None:
    reachable = {State.STARTED_OUTBOUND, State.STARTED_INBOUND}
    frontier = list(reachable)
    while frontier:
        for new in TRANSITIONS[frontier.pop()]:
            if new not in reachable:
                reachable.add(new)
                frontier.append(new)
    assert {derive(f) for f in ALL_FACTS} <= reachable == set(State)


def test_the_hot_path_lookup_agrees_with_the_rules_for_every_combination() -> None:
    for facts in ALL_FACTS:
        by_rules = next(state for _, applies, state in RULES if applies(facts))
        assert state_of(*facts) is by_rules is derive(facts)


def test_what_arrives_is_delivered_exactly_until_this_side_ends() -> None:
    """R-DLG-10: the states a local END leads to (DO, CD) fence the application; every
    other state delivers."""
    for facts in ALL_FACTS:
        assert (derive(facts) in DELIVERING) is not facts.ended_local, facts


def test_every_legal_transition_is_driven_and_every_illegal_one_refused() -> None:
    """SPEC §5, exhaustively: from every state, every combination of facts either leads to
    a state the table lists (or stays), or is refused; and every listed transition is
    reached by some combination of facts."""
    driven: set[tuple[State, State]] = set()
    for current in State:
        for facts in ALL_FACTS:
            target = derive(facts)
            if target is current or target in TRANSITIONS[current]:
                assert next_state(current, facts) is target
                driven.add((current, target))
            else:
                with pytest.raises(IllegalTransition):
                    next_state(current, facts)
    listed = {(state, new) for state, following in TRANSITIONS.items() for new in following}
    assert listed <= driven, listed - driven
