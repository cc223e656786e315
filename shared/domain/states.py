"""Job and task states, each with the one table of moves it may make.

A move not in the table is a bug in the caller: `check_job_move` and
`check_task_move` raise `IllegalTransition` rather than let it through.
"""

from __future__ import annotations

from enum import StrEnum


class IllegalTransition(ValueError):
    def __init__(self, kind: str, current: str, target: str) -> None:
        super().__init__(f"illegal {kind} transition {current} -> {target}")
        self.kind, self.current, self.target = kind, current, target


class JobState(StrEnum):
    # queued, or allocated and its containers starting
    WAITING = "WAITING"
    # a task container of the current attempt has started
    RUNNING = "RUNNING"
    # a stop was requested; containers are being stopped
    STOPPING = "STOPPING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def is_final(self) -> bool:
        return self in JOB_FINAL


JOB_FINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})

JOB_MOVES: dict[JobState, frozenset[JobState]] = {
    # WAITING -> WAITING is a retry of an attempt that never started running.
    JobState.WAITING: frozenset(
        {JobState.WAITING, JobState.RUNNING, JobState.STOPPING, JobState.SUCCEEDED,
         JobState.FAILED, JobState.STOPPED}),
    # RUNNING -> WAITING is a retry: a fresh attempt goes back to the queue.
    JobState.RUNNING: frozenset(
        {JobState.WAITING, JobState.STOPPING, JobState.SUCCEEDED, JobState.FAILED,
         JobState.STOPPED}),
    JobState.STOPPING: frozenset({JobState.STOPPED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.STOPPED: frozenset(),
}


class TaskState(StrEnum):
    # not yet placed
    WAITING = "WAITING"
    # placed on a node; its container is being created (again, after a
    # failure its role's taskRetryCount still covers)
    LAUNCHING = "LAUNCHING"
    # its container started
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def is_final(self) -> bool:
        return self in TASK_FINAL


TASK_FINAL = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED})

TASK_MOVES: dict[TaskState, frozenset[TaskState]] = {
    TaskState.WAITING: frozenset({TaskState.LAUNCHING, TaskState.STOPPED}),
    # LAUNCHING -> SUCCEEDED/FAILED: the container ran and exited before its
    # start was observed (a monitor that was down, or a very short command).
    # -> LAUNCHING, and RUNNING -> LAUNCHING: a task retry (taskRetryCount),
    # a fresh container on the same allocation.
    TaskState.LAUNCHING: frozenset(
        {TaskState.LAUNCHING, TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.FAILED,
         TaskState.STOPPED}),
    TaskState.RUNNING: frozenset({TaskState.LAUNCHING, TaskState.SUCCEEDED, TaskState.FAILED,
                                  TaskState.STOPPED}),
    TaskState.SUCCEEDED: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.STOPPED: frozenset(),
}


def can_move_job(current: JobState, target: JobState) -> bool:
    return target in JOB_MOVES[current]


def can_move_task(current: TaskState, target: TaskState) -> bool:
    return target in TASK_MOVES[current]


def check_job_move(current: JobState, target: JobState) -> None:
    if not can_move_job(current, target):
        raise IllegalTransition("job", current, target)


def check_task_move(current: TaskState, target: TaskState) -> None:
    if not can_move_task(current, target):
        raise IllegalTransition("task", current, target)


# A job that runs or may run: queued, placed, starting or running. Stopping
# and final jobs are not (the scheduler, launcher and monitor all ask this).
LIVE_JOB_STATES = frozenset({JobState.WAITING, JobState.RUNNING})
