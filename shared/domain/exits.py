"""What a task's exit does to its task, its attempt and its job, decided in
one pure function (`decide_exit`) over the records as read; the lifecycle
(shared/state/taskexits.py `record_task_exit`) reads them under WATCH, asks,
and writes what the decision says.

The rules, in the order they apply:

1. A report about something else is **stale** and changes nothing: the job
   or task is gone or settled, the container was an earlier one of a retried
   task (`task_retry`), or it was made for an earlier submission of the
   job's name (`submission`).
2. A live attempt's task that failed by itself (not the platform's fault, not
   during a preemption, not a failure that must not retry) while its role's
   `taskRetryCount` still covers it is **relaunched** on its allocation.
3. Otherwise the task **settles**: STOPPED when its attempt is over or the
   job is being stopped or preempted (and it did not succeed), else
   SUCCEEDED on exit 0 and FAILED on any other code.
4. A stopping job whose last task settled is STOPPED.
5. A live attempt is judged by the completion policy
   (shared/domain/completion.py). A preempted one whose tasks have all
   ended goes back to its queue at its old place, uncharged, unless a task
   succeeding in the grace period completed the job. An attempt that ended
   failed is retried as `decide_retry` says (charged to `retryCount` or to
   the platform, with a back-off for unlimited retries); one that ended for
   good sets the job's final state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from shared.domain.completion import NON_RETRYABLE_PREFIX, decide_retry, evaluate_completion
from shared.domain.models import Job, JobSpec, Task
from shared.domain.states import LIVE_JOB_STATES, JobState, TaskState

STOPPED_BY_USER = "stopped by user"
# The diagnostics of a stop the platform made (shared/state/idle.py) start so.
STOPPED_BY_PLATFORM = "stopped by the platform: "


@dataclass(frozen=True)
class TaskExit:
    """What ended, as its reporter saw it."""

    exit_code: int
    diagnostics: str = ""
    platform_failure: bool = False
    task_retry: int | None = None  # which of the task's containers (None: whichever)
    submission: str | None = None  # which submission made the container (None: any)


class ExitKind(StrEnum):
    STALE = "STALE"
    RELAUNCH = "RELAUNCH"
    SETTLE = "SETTLE"


class Charge(StrEnum):
    """Whose account a retry goes to."""

    RETRY_COUNT = "RETRY_COUNT"  # the job's own failure
    PLATFORM = "PLATFORM"  # the platform's (a lost node, a vanished container)
    PREEMPTION = "PREEMPTION"  # requeued after a preemption


@dataclass(frozen=True)
class AttemptEnd:
    """How the attempt ended, for its record."""

    state: JobState
    exit_code: int | None
    reason: str
    platform_failure: bool
    preempted_by: str = ""


@dataclass(frozen=True)
class ExitDecision:
    kind: ExitKind
    task_state: TaskState | None = None  # the task's state after the exit
    job_state: JobState | None = None  # the job's, when it moves
    attempt_end: AttemptEnd | None = None  # the attempt ended so
    retry: Charge | None = None  # a fresh attempt is queued, charged so
    retry_delay_seconds: int = 0  # an unlimited job's back-off before it is queued
    final: bool = False  # the job ended for good: its completion and exit code are set

    @property
    def attempt_ended(self) -> bool:
        return self.attempt_end is not None


STALE = ExitDecision(ExitKind.STALE)


def is_live(job: Job, attempt: int) -> bool:
    """Is `attempt` the job's current one, the job neither stopping nor ended?
    Only then does an exit need the job's spec."""
    return attempt == job.attempt and job.state in LIVE_JOB_STATES


def decide_exit(job: Job | None, tasks: Mapping[str, Task], key: str, attempt: int,
                spec: JobSpec | None, seen: TaskExit) -> ExitDecision:
    """The exit of task `key` of `attempt` (rules above). `tasks` are the
    attempt's tasks as read; `spec` the job's, needed when `is_live`."""
    task = tasks.get(key)
    if job is None or task is None or task.state.is_final:
        return STALE
    if seen.task_retry is not None and seen.task_retry != task.retries:
        return STALE  # an earlier container of a retried task: settled by its retry
    if seen.submission and seen.submission != job.submission:
        return STALE  # a container of an earlier submission of this name
    live = is_live(job, attempt)
    if live and _relaunches(job, task, spec, seen):
        return ExitDecision(ExitKind.RELAUNCH, task_state=TaskState.LAUNCHING)
    if not live or (job.preempted_by and seen.exit_code != 0):
        target = TaskState.STOPPED
    else:
        target = TaskState.SUCCEEDED if seen.exit_code == 0 else TaskState.FAILED
    after = {k: (t if k != key else _settled(t, target, seen)) for k, t in tasks.items()}
    if job.state == JobState.STOPPING and attempt == job.attempt:
        if all(t.state.is_final for t in after.values()):
            return ExitDecision(ExitKind.SETTLE, target, JobState.STOPPED,
                                AttemptEnd(JobState.STOPPED, None, stop_reason_of(job), False),
                                final=True)
        return ExitDecision(ExitKind.SETTLE, target)
    if not live:
        return ExitDecision(ExitKind.SETTLE, target)
    assert spec is not None, "a live attempt's exit needs the job's spec"
    return _judged(job, after, spec, target, seen.exit_code)


def _relaunches(job: Job, task: Task, spec: JobSpec | None, seen: TaskExit) -> bool:
    if seen.exit_code == 0 or seen.platform_failure or job.preempted_by \
            or seen.diagnostics.startswith(NON_RETRYABLE_PREFIX):
        return False
    assert spec is not None, "a live attempt's exit needs the job's spec"
    return task.retries < spec.role(task.role).task_retry_count


def _settled(task: Task, state: TaskState, seen: TaskExit) -> Task:
    """A copy of `task` settled as `seen` says, for judging the attempt without
    touching the record (the lifecycle settles the record itself)."""
    copy = Task.from_dict(task.to_dict())
    copy.state, copy.exit_code, copy.diagnostics = state, seen.exit_code, seen.diagnostics
    copy.platform_failure = seen.platform_failure
    return copy


def _judged(job: Job, tasks: Mapping[str, Task], spec: JobSpec, target: TaskState,
            exit_code: int) -> ExitDecision:
    """A live attempt after one of its tasks settled: the completion policy,
    a preemption's requeue, or a retry."""
    outcome = evaluate_completion(spec, tasks.values())
    succeeded = outcome is not None and outcome.state == JobState.SUCCEEDED and exit_code == 0
    if job.preempted_by and not succeeded:
        # Tasks ending on the signal are not the job's failure (nor, stopped,
        # its success); once all have ended it goes back to its queue.
        if all(t.state.is_final for t in tasks.values()):
            return ExitDecision(ExitKind.SETTLE, target, JobState.WAITING,
                                AttemptEnd(JobState.STOPPED, None,
                                           f"Preempted by {job.preempted_by}", False,
                                           preempted_by=job.preempted_by),
                                retry=Charge.PREEMPTION)
        return ExitDecision(ExitKind.SETTLE, target)
    if outcome is None:
        return ExitDecision(ExitKind.SETTLE, target)
    end = AttemptEnd(outcome.state, outcome.exit_code, outcome.reason, outcome.platform_failure)
    retry = decide_retry(outcome, retry_count=spec.retry_count, retries=job.retries,
                         platform_retries=job.platform_retries)
    if retry.retry:
        return ExitDecision(ExitKind.SETTLE, target, JobState.WAITING, end,
                            retry=Charge.RETRY_COUNT if retry.counts_against_retry_count
                            else Charge.PLATFORM, retry_delay_seconds=retry.delay_seconds)
    return ExitDecision(ExitKind.SETTLE, target, outcome.state, end, final=True)


def stop_reason_of(job: Job) -> str:
    """Why a stopping job stops: the platform's reason it recorded, else the user's stop."""
    if job.exit_diagnostics.startswith(STOPPED_BY_PLATFORM):
        return job.exit_diagnostics
    return STOPPED_BY_USER
