"""The job and task state tables (docs/design.md, "States and completion"): what may follow what."""

from __future__ import annotations

from collections import deque
from enum import StrEnum
from itertools import pairwise
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.states import (
    JOB_FINAL,
    JOB_MOVES,
    TASK_FINAL,
    TASK_MOVES,
    IllegalTransition,
    JobState,
    TaskState,
    can_move_job,
    can_move_task,
    check_job_move,
    check_task_move,
)

J, T = JobState, TaskState
S = TypeVar("S", bound=StrEnum)

JOB_ALLOWED = [
    pytest.param(J.WAITING, J.RUNNING, id="WAITING starts RUNNING"),
    pytest.param(J.WAITING, J.WAITING, id="WAITING retries to WAITING"),
    pytest.param(J.WAITING, J.STOPPING, id="WAITING can be stopped"),
    pytest.param(J.WAITING, J.STOPPED, id="WAITING with nothing placed stops at once"),
    pytest.param(J.WAITING, J.SUCCEEDED, id="WAITING succeeds before RUNNING was seen"),
    pytest.param(J.WAITING, J.FAILED, id="WAITING fails before RUNNING was seen"),
    pytest.param(J.RUNNING, J.WAITING, id="RUNNING retries back to WAITING"),
    pytest.param(J.RUNNING, J.STOPPING, id="RUNNING can be stopped"),
    pytest.param(J.RUNNING, J.SUCCEEDED, id="RUNNING succeeds"),
    pytest.param(J.RUNNING, J.FAILED, id="RUNNING fails"),
    pytest.param(J.RUNNING, J.STOPPED, id="RUNNING stops"),
    pytest.param(J.STOPPING, J.STOPPED, id="STOPPING goes to STOPPED"),
]

JOB_FORBIDDEN = [
    pytest.param(J.RUNNING, J.RUNNING, id="RUNNING is not a move to RUNNING"),
    pytest.param(J.STOPPING, J.RUNNING, id="STOPPING only goes to STOPPED (not RUNNING)"),
    pytest.param(J.STOPPING, J.WAITING, id="STOPPING only goes to STOPPED (never retried)"),
    pytest.param(J.STOPPING, J.SUCCEEDED, id="STOPPING only goes to STOPPED (not SUCCEEDED)"),
    pytest.param(J.STOPPING, J.FAILED, id="STOPPING only goes to STOPPED (not FAILED)"),
    pytest.param(J.STOPPING, J.STOPPING, id="STOPPING only goes to STOPPED (not itself)"),
    *(pytest.param(final, target, id=f"{final} is final (not {target})")
      for final in (J.SUCCEEDED, J.FAILED, J.STOPPED) for target in J),
]

TASK_ALLOWED = [
    pytest.param(T.WAITING, T.LAUNCHING, id="WAITING is placed LAUNCHING"),
    pytest.param(T.WAITING, T.STOPPED, id="WAITING can be stopped"),
    pytest.param(T.LAUNCHING, T.RUNNING, id="LAUNCHING container starts RUNNING"),
    pytest.param(T.LAUNCHING, T.SUCCEEDED, id="LAUNCHING exits 0 before its start was seen"),
    pytest.param(T.LAUNCHING, T.FAILED, id="LAUNCHING fails before its start was seen"),
    pytest.param(T.LAUNCHING, T.STOPPED, id="LAUNCHING can be stopped"),
    pytest.param(T.RUNNING, T.SUCCEEDED, id="RUNNING succeeds"),
    pytest.param(T.RUNNING, T.FAILED, id="RUNNING fails"),
    pytest.param(T.RUNNING, T.STOPPED, id="RUNNING is stopped"),
    pytest.param(T.RUNNING, T.LAUNCHING, id="RUNNING fails and relaunches (taskRetryCount)"),
    pytest.param(T.LAUNCHING, T.LAUNCHING,
                 id="LAUNCHING fails before its start was seen and relaunches"),
]

TASK_FORBIDDEN = [
    pytest.param(T.WAITING, T.RUNNING, id="WAITING must be LAUNCHING before RUNNING"),
    pytest.param(T.WAITING, T.SUCCEEDED, id="WAITING cannot succeed without a container"),
    pytest.param(T.WAITING, T.FAILED, id="WAITING cannot fail without a container"),
    pytest.param(T.WAITING, T.WAITING, id="WAITING is not a move to WAITING"),
    pytest.param(T.LAUNCHING, T.WAITING, id="LAUNCHING does not go back to WAITING"),
    pytest.param(T.RUNNING, T.WAITING, id="RUNNING does not go back to WAITING"),
    pytest.param(T.RUNNING, T.RUNNING, id="RUNNING is not a move to RUNNING"),
    *(pytest.param(final, target, id=f"{final} is final (not {target})")
      for final in (T.SUCCEEDED, T.FAILED, T.STOPPED) for target in T),
]


@pytest.mark.parametrize(("current", "target"), JOB_ALLOWED)
def test_allowed_job_move(current: JobState, target: JobState) -> None:
    assert can_move_job(current, target)
    check_job_move(current, target)  # does not raise


@pytest.mark.parametrize(("current", "target"), JOB_FORBIDDEN)
def test_forbidden_job_move_raises(current: JobState, target: JobState) -> None:
    assert not can_move_job(current, target)
    with pytest.raises(IllegalTransition) as caught:
        check_job_move(current, target)
    assert (caught.value.kind, caught.value.current, caught.value.target) == (
        "job", current, target)
    assert f"{current} -> {target}" in str(caught.value)


@pytest.mark.parametrize(("current", "target"), TASK_ALLOWED)
def test_allowed_task_move(current: TaskState, target: TaskState) -> None:
    assert can_move_task(current, target)
    check_task_move(current, target)  # does not raise


@pytest.mark.parametrize(("current", "target"), TASK_FORBIDDEN)
def test_forbidden_task_move_raises(current: TaskState, target: TaskState) -> None:
    assert not can_move_task(current, target)
    with pytest.raises(IllegalTransition) as caught:
        check_task_move(current, target)
    assert (caught.value.kind, caught.value.current, caught.value.target) == (
        "task", current, target)


def test_illegal_transition_is_a_value_error() -> None:
    assert issubclass(IllegalTransition, ValueError)


def test_tables_cover_every_state_exactly() -> None:
    assert set(JOB_MOVES) == set(JobState)
    assert set(TASK_MOVES) == set(TaskState)


def test_the_job_table_is_exactly_the_listed_moves() -> None:
    """Every (current, target) pair is either listed allowed or listed forbidden."""
    allowed = {tuple(p.values) for p in JOB_ALLOWED}
    forbidden = {tuple(p.values) for p in JOB_FORBIDDEN}
    in_table = {(c, t) for c, targets in JOB_MOVES.items() for t in targets}
    assert in_table == allowed
    assert not in_table & forbidden


def test_the_task_table_is_exactly_the_listed_moves() -> None:
    allowed = {tuple(p.values) for p in TASK_ALLOWED}
    in_table = {(c, t) for c, targets in TASK_MOVES.items() for t in targets}
    assert in_table == allowed


@pytest.mark.parametrize(("moves", "final"), [
    pytest.param(JOB_MOVES, JOB_FINAL, id="job"),
    pytest.param(TASK_MOVES, TASK_FINAL, id="task"),
])
def test_final_states_have_no_moves_and_others_do(
    moves: dict[S, frozenset[S]], final: frozenset[S],
) -> None:
    for state, targets in moves.items():
        assert (not targets) == (state in final), state


@pytest.mark.parametrize("state", list(JobState))
def test_job_is_final_matches_final_set(state: JobState) -> None:
    assert state.is_final == (state in {J.SUCCEEDED, J.FAILED, J.STOPPED})


@pytest.mark.parametrize("state", list(TaskState))
def test_task_is_final_matches_final_set(state: TaskState) -> None:
    assert state.is_final == (state in {T.SUCCEEDED, T.FAILED, T.STOPPED})


def _reachable(moves: dict[S, frozenset[S]], start: S) -> set[S]:
    seen, todo = {start}, deque([start])
    while todo:
        for nxt in moves[todo.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_every_job_state_is_reachable_from_waiting() -> None:
    assert _reachable(JOB_MOVES, J.WAITING) == set(JobState)


def test_every_task_state_is_reachable_from_waiting() -> None:
    assert _reachable(TASK_MOVES, T.WAITING) == set(TaskState)


@pytest.mark.parametrize(("moves", "final"), [
    pytest.param(JOB_MOVES, JOB_FINAL, id="job"),
    pytest.param(TASK_MOVES, TASK_FINAL, id="task"),
])
def test_a_final_state_is_reachable_from_every_state(
    moves: dict[S, frozenset[S]], final: frozenset[S],
) -> None:
    for state in moves:
        assert _reachable(moves, state) & final, state


# ------------------------------------------------------------ property tests


def _walk(moves: dict[S, frozenset[S]], start: S, choices: list[int]) -> list[S]:
    """Follow the table from `start`, picking the next state by `choices`."""
    path = [start]
    for choice in choices:
        targets = sorted(moves[path[-1]])
        if not targets:
            break
        path.append(targets[choice % len(targets)])
    return path


CHOICES = st.lists(st.integers(min_value=0, max_value=1_000), max_size=60)


@given(start=st.sampled_from(list(JobState)), choices=CHOICES)
def test_random_job_walk_is_legal_and_stops_only_when_final(
    start: JobState, choices: list[int],
) -> None:
    path = _walk(JOB_MOVES, start, choices)
    for current, target in pairwise(path):
        check_job_move(current, target)
    for state in path[:-1]:
        assert not state.is_final
    if len(path) <= len(choices):  # the walk stopped early: it is in a final state
        assert path[-1].is_final


@given(start=st.sampled_from(list(TaskState)), choices=CHOICES)
def test_random_task_walk_is_legal_and_ends_final_within_len_states(
    start: TaskState, choices: list[int],
) -> None:
    """Apart from a task retry (back to LAUNCHING, which taskRetryCount
    bounds), tasks have no cycles: any walk is final within len(TaskState)
    moves."""
    for current, target in pairwise(_walk(TASK_MOVES, start, choices)):
        check_task_move(current, target)
    forward: dict[TaskState, frozenset[TaskState]] = {
        s: frozenset(t for t in targets if t != T.LAUNCHING or s == T.WAITING)
        for s, targets in TASK_MOVES.items()}
    path = _walk(forward, start, choices)
    assert len(path) - 1 <= len(TaskState)
    if len(choices) >= len(TaskState):
        assert path[-1].is_final


@given(start=st.sampled_from(list(JobState)), choices=CHOICES)
def test_job_walk_without_retries_ends_final_within_len_states(
    start: JobState, choices: list[int],
) -> None:
    """Apart from a retry (back to WAITING), a job cannot loop: it ends in time."""
    forward: dict[JobState, frozenset[JobState]] = {
        s: frozenset(t for t in targets if t != J.WAITING) for s, targets in JOB_MOVES.items()}
    path = _walk(forward, start, choices)
    for current, target in pairwise(path):
        check_job_move(current, target)
    assert len(path) - 1 <= len(JobState)
    if len(choices) >= len(JobState):
        assert path[-1].is_final


@given(current=st.sampled_from(list(JobState)), target=st.sampled_from(list(JobState)))
def test_check_job_move_agrees_with_the_table(current: JobState, target: JobState) -> None:
    if target in JOB_MOVES[current]:
        check_job_move(current, target)
    else:
        with pytest.raises(IllegalTransition):
            check_job_move(current, target)


@given(current=st.sampled_from(list(TaskState)), target=st.sampled_from(list(TaskState)))
def test_check_task_move_agrees_with_the_table(current: TaskState, target: TaskState) -> None:
    if target in TASK_MOVES[current]:
        check_task_move(current, target)
    else:
        with pytest.raises(IllegalTransition):
            check_task_move(current, target)
