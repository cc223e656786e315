"""When does an attempt end, and does the job retry? (docs/design.md,
"States and completion")

Pure functions over the job's spec and its tasks' states: the monitor calls
them on every task exit, inside a compare-and-set, so their answer is the
single source of truth for a job's end.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shared.domain.models import JobSpec, Task
from shared.domain.states import JobState, TaskState

# How often a job may be retried for failures that are not its own (lost
# nodes, containers the platform removed) before it fails anyway: a node that
# keeps dying must not keep a job looping forever.
MAX_PLATFORM_RETRIES = 10


@dataclass(frozen=True)
class AttemptOutcome:
    state: JobState  # SUCCEEDED or FAILED
    exit_code: int
    reason: str
    platform_failure: bool = False
    retryable: bool = True


def _completed_order(task: Task) -> tuple[int, str, int]:
    return (task.completed_ms or 0, task.role, task.index)


def evaluate_completion(spec: JobSpec, tasks: Iterable[Task]) -> AttemptOutcome | None:
    """The outcome of an attempt given its tasks, or None while it goes on.

    Rules in order: a role's failures reach minFailedTaskCount (default 1);
    a role's successes reach minSucceededTaskCount; the job's successes reach
    killAllOnCompletedTaskNumber; every task has ended.
    """
    tasks = sorted(tasks, key=_completed_order)
    by_role: dict[str, list[Task]] = {role.name: [] for role in spec.task_roles}
    for task in tasks:
        by_role.setdefault(task.role, []).append(task)

    for role in spec.task_roles:
        failed = [t for t in by_role[role.name] if t.state == TaskState.FAILED]
        never = role.min_failed_task_count == -1
        if failed and not never and len(failed) >= (role.min_failed_task_count or 1):
            first = failed[0]
            exit_code = first.exit_code if first.exit_code not in (None, 0) else 1
            cause = first.diagnostics or f"exit code {exit_code}"
            platform = all(t.platform_failure for t in failed)
            return AttemptOutcome(
                JobState.FAILED,
                exit_code=exit_code,
                reason=(f"{len(failed)} task(s) of role {role.name} failed; "
                        f"{role.name}[{first.index}]: {cause}"),
                platform_failure=platform,
                retryable=not any(t.diagnostics.startswith(NON_RETRYABLE_PREFIX) for t in failed),
            )

    for role in spec.task_roles:
        wanted = role.min_succeeded_task_count
        succeeded = sum(t.state == TaskState.SUCCEEDED for t in by_role[role.name])
        if wanted and wanted > 0 and succeeded >= wanted:
            reason = (f"{succeeded} task(s) of role {role.name} succeeded "
                      f"(minSucceededTaskCount {wanted})")
            return AttemptOutcome(JobState.SUCCEEDED, 0, reason)

    succeeded_total = sum(t.state == TaskState.SUCCEEDED for t in tasks)
    kill_all = spec.kill_all_on_completed_task_number
    if kill_all > 0 and succeeded_total >= kill_all:
        return AttemptOutcome(
            JobState.SUCCEEDED, 0,
            f"{succeeded_total} task(s) succeeded (killAllOnCompletedTaskNumber {kill_all})")

    if len(tasks) == spec.total_tasks and all(t.state.is_final for t in tasks):
        # Every task ended and no failure rule fired (minFailedTaskCount above
        # the failures seen): the attempt succeeds, as in FrameworkController.
        return AttemptOutcome(JobState.SUCCEEDED, 0, "all tasks completed")
    return None


# A task failure whose diagnostics start with this can never succeed on a
# retry (the image cannot be pulled): the job fails at once.
NON_RETRYABLE_PREFIX = "[non-retryable]"


# retryCount -1 and -2 (OpenPAI's serving jobs): retry without limit, each
# retry waiting twice as long as the last, from RETRY_BACKOFF_BASE_SECONDS up
# to RETRY_BACKOFF_MAX_SECONDS, so a crash loop costs the cluster a launch
# every few minutes, not a launch a second.
UNLIMITED_RETRY_COUNTS = (-1, -2)
RETRY_BACKOFF_BASE_SECONDS = 2
RETRY_BACKOFF_MAX_SECONDS = 300


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    counts_against_retry_count: bool
    delay_seconds: int = 0  # how long the job waits before it is queued again


def retry_backoff_seconds(retries: int) -> int:
    """The wait before retry number `retries + 1` of an unlimited job."""
    if retries >= 16:  # 2 ** 16 is past any cap: no huge powers for old jobs
        return RETRY_BACKOFF_MAX_SECONDS
    return int(min(RETRY_BACKOFF_MAX_SECONDS, RETRY_BACKOFF_BASE_SECONDS * 2 ** retries))


def decide_retry(
    outcome: AttemptOutcome, *, retry_count: int, retries: int, platform_retries: int,
) -> RetryDecision:
    """Whether a failed attempt gets a fresh one (docs/design.md, "States and completion")."""
    if outcome.state != JobState.FAILED or not outcome.retryable:
        return RetryDecision(False, False)
    if outcome.platform_failure:
        return RetryDecision(platform_retries < MAX_PLATFORM_RETRIES, False)
    if retry_count in UNLIMITED_RETRY_COUNTS:
        return RetryDecision(True, True, retry_backoff_seconds(retries))
    return RetryDecision(retries < retry_count, True)
