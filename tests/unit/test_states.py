"""The transition table, checked against an independent copy of the intended lifecycle.

``EDGES`` restates the allowed moves from the state docs; a change to
``dispatcher.states.TRANSITIONS`` that nobody meant shows up here as a failure.
"""

from __future__ import annotations

import itertools

import pytest

from dispatcher.errors import DispatcherError, IllegalTransition, InternalError
from dispatcher.states import (
    INITIAL_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    ExecutionStatus,
    check_transition,
    sources_of,
)

S = ExecutionStatus

EDGES: frozenset[tuple[ExecutionStatus, ExecutionStatus]] = frozenset(
    {
        (S.PROPOSED, S.AUTHORIZED),
        (S.PROPOSED, S.REJECTED),
        (S.PROPOSED, S.CANCELLED),
        (S.AUTHORIZED, S.DISPATCHING),
        (S.AUTHORIZED, S.CANCELLED),
        (S.DISPATCHING, S.ACCEPTED),
        (S.DISPATCHING, S.COMPLETED),
        (S.DISPATCHING, S.FAILED),
        (S.DISPATCHING, S.RESULT_UNKNOWN),
        (S.DISPATCHING, S.AUTHORIZED),  # a read-only call whose worker died runs again
        (S.ACCEPTED, S.COMPLETED),
        (S.ACCEPTED, S.FAILED),
        (S.ACCEPTED, S.RESULT_UNKNOWN),
        (S.ACCEPTED, S.CONFIRMED),
        (S.ACCEPTED, S.ESCALATED),  # a pending call nobody could settle
        (S.ACCEPTED, S.COMPENSATED),  # a pending call whose run was stopped
        (S.COMPLETED, S.COMPENSATED),
        (S.RESULT_UNKNOWN, S.CONFIRMED),
        (S.RESULT_UNKNOWN, S.COMPENSATED),
        (S.RESULT_UNKNOWN, S.ESCALATED),
        (S.RESULT_UNKNOWN, S.DISPATCHING),  # the reconciler re-sends with the same key
        (S.ESCALATED, S.CONFIRMED),
        (S.ESCALATED, S.COMPENSATED),
        (S.ESCALATED, S.AUTHORIZED),  # an operator's retry
        (S.FAILED, S.AUTHORIZED),  # an operator's retry
    }
)

# Terminal for the automatic machinery; the only ways out are the human/compensation
# edges listed here.
TERMINAL_EXITS: dict[ExecutionStatus, frozenset[ExecutionStatus]] = {
    S.COMPLETED: frozenset({S.COMPENSATED}),
    S.FAILED: frozenset({S.AUTHORIZED}),
    S.CONFIRMED: frozenset(),
    S.COMPENSATED: frozenset(),
    S.REJECTED: frozenset(),
    S.CANCELLED: frozenset(),
}

ALL_PAIRS = list(itertools.product(ExecutionStatus, repeat=2))


def test_every_status_is_a_key_of_the_table() -> None:
    assert set(TRANSITIONS) == set(ExecutionStatus)
    for targets in TRANSITIONS.values():
        assert all(isinstance(t, ExecutionStatus) for t in targets)


def test_table_matches_the_intended_lifecycle() -> None:
    actual = {(src, dst) for src, targets in TRANSITIONS.items() for dst in targets}
    assert actual == EDGES


@pytest.mark.parametrize(("current", "target"), ALL_PAIRS, ids=lambda s: s.value)
def test_check_transition_refuses_exactly_the_moves_not_in_the_table(
    current: ExecutionStatus, target: ExecutionStatus
) -> None:
    if (current, target) in EDGES:
        check_transition(current, target)  # must not raise
        assert target in TRANSITIONS[current]
    else:
        with pytest.raises(IllegalTransition) as info:
            check_transition(current, target)
        assert info.value.extra == {"current": current.value, "target": target.value}


def test_illegal_transition_is_a_non_retriable_dispatcher_error() -> None:
    with pytest.raises(DispatcherError) as info:
        check_transition(S.CONFIRMED, S.AUTHORIZED)
    # A bug of the program, not of any request: answered as an internal error.
    assert isinstance(info.value, InternalError)
    assert info.value.code == "internal_error"
    assert info.value.status == 500
    assert info.value.retriable is False


def test_no_state_moves_to_itself() -> None:
    assert all(state not in TRANSITIONS[state] for state in ExecutionStatus)


def test_terminal_states_have_only_their_documented_exits() -> None:
    assert set(TERMINAL_EXITS) == TERMINAL_STATES
    for state, exits in TERMINAL_EXITS.items():
        assert TRANSITIONS[state] == exits, state


def test_states_without_exits_are_terminal() -> None:
    dead_ends = {state for state, targets in TRANSITIONS.items() if not targets}
    assert dead_ends == {S.CONFIRMED, S.COMPENSATED, S.REJECTED, S.CANCELLED}
    assert dead_ends <= TERMINAL_STATES


@pytest.mark.parametrize("target", list(ExecutionStatus), ids=lambda s: s.value)
def test_sources_of_lists_every_state_that_may_enter_target(target: ExecutionStatus) -> None:
    assert sources_of(target) == {src for src, dst in EDGES if dst == target}


def test_proposed_is_entered_only_at_creation() -> None:
    assert sources_of(S.PROPOSED) == frozenset()


def test_initial_states() -> None:
    assert INITIAL_STATES == {S.PROPOSED, S.AUTHORIZED}
    assert not INITIAL_STATES & TERMINAL_STATES


def test_every_state_is_reachable_from_an_initial_state() -> None:
    seen = set(INITIAL_STATES)
    frontier = list(INITIAL_STATES)
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(ExecutionStatus)


def test_every_state_can_reach_a_dead_end() -> None:
    # No cycle traps a call forever: from anywhere some path ends the lifecycle.
    dead_ends = {state for state, targets in TRANSITIONS.items() if not targets}
    can_finish = set(dead_ends)
    changed = True
    while changed:
        changed = False
        for state, targets in TRANSITIONS.items():
            if state not in can_finish and targets & can_finish:
                can_finish.add(state)
                changed = True
    assert can_finish == set(ExecutionStatus)
