"""taskRetryCount (OpenPAI v2's per-role retry) through `shared.state.lifecycle` on
a real Redis: a failed task starts again by itself, on its allocation, with
its own counter, before its failure counts for the job; a report of an
earlier container never touches the new one, and duplicate exit messages
relaunch it once."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import redis

from shared.domain.completion import NON_RETRYABLE_PREFIX
from shared.domain.models import Gpu, Job, Node, Task, attempt_task_key
from shared.domain.states import JobState, TaskState
from shared.state import keys, usage
from shared.state.lifecycle import mark_preempted, mark_task_running, request_stop, submit_job
from shared.state.store import Store
from shared.state.taskexits import ExitReport, record_task_exit
from tests.support.lifecycle import ROUNDS, place, race
from tests.support.polling import wait_past

pytestmark = pytest.mark.redis


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    store = Store(redis_client)
    store.register_node(Node("n1", "10.0.0.1", cpus=1024, memory_mb=1 << 30,
                             gpus=[Gpu(i) for i in range(1024)]))
    return store


def config(name: str, task_retries: int, tasks: int = 1, **extra: Any) -> dict[str, Any]:
    return {"jobName": name, "image": "busybox", **extra,
            "taskRoles": [{"name": "main", "taskNumber": tasks, "cpuNumber": 1,
                           "memoryMB": 512, "gpuNumber": 1, "command": "train",
                           "taskRetryCount": task_retries}]}


def started(store: Store, name: str, task_retries: int, **extra: Any) -> Job:
    """A job submitted, placed on n1, its task 0 running."""
    job = submit_job(store, "alice", config(name, task_retries, **extra))
    place(store, job.id)
    assert mark_task_running(store, job.id, 0, "main", 0, "c0", task_retry=0)
    return job


def task0(store: Store, job_id: str, attempt: int = 0) -> Task:
    task = store.get_task(job_id, attempt, "main", 0)
    assert task is not None
    return task


def job_of(store: Store, job_id: str) -> Job:
    job = store.get_job(job_id)
    assert job is not None
    return job


def fail(store: Store, job_id: str, retry: int | None, code: int = 3,
         **options: Any) -> ExitReport | None:
    return record_task_exit(store, job_id, 0, "main", 0, exit_code=code, task_retry=retry,
                            **options)


def test_a_task_that_fails_once_then_succeeds(store: Store, redis_client: redis.Redis) -> None:
    job = started(store, "once", 2)
    before = task0(store, job.id)
    lease = attempt_task_key(job.id, 0, "main", 0)

    report = fail(store, job.id, 0, relaunch_deadline_ms=2**41)

    assert report is not None and report.relaunched and not report.attempt_ended
    assert (report.task_state, report.node) == (TaskState.LAUNCHING, "n1")
    again = task0(store, job.id)
    assert (again.state, again.retries, again.container_id) == (TaskState.LAUNCHING, 1, None)
    assert (again.node, again.gpus, again.ports) == (before.node, before.gpus, before.ports)
    assert redis_client.zscore(keys.LAUNCHING, lease) == 2**41
    assert lease in store.get_allocations(redis_client, "n1"), "allocation kept"
    assert job_of(store, job.id).state == JobState.RUNNING
    retry_events = [e for e in store.get_events(job.id) if e["kind"] == "task-retry"]
    assert [(e["retries"], e["exitCode"]) for e in retry_events] == [(1, 3)]

    assert mark_task_running(store, job.id, 0, "main", 0, "c1", task_retry=1)
    done = record_task_exit(store, job.id, 0, "main", 0, exit_code=0, task_retry=1)
    assert done is not None and done.attempt_ended
    final = job_of(store, job.id)
    assert (final.state, final.retries, final.attempt) == (JobState.SUCCEEDED, 0, 0)
    assert (task0(store, job.id).state, task0(store, job.id).retries) == (TaskState.SUCCEEDED, 1)


def test_task_retries_used_up_the_failure_counts_for_the_job(store: Store) -> None:
    job = started(store, "used-up", 1, retryCount=1)
    assert (report := fail(store, job.id, 0)) is not None and report.relaunched
    assert mark_task_running(store, job.id, 0, "main", 0, "c1", task_retry=1)
    second = fail(store, job.id, 1)
    assert second is not None and not second.relaunched and second.retried
    after = job_of(store, job.id)
    assert (after.state, after.attempt, after.retries) == (JobState.WAITING, 1, 1)
    assert (task0(store, job.id).state, task0(store, job.id).retries) == (TaskState.FAILED, 1)
    assert task0(store, job.id, attempt=1).retries == 0, "a new attempt starts afresh"


def test_a_failure_before_the_start_was_seen_relaunches_too(store: Store) -> None:
    job = submit_job(store, "alice", config("early", 1))
    place(store, job.id)
    report = fail(store, job.id, 0)
    assert report is not None and report.relaunched
    assert (task0(store, job.id).state, task0(store, job.id).retries) == (TaskState.LAUNCHING, 1)
    assert job_of(store, job.id).state == JobState.WAITING  # nothing has run yet


NOT_RETRIED = [
    pytest.param({"code": 0}, TaskState.SUCCEEDED, id="success"),
    pytest.param({"platform_failure": True}, TaskState.FAILED, id="platform failure"),
    pytest.param({"diagnostics": f"{NON_RETRYABLE_PREFIX} image gone"}, TaskState.FAILED,
                 id="non-retryable"),
]


@pytest.mark.parametrize(("exit_options", "state"), NOT_RETRIED)
def test_only_a_failure_of_the_program_is_retried(store: Store, exit_options: dict[str, Any],
                                                  state: TaskState) -> None:
    job = started(store, "no-retry", 3)
    report = fail(store, job.id, 0, **exit_options)
    assert report is not None and not report.relaunched
    assert (task0(store, job.id).state, task0(store, job.id).retries) == (state, 0)


def test_a_stopping_job_is_not_retried(store: Store) -> None:
    job = started(store, "stopping", 3)
    assert request_stop(store, job.id).state == JobState.STOPPING
    report = fail(store, job.id, 0, code=137)
    assert report is not None and not report.relaunched
    assert job_of(store, job.id).state == JobState.STOPPED


def test_a_preempted_job_is_not_retried(store: Store) -> None:
    job = started(store, "preempted", 3)
    assert mark_preempted(store, job.id, attempt=0, by="alice~vip", deadline_ms=2**41)
    report = fail(store, job.id, 0, code=143)
    assert report is not None and not report.relaunched
    assert task0(store, job.id).state == TaskState.STOPPED


def test_reports_of_the_earlier_container_are_stale(store: Store) -> None:
    job = started(store, "stale", 2)
    assert (report := fail(store, job.id, 0)) is not None and report.relaunched
    version = job_of(store, job.id).version
    # The first container's exit again (event and reconcile), and its start
    # replayed from the event stream: none touches the relaunched task.
    assert fail(store, job.id, 0) is None
    assert not mark_task_running(store, job.id, 0, "main", 0, "c0", task_retry=0)
    assert (task0(store, job.id).state, task0(store, job.id).retries) == (TaskState.LAUNCHING, 1)
    assert job_of(store, job.id).version == version
    # A lost node (no container named) still settles the current one.
    lost = fail(store, job.id, None, code=-1, platform_failure=True)
    assert lost is not None and lost.task_state == TaskState.FAILED


def test_duplicate_exit_messages_relaunch_once(
        store: Store, redis_server: str, redis_client: redis.Redis) -> None:
    for round_no in range(ROUNDS):
        job = started(store, f"dup-{round_no}", 5)
        reports = race(redis_server, partial(fail, job_id=job.id, retry=0),
                       partial(fail, job_id=job.id, retry=0))
        relaunched = [r for r in reports if r is not None and r.relaunched]
        assert len(relaunched) == 1 and reports.count(None) == 1, reports
        assert task0(store, job.id).retries == 1
        kinds = [e["kind"] for e in store.get_events(job.id)]
        assert kinds.count("task-retry") == 1


def test_the_old_exit_racing_the_new_start_never_fails_the_new_container(
        store: Store, redis_server: str) -> None:
    for round_no in range(ROUNDS):
        job = started(store, f"late-{round_no}", 5)
        assert (report := fail(store, job.id, 0)) is not None and report.relaunched
        # The first container's exit, redelivered, meets the second's start.
        results = race(redis_server, partial(fail, job_id=job.id, retry=0),
                       partial(mark_task_running, job_id=job.id, attempt=0, role="main",
                               index=0, container_id="c1", task_retry=1))
        assert results == [None, True]
        task = task0(store, job.id)
        assert (task.state, task.retries, task.container_id) == (TaskState.RUNNING, 1, "c1")


def test_a_retried_task_is_charged_once_from_placement_to_its_last_exit(
        store: Store, redis_client: redis.Redis) -> None:
    """Usage accounting (issue 20) beside task retries: the allocation is held
    through every retry, so one record covers placement to the last exit,
    not only the last relaunch's run."""
    job = started(store, "charged", 2)
    placed_ms = task0(store, job.id).launched_ms
    assert placed_ms is not None
    wait_past(placed_ms)  # so the relaunch is stamped later than the placement
    assert fail(store, job.id, 0, relaunch_deadline_ms=2**41) is not None
    assert mark_task_running(store, job.id, 0, "main", 0, "c1", task_retry=1)
    assert record_task_exit(store, job.id, 0, "main", 0, exit_code=0, task_retry=1) is not None

    task = task0(store, job.id)
    assert task.launched_ms is not None and task.launched_ms > placed_ms  # the relaunch
    assert task.completed_ms is not None
    day = usage.day_of(task.completed_ms)
    rows = [row for row in usage.read_days(redis_client, [day]) if row.job == job.id]
    assert len(rows) == 1
    assert rows[0].gpu_ms == task.completed_ms - placed_ms
