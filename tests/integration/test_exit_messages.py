"""What one message after an exit relies on.

A task's exit frees its allocation in its own transaction
(shared/state/taskexits.py), so the monitor asks the scheduler for a pass
(`schedule`) and nothing more, unless the exit ended its attempt while other
tasks still run: then `attempt_ended`, whose handling stops them (and frees
what each held once it is settled).
"""

from __future__ import annotations

import pytest

from services.scheduler.service import Scheduler
from shared.domain.states import TaskState
from shared.state import keys
from shared.state.lifecycle import mark_task_running, submit_job
from shared.state.store import Store
from shared.state.taskexits import record_task_exit
from tests.support.scheduling import add_node, config, scheduler, store

pytestmark = pytest.mark.redis
__all__ = ["scheduler", "store"]  # the fixtures, used by name


def test_an_exit_frees_its_allocation_and_a_pass_lets_the_waiting_job_in(
        store: Store, scheduler: Scheduler) -> None:
    add_node(store)
    submit_job(store, "alice", config("a", gpus=6))
    submit_job(store, "alice", config("b", gpus=6))
    scheduler.run_pass()
    mark_task_running(store, "alice~a", 0, "main", 0, "cid")

    report = record_task_exit(store, "alice~a", 0, "main", 0, exit_code=0)

    assert report is not None and report.attempt_ended and not report.live_left
    assert store.get_allocations(store.r, "n1").keys() == set()
    scheduler.request_pass()  # what the schedule message runs
    b = store.get_tasks("alice~b", 0)[0]
    assert b.state == TaskState.LAUNCHING and len(b.gpus) == 6
    assert store.get_allocations(store.r, "n1").keys() == {"alice~b:0:main:0"}


def test_each_task_of_a_gang_frees_its_own_allocation_as_it_exits(
        store: Store, scheduler: Scheduler) -> None:
    add_node(store)
    submit_job(store, "alice", config("a", gpus=2, tasks=3))
    scheduler.run_pass()
    held = []
    for index in range(3):
        mark_task_running(store, "alice~a", 0, "main", index, f"cid{index}")
        report = record_task_exit(store, "alice~a", 0, "main", index, exit_code=0)
        assert report is not None and not report.live_left
        held.append(len(store.get_allocations(store.r, "n1")))

    assert held == [2, 1, 0]


def test_an_attempt_ended_under_a_running_task_stops_it_and_frees_it_once_settled(
        store: Store, scheduler: Scheduler) -> None:
    add_node(store)
    submit_job(store, "alice", config("a", gpus=2, tasks=2))
    scheduler.run_pass()
    for index in range(2):
        mark_task_running(store, "alice~a", 0, "main", index, f"cid{index}")

    report = record_task_exit(store, "alice~a", 0, "main", 0, exit_code=3)

    assert report is not None and report.attempt_ended and report.live_left
    assert store.get_allocations(store.r, "n1").keys() == {"alice~a:0:main:1"}
    scheduler.stop_attempt("alice~a", 0)  # what the attempt_ended message runs
    assert store.get_allocations(store.r, "n1").keys() == {"alice~a:0:main:1"}  # it runs
    record_task_exit(store, "alice~a", 0, "main", 1, exit_code=143)  # its stop, seen
    assert store.get_allocations(store.r, "n1") == {}


def test_an_allocation_a_settle_left_behind_is_freed_by_the_attempts_end(
        store: Store, scheduler: Scheduler) -> None:
    """A task settled with its allocation kept (an exit recorded by an
    earlier version): the attempt's end frees it and passes, so the waiting
    job gets the GPUs."""
    add_node(store)
    submit_job(store, "alice", config("a", gpus=6))
    submit_job(store, "alice", config("b", gpus=6))
    scheduler.run_pass()
    mark_task_running(store, "alice~a", 0, "main", 0, "cid")
    kept = store.r.hget(keys.node_alloc("n1"), "alice~a:0:main:0")
    record_task_exit(store, "alice~a", 0, "main", 0, exit_code=0)
    store.r.hset(keys.node_alloc("n1"), "alice~a:0:main:0", kept)

    scheduler.stop_attempt("alice~a", 0)

    assert store.get_allocations(store.r, "n1").keys() == {"alice~b:0:main:0"}
