"""A task's container ended: what it does to the task, its attempt and its
job, compare-and-set.

`record_task_exit` reads the job and the attempt's tasks under WATCH, asks
the pure decision (shared/domain/exits.py `decide_exit`) and writes what it
says: a relaunch on the task's allocation, the task settled, the attempt
ended, the job retried or finished. A settled task's allocation is freed in
the same transaction: its container is gone, and its GPUs are free for the
pass that follows (the caller asks for it). A repeated report finds the task
settled and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.domain.exits import (
    AttemptEnd,
    Charge,
    ExitDecision,
    ExitKind,
    TaskExit,
    decide_exit,
    is_live,
)
from shared.domain.models import (
    Attempt,
    Job,
    JobSpec,
    Task,
    attempt_task_key,
    task_key,
)
from shared.domain.states import JobState, TaskState
from shared.infra.clock import now_ms
from shared.state import keys, passwake, telemetry, usage
from shared.state.lifecycle import clear_placement, closed_attempt, move_task
from shared.state.store import Pipe, Store, task_is_live
from shared.state.store.jobs import JobView

# A task retry's launch lease when the caller names none: the scheduler sends
# the start again once it is over (retry_stale_launches)
RELAUNCH_LEASE_MS = 60_000


@dataclass(frozen=True)
class ExitReport:
    """What a task exit changed, so the caller knows what to tell whom."""

    task_state: TaskState
    job_state: JobState
    attempt_ended: bool
    retried: bool
    node: str | None
    # The task failed and its role's taskRetryCount covers it: it launches
    # again on its allocation (the caller sends the start)
    relaunched: bool = False
    # The attempt ended with other tasks still live on their nodes: they
    # are to be stopped (the scheduler's stop_attempt)
    live_left: bool = False


def record_task_exit(
    store: Store, job_id: str, attempt: int, role: str, index: int, *,
    exit_code: int, diagnostics: str = "", platform_failure: bool = False,
    task_retry: int | None = None, relaunch_deadline_ms: int | None = None,
    submission: str | None = None, ring: bool = False, node: str | None = None,
) -> ExitReport | None:
    """A task's container ended (or can never run): settle the task and job
    as shared/domain/exits.py `decide_exit` says, on the records read under
    WATCH (the job's config read and parsed once, only for a live attempt).

    `task_retry`: which of the task's containers ended (TaskRef.retry); a
    report of an earlier one is stale. None: whichever is current (a lost
    node). `submission`: the submission the container was made for; a
    container of an earlier submission of the name settles nothing. A
    relaunched task (its role's `taskRetryCount`) goes back to LAUNCHING on
    its allocation under a launch lease to `relaunch_deadline_ms`.

    `node`: the node the task is known to run on (the reporting node's own),
    so that its allocation is read with the records, not after them.

    `ring`: a settled task whose attempt leaves no task live on a node (so
    nothing is left to stop first) rings the schedulers' doorbell for the
    pass its freed allocation asks for, in the same transaction: no round
    trip of its own, and never a settled exit without its ring.

    Returns None when the report is stale (the task settled already).
    """
    seen = TaskExit(exit_code, diagnostics, platform_failure, task_retry, submission)
    key = task_key(role, index)

    def decide(pipe: Pipe) -> ExitReport | None:
        view = store.read_job_view(pipe, job_id, attempt, config=True,
                                   held_on=(node, role, index) if node else None)
        job, tasks = view.job, view.tasks
        spec = None
        if job is not None and key in tasks and is_live(job, attempt) and view.config:
            spec = JobSpec.from_config(view.config)
        decision = decide_exit(job, tasks, key, attempt, spec, seen)
        if decision.kind == ExitKind.STALE or job is None:
            return None
        if decision.kind == ExitKind.RELAUNCH:
            deadline = relaunch_deadline_ms or now_ms() + RELAUNCH_LEASE_MS
            return _relaunch(store, pipe, job, tasks[key], attempt, seen, deadline)
        return _settle_exit(store, pipe, job, tasks, tasks[key], attempt, decision, seen,
                            view, ring)

    return store.transact(decide, keys.job(job_id), keys.job_tasks(job_id, attempt))


def _relaunch(store: Store, pipe: Pipe, job: Job, task: Task, attempt: int, seen: TaskExit,
              deadline_ms: int) -> ExitReport:
    """The failed task starts again by itself: a fresh container on its
    allocation (node, GPUs, ports kept); the job and attempt go on."""
    move_task(task, TaskState.LAUNCHING)
    task.retries += 1
    task.container_id, task.started_ms, task.launched_ms = None, None, now_ms()
    job.version += 1  # a task moved: anyone deciding on the old view must re-read
    pipe.multi()
    store.write_tasks(pipe, job.id, attempt, [task])
    pipe.zadd(keys.LAUNCHING, {attempt_task_key(job.id, attempt, task.role, task.index):
                               deadline_ms})
    store.write_job(pipe, job, job.state)
    store.add_event(pipe, job.id, "task-retry", attempt=attempt, role=task.role,
                    index=task.index, retries=task.retries, exitCode=seen.exit_code,
                    diagnostics=seen.diagnostics, node=task.node)
    telemetry.record(pipe, telemetry.TASK_EXITS, {"state": "RETRIED", "class": "user"})
    return ExitReport(task.state, job.state, False, False, task.node, relaunched=True)


def _settle_exit(store: Store, pipe: Pipe, job: Job, tasks: dict[str, Task], task: Task,
                 attempt: int, decision: ExitDecision, seen: TaskExit,
                 view: JobView, ring: bool) -> ExitReport:
    """Write what `decision` says of a settled task, its attempt and its job
    (`view`: what was read with them), and the ring `record_task_exit`
    describes."""
    assert decision.task_state is not None
    now = now_ms()
    move_task(task, decision.task_state)
    task.exit_code, task.diagnostics = seen.exit_code, seen.diagnostics
    task.platform_failure, task.completed_ms = seen.platform_failure, now
    previous = job.state
    closed = _ended_attempt(store, pipe, job, decision.attempt_end, view.attempt)
    new_tasks = _apply_to_job(store, job, tasks, decision, now)
    # Tasks a partial placement (no gang allocation) had not placed yet
    # never run in an attempt that ended.
    unplaced = [t for t in tasks.values() if t.state == TaskState.WAITING] \
        if decision.attempt_ended else []
    for waiting in unplaced:
        move_task(waiting, TaskState.STOPPED)
        waiting.completed_ms = now
    held = usage.held_allocation(pipe, job.id, attempt, task, view.held)

    pipe.multi()
    store.write_tasks(pipe, job.id, attempt, [task, *unplaced])
    usage.record_task_usage(pipe, held, task)  # placement to exit, recorded once
    if task.node:  # its container is gone: its GPUs are free for the next pass
        pipe.hdel(keys.node_alloc(task.node),
                  attempt_task_key(job.id, attempt, task.role, task.index))
    if job.state.is_final:
        store.dequeue(pipe, job.id, job.virtual_cluster)
    pipe.zrem(keys.LAUNCHING, attempt_task_key(job.id, attempt, task.role, task.index))
    if closed is not None:
        store.write_attempt(pipe, job.id, closed)
    if new_tasks:
        store.write_tasks(pipe, job.id, job.attempt, new_tasks)
        store.write_attempt(pipe, job.id, Attempt(index=job.attempt, created_ms=now))
        store.enqueue(pipe, job)
    store.write_job(pipe, job, previous)
    store.add_event(pipe, job.id, "task-exit", attempt=attempt, role=task.role,
                    index=task.index, state=task.state, exitCode=seen.exit_code,
                    diagnostics=seen.diagnostics)
    telemetry.record(pipe, telemetry.TASK_EXITS, {
        "state": task.state, "class": "platform" if seen.platform_failure else "user"})
    if decision.attempt_ended:
        store.add_event(pipe, job.id, "attempt-end", attempt=attempt, state=job.state,
                        retried=decision.retry is not None)
    live_left = decision.attempt_ended and any(
        other is not task and other.node and task_is_live(other) for other in tasks.values())
    if ring and not live_left:
        passwake.ring(pipe)
    return ExitReport(task.state, job.state, decision.attempt_ended, decision.retry is not None,
                      task.node, live_left=live_left)


def _ended_attempt(store: Store, pipe: Pipe, job: Job, end: AttemptEnd | None,
                   current: Attempt | None) -> Attempt | None:
    """The job's current attempt record, closed as `end` says (None: it goes
    on); `current`: a record read already, used if it is that attempt's."""
    if end is None:
        return None
    closed = closed_attempt(store, pipe, job, end.state, end.exit_code, end.reason,
                             end.platform_failure, current)
    if end.preempted_by:
        closed.preempted_by = end.preempted_by
    return closed


def _apply_to_job(store: Store, job: Job, tasks: dict[str, Task], decision: ExitDecision,
                  now: int) -> list[Task]:
    """Move the job as `decision` says; the fresh attempt's tasks when it retries."""
    if decision.job_state is None:
        job.version += 1  # a task moved: anyone deciding on the old view must re-read
        return []
    store.bump(job, decision.job_state)
    if decision.retry is None:
        job.completed_ms = now
        end = decision.attempt_end
        if end is not None and decision.job_state != JobState.STOPPED:
            job.exit_code, job.exit_diagnostics = end.exit_code, end.reason
        return []
    job.attempt += 1
    if decision.retry == Charge.PREEMPTION:
        job.preemptions += 1
    elif decision.retry == Charge.RETRY_COUNT:
        job.retries += 1
    else:
        job.platform_retries += 1
    clear_placement(job)
    if decision.retry != Charge.PREEMPTION:
        job.retry_after_ms = None
        if decision.retry_delay_seconds:
            job.retry_after_ms = now + decision.retry_delay_seconds * 1000
            job.waiting_reason = (f"retry {job.retries} waits {decision.retry_delay_seconds} "
                                  f"s (back-off)")
    return [Task(role=t.role, index=t.index) for t in tasks.values()]


