"""shared/domain/exits.py: what one task's exit does, case by case, like the
completion policy's table (tests/unit/test_completion.py)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.exits import (
    STOPPED_BY_PLATFORM,
    AttemptEnd,
    Charge,
    ExitDecision,
    ExitKind,
    TaskExit,
    decide_exit,
    is_live,
)
from shared.domain.models import Job, JobSpec, Task
from shared.domain.states import JobState, TaskState

R = TaskState.RUNNING
JOB = "alice~train"


def spec(tasks: int = 2, retry: int = 0, task_retry: int = 0, **role: Any) -> JobSpec:
    return JobSpec.from_config({
        "jobName": "train", "image": "busybox", "retryCount": retry,
        "taskRoles": [{"name": "main", "taskNumber": tasks, "cpuNumber": 1, "memoryMB": 128,
                       "gpuNumber": 0, "command": "true", "taskRetryCount": task_retry,
                       **role}]})


def job(state: JobState = JobState.RUNNING, attempt: int = 0, **fields: Any) -> Job:
    return Job(id=JOB, username="alice", name="train", virtual_cluster="default",
               state=state, attempt=attempt, submission="s1", **fields)


def tasks(*states: TaskState, retries: int = 0) -> dict[str, Task]:
    return {f"main:{i}": Task(role="main", index=i, state=s, node="n1", retries=retries)
            for i, s in enumerate(states)}


def decide(the_job: Job | None, the_tasks: dict[str, Task], exit_code: int, *,
           the_spec: JobSpec | None = None, attempt: int = 0, **seen: Any) -> ExitDecision:
    return decide_exit(the_job, the_tasks, "main:0", attempt,
                       the_spec if the_spec is not None else spec(len(the_tasks)),
                       TaskExit(exit_code, **seen))


@pytest.mark.parametrize(("the_job", "the_tasks", "seen"), [
    pytest.param(None, tasks(R), {}, id="the job is gone"),
    pytest.param(job(), {}, {}, id="the task is gone"),
    pytest.param(job(), tasks(TaskState.FAILED), {}, id="the task settled already"),
    pytest.param(job(), tasks(R, retries=1), {"task_retry": 0},
                 id="an earlier container of a retried task"),
    pytest.param(job(), tasks(R), {"submission": "s0"},
                 id="a container of an earlier submission of the name"),
])
def test_a_report_about_something_else_is_stale(the_job: Job | None, the_tasks: dict[str, Task],
                                                seen: dict[str, Any]) -> None:
    assert decide(the_job, the_tasks, 1, **seen).kind == ExitKind.STALE


def test_a_report_without_submission_or_retry_is_about_the_current_container() -> None:
    assert decide(job(), tasks(R, R), 0).kind == ExitKind.SETTLE


@pytest.mark.parametrize(("exit_code", "seen", "the_job", "kind"), [
    pytest.param(1, {}, job(), ExitKind.RELAUNCH, id="a failure the role's retries cover"),
    pytest.param(0, {}, job(), ExitKind.SETTLE, id="a success is no failure"),
    pytest.param(1, {"platform_failure": True}, job(), ExitKind.SETTLE,
                 id="the platform's failure retries the attempt, not the task"),
    pytest.param(1, {"diagnostics": "[non-retryable] image gone"}, job(), ExitKind.SETTLE,
                 id="a failure that must not retry"),
    pytest.param(1, {}, job(preempted_by="bob~urgent"), ExitKind.SETTLE,
                 id="a task ending on its preemption"),
    pytest.param(1, {}, job(JobState.STOPPING), ExitKind.SETTLE, id="a stopping job"),
])
def test_a_task_retry_relaunches_only_the_tasks_own_failure(
        exit_code: int, seen: dict[str, Any], the_job: Job, kind: ExitKind) -> None:
    decision = decide(the_job, tasks(R, R), exit_code, the_spec=spec(task_retry=2), **seen)
    assert decision.kind == kind
    if kind == ExitKind.RELAUNCH:
        assert decision.task_state == TaskState.LAUNCHING and not decision.attempt_ended


def test_a_task_out_of_retries_fails() -> None:
    decision = decide(job(), tasks(R, R, retries=2), 1, the_spec=spec(task_retry=2))
    assert (decision.kind, decision.task_state) == (ExitKind.SETTLE, TaskState.FAILED)


S, F, ST, W = TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED, JobState.WAITING
CASES = [  # (job, tasks, exit code, spec) -> (task, job, attempt ended as, retry, final)
    pytest.param(job(), tasks(R, R), 0, spec(), (S, None, None, None, False),
                 id="one of two succeeded: the attempt goes on"),
    pytest.param(job(), tasks(R, S), 0, spec(), (S, JobState.SUCCEEDED, JobState.SUCCEEDED,
                                                  None, True),
                 id="the last task succeeded: the job succeeds"),
    pytest.param(job(), tasks(R, R), 3, spec(), (F, JobState.FAILED, JobState.FAILED, None, True),
                 id="a failure with no retries left fails the job"),
    pytest.param(job(), tasks(R, R), 3, spec(retry=1),
                 (F, W, JobState.FAILED, Charge.RETRY_COUNT, False),
                 id="a failure with a retry left: charged"),
    pytest.param(job(retries=1), tasks(R, R), 3, spec(retry=1),
                 (F, JobState.FAILED, JobState.FAILED, None, True), id="retries used up"),
    pytest.param(job(), tasks(R, R), 3, spec(minFailedTaskCount=2), (F, None, None, None, False),
                 id="a role that tolerates one failure goes on"),
    pytest.param(job(JobState.STOPPING), tasks(R, R), 143, spec(), (ST, None, None, None, False),
                 id="stopping: one of two stopped"),
    pytest.param(job(JobState.STOPPING), tasks(R, ST), 143, spec(),
                 (ST, JobState.STOPPED, JobState.STOPPED, None, True),
                 id="stopping: the last stopped"),
    pytest.param(job(preempted_by="bob~urgent"), tasks(R, R), 143, spec(),
                 (ST, None, None, None, False), id="preempted: one of two ended on the signal"),
    pytest.param(job(preempted_by="bob~urgent"), tasks(R, ST), 143, spec(),
                 (ST, W, JobState.STOPPED, Charge.PREEMPTION, False),
                 id="preempted: all ended, requeued uncharged"),
    pytest.param(job(preempted_by="bob~urgent"), tasks(R, S), 0, spec(),
                 (S, JobState.SUCCEEDED, JobState.SUCCEEDED, None, True),
                 id="preempted, but the last task completed the job in its grace"),
]


@pytest.mark.parametrize(("the_job", "the_tasks", "exit_code", "the_spec", "expected"), CASES)
def test_decide_exit(the_job: Job, the_tasks: dict[str, Task], exit_code: int,
                     the_spec: JobSpec, expected: tuple[Any, ...]) -> None:
    decision = decide(the_job, the_tasks, exit_code, the_spec=the_spec)
    assert decision.kind == ExitKind.SETTLE
    ended = decision.attempt_end.state if decision.attempt_end is not None else None
    assert (decision.task_state, decision.job_state, ended, decision.retry,
            decision.final) == expected


def test_a_stop_says_whose_it_was() -> None:
    by_user = decide(job(JobState.STOPPING), tasks(R), 143, the_spec=spec(1))
    by_platform = decide(job(JobState.STOPPING, exit_diagnostics=f"{STOPPED_BY_PLATFORM}idle"),
                         tasks(R), 143, the_spec=spec(1))
    assert by_user.attempt_end == AttemptEnd(JobState.STOPPED, None, "stopped by user", False)
    assert by_platform.attempt_end is not None
    assert by_platform.attempt_end.reason == f"{STOPPED_BY_PLATFORM}idle"


def test_a_preempted_attempt_names_its_preemptor() -> None:
    decision = decide(job(preempted_by="bob~urgent"), tasks(R), 143, the_spec=spec(1))
    assert decision.attempt_end == AttemptEnd(JobState.STOPPED, None, "Preempted by bob~urgent",
                                              False, preempted_by="bob~urgent")


def test_the_platforms_failure_retries_uncharged() -> None:
    decision = decide(job(), tasks(R, R), -1, the_spec=spec(retry=0), platform_failure=True,
                      diagnostics="node n1 lost")
    assert (decision.job_state, decision.retry) == (JobState.WAITING, Charge.PLATFORM)
    assert decision.attempt_end is not None and decision.attempt_end.platform_failure


def test_an_unlimited_job_backs_off_before_its_next_attempt() -> None:
    decision = decide(job(retries=3), tasks(R, R), 1, the_spec=spec(retry=-1))
    assert decision.retry == Charge.RETRY_COUNT and decision.retry_delay_seconds > 0


def test_an_old_attempts_task_is_stopped_and_changes_nothing_else() -> None:
    """The attempt moved on (a retry): its late reporter only settles its own task."""
    old = decide(job(attempt=1), tasks(R, R), 1, attempt=0, the_spec=None)
    assert old == ExitDecision(ExitKind.SETTLE, TaskState.STOPPED)
    assert not is_live(job(attempt=1), 0) and is_live(job(attempt=1), 1)
    assert not is_live(job(JobState.STOPPING), 0)


def test_the_decision_touches_no_record() -> None:
    records = tasks(R, TaskState.SUCCEEDED)
    before = {key: task.to_dict() for key, task in records.items()}
    the_job = job()
    decide(the_job, records, 0)
    assert {key: task.to_dict() for key, task in records.items()} == before
    assert the_job == job()
