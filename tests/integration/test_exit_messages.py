"""What one message at an attempt's end relies on.

When a task's exit ends its attempt, the monitor (and the launcher, for a
task that never started) sends the scheduler `attempt_ended` alone, not
`task_ended` as well: the scheduler's handling of the attempt's end frees
the allocation of every settled task of the attempt, the reporting task's
included, and runs the pass that lets waiting work in.
"""

from __future__ import annotations

import pytest

from services.scheduler.service import Scheduler
from shared.domain.states import TaskState
from shared.state.lifecycle import mark_task_running, submit_job
from shared.state.store import Store
from shared.state.taskexits import record_task_exit
from tests.support.scheduling import add_node, config, scheduler, store

pytestmark = pytest.mark.redis
__all__ = ["scheduler", "store"]  # the fixtures, used by name


def test_the_attempts_end_alone_frees_the_last_tasks_allocation(
        store: Store, scheduler: Scheduler) -> None:
    add_node(store)
    submit_job(store, "alice", config("a", gpus=6))
    submit_job(store, "alice", config("b", gpus=6))
    scheduler.run_pass()
    mark_task_running(store, "alice~a", 0, "main", 0, "cid")
    report = record_task_exit(store, "alice~a", 0, "main", 0, exit_code=0)
    assert report is not None and report.attempt_ended

    scheduler.stop_attempt("alice~a", 0)  # what the attempt_ended message runs

    b = store.get_tasks("alice~b", 0)[0]
    assert b.state == TaskState.LAUNCHING and len(b.gpus) == 6
    assert store.get_allocations(store.r, "n1").keys() == {"alice~b:0:main:0"}


def test_the_attempts_end_frees_every_settled_task_of_a_gang(
        store: Store, scheduler: Scheduler) -> None:
    add_node(store)
    submit_job(store, "alice", config("a", gpus=2, tasks=3))
    scheduler.run_pass()
    reports = []
    for index in range(3):
        mark_task_running(store, "alice~a", 0, "main", index, f"cid{index}")
        reports.append(record_task_exit(store, "alice~a", 0, "main", index, exit_code=0))
    assert [r is not None and r.attempt_ended for r in reports] == [False, False, True]

    # The first two tasks' task_ended messages were lost: the end frees them too.
    scheduler.stop_attempt("alice~a", 0)

    assert store.get_allocations(store.r, "n1") == {}
