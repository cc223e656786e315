"""Completion and retry policy (docs/design.md, "States and completion"), one case per rule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.completion import (
    MAX_PLATFORM_RETRIES,
    NON_RETRYABLE_PREFIX,
    RETRY_BACKOFF_BASE_SECONDS,
    RETRY_BACKOFF_MAX_SECONDS,
    AttemptOutcome,
    RetryDecision,
    decide_retry,
    evaluate_completion,
    retry_backoff_seconds,
)
from shared.domain.models import JobSpec, Task
from shared.domain.states import JobState, TaskState

R, S, F, W, L, X = (TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.FAILED,
                    TaskState.WAITING, TaskState.LAUNCHING, TaskState.STOPPED)


def role(name: str, number: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "taskNumber": number, "cpuNumber": 1, "memoryMB": 512,
            "gpuNumber": 0, "command": "true", **extra}


def spec(*roles: dict[str, Any], **extra: Any) -> JobSpec:
    return JobSpec.from_config({"jobName": "j", "image": "busybox",
                                "taskRoles": list(roles), **extra})


@dataclass(frozen=True)
class T:
    """A task in a case: its role, index, state, and optional exit details."""

    role: str
    index: int
    state: TaskState
    exit_code: int | None = None
    completed_ms: int | None = None
    diagnostics: str = ""
    platform_failure: bool = False

    def task(self) -> Task:
        exit_code = self.exit_code
        if exit_code is None and self.state == S:
            exit_code = 0
        completed = self.completed_ms
        if completed is None and self.state.is_final:
            completed = 1000 + self.index
        return Task(role=self.role, index=self.index, state=self.state, exit_code=exit_code,
                    completed_ms=completed, diagnostics=self.diagnostics,
                    platform_failure=self.platform_failure)


ONE_ROLE_2 = spec(role("main", 2))
ONE_ROLE_3 = spec(role("main", 3))
MIN_FAILED_2 = spec(role("main", 3, minFailedTaskCount=2))
MIN_SUCCEEDED_1 = spec(role("main", 3, minSucceededTaskCount=1))
# The seed's distributed TensorFlow example: 2 ps servers, 2 workers, kill all
# once 2 tasks have completed.
PS_WORKER = spec(role("ps_server", 2), role("worker", 2, gpuNumber=4),
                 killAllOnCompletedTaskNumber=2)

COMPLETION_CASES = [
    pytest.param(ONE_ROLE_2, [T("main", 0, R), T("main", 1, R)], None,
                 id="still running -> None"),
    pytest.param(ONE_ROLE_2, [T("main", 0, W), T("main", 1, L)], None,
                 id="waiting and launching -> None"),
    pytest.param(ONE_ROLE_2, [T("main", 0, S), T("main", 1, R)], None,
                 id="one of two succeeded, other running -> None"),
    pytest.param(ONE_ROLE_2, [T("main", 0, S), T("main", 1, S)], (JobState.SUCCEEDED, 0),
                 id="all succeed -> SUCCEEDED"),
    pytest.param(ONE_ROLE_3, [T("main", 0, R), T("main", 1, F, 7), T("main", 2, R)],
                 (JobState.FAILED, 7),
                 id="minFailedTaskCount default 1: one failure fails the attempt"),
    pytest.param(MIN_FAILED_2, [T("main", 0, R), T("main", 1, F, 7), T("main", 2, R)], None,
                 id="minFailedTaskCount 2: one failure does not end the attempt"),
    pytest.param(MIN_FAILED_2, [T("main", 0, F, 5), T("main", 1, F, 7), T("main", 2, R)],
                 (JobState.FAILED, 5),
                 id="minFailedTaskCount 2: two failures fail the attempt"),
    pytest.param(MIN_FAILED_2, [T("main", 0, S), T("main", 1, F, 7), T("main", 2, S)],
                 (JobState.SUCCEEDED, 0),
                 id="minFailedTaskCount 2: all ended with one failure -> SUCCEEDED"),
    pytest.param(MIN_SUCCEEDED_1, [T("main", 0, R), T("main", 1, S), T("main", 2, R)],
                 (JobState.SUCCEEDED, 0),
                 id="minSucceededTaskCount reached -> SUCCEEDED while others run"),
    pytest.param(spec(role("main", 3, minSucceededTaskCount=2)),
                 [T("main", 0, R), T("main", 1, S), T("main", 2, R)], None,
                 id="minSucceededTaskCount not yet reached -> None"),
    pytest.param(PS_WORKER, [T("ps_server", 0, R), T("ps_server", 1, R),
                             T("worker", 0, S), T("worker", 1, S)],
                 (JobState.SUCCEEDED, 0),
                 id="killAll 2: 2 ps running, 2 workers succeeded -> SUCCEEDED"),
    pytest.param(PS_WORKER, [T("ps_server", 0, R), T("ps_server", 1, R),
                             T("worker", 0, S), T("worker", 1, R)], None,
                 id="killAll 2: 1 worker succeeded -> None"),
    pytest.param(PS_WORKER, [T("ps_server", 0, R), T("ps_server", 1, R),
                             T("worker", 0, S), T("worker", 1, F, 2)],
                 (JobState.FAILED, 2),
                 id="killAll 2: a failure still fails the attempt first"),
    pytest.param(ONE_ROLE_3, [T("main", 0, F, 9, completed_ms=300),
                              T("main", 1, F, 4, completed_ms=100),
                              T("main", 2, F, 6, completed_ms=200)],
                 (JobState.FAILED, 4),
                 id="exit code is the first failed task's (by completion time)"),
    pytest.param(ONE_ROLE_2, [T("main", 0, F, 0), T("main", 1, R)], (JobState.FAILED, 1),
                 id="a failed task with exit code 0 still fails with a non-zero code"),
    pytest.param(ONE_ROLE_2, [T("main", 0, F, None), T("main", 1, R)], (JobState.FAILED, 1),
                 id="a failed task without an exit code fails with code 1"),
    pytest.param(spec(role("a", 1), role("b", 2, minFailedTaskCount=2)),
                 [T("a", 0, S), T("b", 0, F, 3), T("b", 1, R)], None,
                 id="minFailedTaskCount is per role"),
    pytest.param(ONE_ROLE_2, [T("main", 0, S)], None,
                 id="a missing task keeps the attempt going"),
    pytest.param(spec(role("main", 2, minFailedTaskCount=-1)),
                 [T("main", 0, F, 3), T("main", 1, R)], None,
                 id="minFailedTaskCount -1: a failure never ends the attempt"),
    pytest.param(spec(role("main", 2, minFailedTaskCount=-1)),
                 [T("main", 0, F, 3), T("main", 1, F, 4)], (JobState.SUCCEEDED, 0),
                 id="minFailedTaskCount -1: all ended -> SUCCEEDED as in FrameworkController"),
]


@pytest.mark.parametrize(("job_spec", "tasks", "expected"), COMPLETION_CASES)
def test_evaluate_completion(
    job_spec: JobSpec, tasks: list[T], expected: tuple[JobState, int] | None,
) -> None:
    outcome = evaluate_completion(job_spec, [t.task() for t in tasks])
    if expected is None:
        assert outcome is None
    else:
        assert outcome is not None
        assert (outcome.state, outcome.exit_code) == expected


def test_failure_reason_names_the_role_task_and_diagnostics() -> None:
    outcome = evaluate_completion(ONE_ROLE_2, [
        T("main", 0, R).task(), T("main", 1, F, 3, diagnostics="oom killed").task()])
    assert outcome is not None
    assert "main[1]" in outcome.reason
    assert "oom killed" in outcome.reason


def test_user_failure_is_not_a_platform_failure() -> None:
    outcome = evaluate_completion(ONE_ROLE_2, [T("main", 0, F, 3).task(), T("main", 1, R).task()])
    assert outcome is not None
    assert not outcome.platform_failure
    assert outcome.retryable


def test_platform_failure_is_marked_when_every_failure_is_the_platforms() -> None:
    outcome = evaluate_completion(ONE_ROLE_2, [
        T("main", 0, F, 137, platform_failure=True).task(), T("main", 1, R).task()])
    assert outcome is not None
    assert outcome.platform_failure


def test_a_user_failure_among_platform_failures_is_not_a_platform_failure() -> None:
    outcome = evaluate_completion(MIN_FAILED_2, [
        T("main", 0, F, 137, platform_failure=True).task(),
        T("main", 1, F, 3).task(), T("main", 2, R).task()])
    assert outcome is not None
    assert outcome.state == JobState.FAILED
    assert not outcome.platform_failure


def test_non_retryable_prefix_marks_the_outcome_not_retryable() -> None:
    outcome = evaluate_completion(ONE_ROLE_2, [
        T("main", 0, F, 125, diagnostics=f"{NON_RETRYABLE_PREFIX} image not found").task(),
        T("main", 1, R).task()])
    assert outcome is not None
    assert outcome.state == JobState.FAILED
    assert not outcome.retryable


# ------------------------------------------------------------------ retry

USER_FAILURE = AttemptOutcome(JobState.FAILED, 3, "exit code 3")
PLATFORM_FAILURE = AttemptOutcome(JobState.FAILED, 137, "node lost", platform_failure=True)
NOT_RETRYABLE = AttemptOutcome(JobState.FAILED, 125, "no image", retryable=False)
NOT_RETRYABLE_PLATFORM = AttemptOutcome(JobState.FAILED, 125, "no image",
                                        platform_failure=True, retryable=False)
SUCCESS = AttemptOutcome(JobState.SUCCEEDED, 0, "all tasks completed")

# Whether a refused retry "counts" means nothing; only `retry` is compared then.
NO_RETRY = RetryDecision(False, False)

RETRY_CASES = [
    pytest.param(USER_FAILURE, 2, 0, 0, RetryDecision(True, True),
                 id="user failure with retries left retries and counts"),
    pytest.param(USER_FAILURE, 2, 1, 0, RetryDecision(True, True),
                 id="last retry left is used"),
    pytest.param(USER_FAILURE, 2, 2, 0, NO_RETRY,
                 id="retries exhausted -> no retry"),
    pytest.param(USER_FAILURE, 0, 0, 0, NO_RETRY,
                 id="retryCount 0 -> no retry"),
    pytest.param(PLATFORM_FAILURE, 0, 0, 0, RetryDecision(True, False),
                 id="platform failure retries even with retryCount 0, not counted"),
    pytest.param(PLATFORM_FAILURE, 2, 2, 0, RetryDecision(True, False),
                 id="platform failure retries even with user retries exhausted"),
    pytest.param(PLATFORM_FAILURE, 0, 0, MAX_PLATFORM_RETRIES - 1, RetryDecision(True, False),
                 id="platform failure below the platform bound retries"),
    pytest.param(PLATFORM_FAILURE, 5, 0, MAX_PLATFORM_RETRIES, NO_RETRY,
                 id="platform failure at the platform bound stops"),
    pytest.param(NOT_RETRYABLE, 5, 0, 0, NO_RETRY,
                 id="non-retryable failure stops retries"),
    pytest.param(NOT_RETRYABLE_PLATFORM, 5, 0, 0, NO_RETRY,
                 id="non-retryable platform failure stops retries"),
    pytest.param(SUCCESS, 5, 0, 0, NO_RETRY,
                 id="success is never retried"),
    pytest.param(USER_FAILURE, -1, 1000, 0, RetryDecision(True, True),
                 id="retryCount -1 retries without limit"),
    pytest.param(USER_FAILURE, -2, 1000, 0, RetryDecision(True, True),
                 id="retryCount -2 retries without limit"),
    pytest.param(NOT_RETRYABLE, -2, 0, 0, NO_RETRY,
                 id="unlimited retry still stops on a non-retryable failure"),
    pytest.param(SUCCESS, -1, 0, 0, NO_RETRY,
                 id="unlimited retry: success is never retried"),
]


@pytest.mark.parametrize(("retries", "seconds"), [
    pytest.param(0, RETRY_BACKOFF_BASE_SECONDS, id="first retry waits the base"),
    pytest.param(1, 2 * RETRY_BACKOFF_BASE_SECONDS, id="second waits twice as long"),
    pytest.param(3, 8 * RETRY_BACKOFF_BASE_SECONDS, id="doubles each time"),
    pytest.param(20, RETRY_BACKOFF_MAX_SECONDS, id="capped"),
    pytest.param(10**9, RETRY_BACKOFF_MAX_SECONDS, id="a very old job is capped too"),
])
def test_unlimited_retry_backs_off_increasingly_up_to_a_cap(retries: int, seconds: int) -> None:
    decision = decide_retry(USER_FAILURE, retry_count=-1, retries=retries, platform_retries=0)
    assert decision.delay_seconds == seconds


@given(st.integers(min_value=0, max_value=10**6))
def test_backoff_never_shrinks_and_never_passes_the_cap(retries: int) -> None:
    assert retry_backoff_seconds(retries) <= retry_backoff_seconds(retries + 1) \
        <= RETRY_BACKOFF_MAX_SECONDS


def test_limited_retry_does_not_wait() -> None:
    assert decide_retry(USER_FAILURE, retry_count=3, retries=0,
                        platform_retries=0).delay_seconds == 0


@pytest.mark.parametrize(
    ("outcome", "retry_count", "retries", "platform_retries", "expected"), RETRY_CASES)
def test_decide_retry(
    outcome: AttemptOutcome, retry_count: int, retries: int, platform_retries: int,
    expected: RetryDecision,
) -> None:
    decision = decide_retry(outcome, retry_count=retry_count, retries=retries,
                            platform_retries=platform_retries)
    assert decision.retry == expected.retry
    if expected.retry:
        assert decision.counts_against_retry_count == expected.counts_against_retry_count


def test_non_retryable_prefix_end_to_end_stops_retries() -> None:
    job_spec = spec(role("main", 1), retryCount=3)
    outcome = evaluate_completion(job_spec, [
        T("main", 0, F, 125, diagnostics=f"{NON_RETRYABLE_PREFIX} pull failed").task()])
    assert outcome is not None
    decision = decide_retry(outcome, retry_count=job_spec.retry_count, retries=0,
                            platform_retries=0)
    assert not decision.retry


def test_platform_failure_end_to_end_does_not_count_against_retry_count() -> None:
    job_spec = spec(role("main", 1), retryCount=0)
    outcome = evaluate_completion(job_spec, [
        T("main", 0, F, 137, platform_failure=True, diagnostics="node lost").task()])
    assert outcome is not None
    decision = decide_retry(outcome, retry_count=job_spec.retry_count, retries=0,
                            platform_retries=0)
    assert decision == RetryDecision(retry=True, counts_against_retry_count=False)


# ------------------------------------------------------------ properties

FINAL_OR_NOT = st.sampled_from([W, L, R, S, F, X])


@given(states=st.lists(FINAL_OR_NOT, min_size=3, max_size=3),
       exits=st.lists(st.integers(min_value=0, max_value=255), min_size=3, max_size=3))
def test_outcome_is_none_or_a_final_job_state(states: list[TaskState], exits: list[int]) -> None:
    tasks = [T("main", i, s, exit_code=e if s == F else None).task()
             for i, (s, e) in enumerate(zip(states, exits, strict=True))]
    outcome = evaluate_completion(ONE_ROLE_3, tasks)
    if outcome is None:
        assert F not in states
        assert any(not s.is_final for s in states)
    else:
        assert outcome.state in (JobState.SUCCEEDED, JobState.FAILED)
        assert (outcome.state == JobState.FAILED) == (F in states)
        assert (outcome.exit_code == 0) == (outcome.state == JobState.SUCCEEDED)


@given(states=st.lists(st.sampled_from([W, L, R, S]), min_size=4, max_size=4))
def test_kill_all_succeeds_exactly_when_two_tasks_succeeded(states: list[TaskState]) -> None:
    roles = ["ps_server", "ps_server", "worker", "worker"]
    tasks = [T(r, i % 2, s).task() for i, (r, s) in enumerate(zip(roles, states, strict=True))]
    outcome = evaluate_completion(PS_WORKER, tasks)
    succeeded = states.count(S)
    assert (outcome is not None) == (succeeded >= 2)
    if outcome is not None:
        assert outcome.state == JobState.SUCCEEDED
