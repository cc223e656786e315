"""Jobs without gang allocation (`extras.gangAllocation: false`) through the
scheduler service and the lifecycle, on a real Redis: a job of two one-GPU
tasks on a one-GPU node runs them one after another; commits of a part stay
compare-and-set (a task is placed once, even by two schedulers at once)."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import redis

from services.scheduler.service import Scheduler
from shared.domain.models import Gpu, Job, Node, TaskPlacement
from shared.domain.states import JobState, TaskState
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.state import keys
from shared.state.lifecycle import drop_stale_from_queue, mark_task_running, submit_job
from shared.state.placing import commit_placement
from shared.state.store import Store
from shared.state.taskexits import record_task_exit
from tests.support.lifecycle import DEADLINE_MS, ROUNDS, race

pytestmark = pytest.mark.redis

NODE = "n1"


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    store = Store(redis_client)
    store.register_node(Node(NODE, "127.0.0.1", cpus=16, memory_mb=32000, gpus=[Gpu(0)],
                             port_range=(20000, 20100)))
    return store


@pytest.fixture
def scheduler(redis_server: str, store: Store) -> Scheduler:
    settings = Settings(redis_url=redis_server, node_lost_seconds=30)
    return Scheduler(settings, store, Messenger(make_celery(settings)))


def config(name: str, *, gang: bool = False, tasks: int = 2, **extra: Any) -> dict[str, Any]:
    return {"jobName": name, "image": "busybox", "extras": {"gangAllocation": gang},
            "taskRoles": [{"name": "main", "taskNumber": tasks, "cpuNumber": 1,
                           "memoryMB": 128, "gpuNumber": 1, "command": "run"}], **extra}


def job_of(store: Store, job_id: str) -> Job:
    job = store.get_job(job_id)
    assert job is not None
    return job


def states(store: Store, job_id: str, attempt: int = 0) -> list[TaskState]:
    return [t.state for t in store.get_tasks(job_id, attempt)]


def queued(redis_client: redis.Redis, job_id: str) -> bool:
    return redis_client.zscore(keys.QUEUE, job_id) is not None


def run_task(store: Store, scheduler: Scheduler, job_id: str, index: int, code: int) -> None:
    """The task's container starts, then exits with `code`; its GPU is freed."""
    assert mark_task_running(store, job_id, 0, "main", index, f"c{index}")
    assert record_task_exit(store, job_id, 0, "main", index, exit_code=code) is not None
    scheduler.release_if_settled(job_id, 0, "main", index)


def test_two_one_gpu_tasks_run_one_after_another_on_one_gpu(
        store: Store, scheduler: Scheduler, redis_client: redis.Redis) -> None:
    job_id = submit_job(store, "alice", config("loose")).id

    assert scheduler.run_pass().placed == 1
    assert states(store, job_id) == [TaskState.LAUNCHING, TaskState.WAITING]
    assert job_of(store, job_id).state == JobState.WAITING
    assert queued(redis_client, job_id), "the rest of the job left the queue"

    assert mark_task_running(store, job_id, 0, "main", 0, "c0")
    assert job_of(store, job_id).state == JobState.RUNNING
    assert scheduler.run_pass().placed == 0, "the GPU was given twice"
    assert queued(redis_client, job_id), "a running job still placing was dropped"

    assert record_task_exit(store, job_id, 0, "main", 0, exit_code=0) is not None
    assert job_of(store, job_id).state == JobState.RUNNING  # one task still to run
    scheduler.release_if_settled(job_id, 0, "main", 0)
    assert scheduler.run_pass().placed == 1
    assert states(store, job_id) == [TaskState.SUCCEEDED, TaskState.LAUNCHING]
    assert not queued(redis_client, job_id)
    placed = [e for e in store.get_events(job_id) if e["kind"] == "placed"]
    assert [(e["waiting"], [t["index"] for t in e["tasks"]]) for e in placed] == [
        (1, [0]), (0, [1])]

    run_task(store, scheduler, job_id, 1, 0)
    done = job_of(store, job_id)
    assert (done.state, done.retries) == (JobState.SUCCEEDED, 0)


def test_a_gang_job_of_that_shape_is_never_placed_in_part(
        store: Store, scheduler: Scheduler) -> None:
    job_id = submit_job(store, "alice", config("gang", gang=True)).id
    assert scheduler.run_pass().placed == 0
    assert states(store, job_id) == [TaskState.WAITING, TaskState.WAITING]
    assert "cannot fit even on empty nodes" in job_of(store, job_id).waiting_reason


def test_a_failure_with_tasks_unplaced_ends_the_job_and_stops_them(
        store: Store, scheduler: Scheduler, redis_client: redis.Redis) -> None:
    job_id = submit_job(store, "alice", config("fails")).id
    assert scheduler.run_pass().placed == 1
    run_task(store, scheduler, job_id, 0, 3)
    done = job_of(store, job_id)
    assert (done.state, done.exit_code) == (JobState.FAILED, 3)
    assert states(store, job_id) == [TaskState.FAILED, TaskState.STOPPED]
    assert not queued(redis_client, job_id)
    assert scheduler.run_pass().placed == 0


def test_a_retry_of_a_partly_run_job_asks_for_every_task_again(
        store: Store, scheduler: Scheduler, redis_client: redis.Redis) -> None:
    job_id = submit_job(store, "alice", config("again", retryCount=1)).id
    assert scheduler.run_pass().placed == 1
    run_task(store, scheduler, job_id, 0, 1)
    job = job_of(store, job_id)
    assert (job.state, job.attempt, job.retries) == (JobState.WAITING, 1, 1)
    assert states(store, job_id, 0) == [TaskState.FAILED, TaskState.STOPPED]
    assert scheduler.run_pass().placed == 1
    assert states(store, job_id, 1) == [TaskState.LAUNCHING, TaskState.WAITING]


def test_the_queue_keeps_a_running_job_only_while_it_has_tasks_to_place(
        store: Store, scheduler: Scheduler, redis_client: redis.Redis) -> None:
    job_id = submit_job(store, "alice", config("kept")).id
    assert scheduler.run_pass().placed == 1
    assert mark_task_running(store, job_id, 0, "main", 0, "c0")
    assert drop_stale_from_queue(store, [job_id]) == []
    assert queued(redis_client, job_id)
    # Once every task is placed an entry left behind is stale.
    run_task(store, scheduler, job_id, 0, 0)
    assert scheduler.run_pass().placed == 1
    redis_client.zadd(keys.QUEUE, {job_id: 1})
    assert drop_stale_from_queue(store, [job_id]) == [job_id]


def test_a_partial_commit_must_name_waiting_tasks_of_a_queued_job(store: Store) -> None:
    job = submit_job(store, "alice", config("checks", tasks=3))
    one = [TaskPlacement("main", 0, NODE, "127.0.0.1", (0,), 1, 128, {"default": [20000]})]
    # As a gang it must cover every task.
    assert not commit_placement(store, job.id, version=job.version, attempt=0,
                                placements=one, launch_deadline_ms=DEADLINE_MS)
    assert commit_placement(store, job.id, version=job.version, attempt=0, placements=one,
                            launch_deadline_ms=DEADLINE_MS, gang=False)
    again = job_of(store, job.id)
    # Task 0 is placed already: naming it again is refused, whatever the version.
    assert not commit_placement(store, job.id, version=again.version, attempt=0,
                                placements=one, launch_deadline_ms=DEADLINE_MS, gang=False)
    unknown = [TaskPlacement("main", 7, NODE, "127.0.0.1", (), 1, 128, {"default": [20001]})]
    assert not commit_placement(store, job.id, version=again.version, attempt=0,
                                placements=unknown, launch_deadline_ms=DEADLINE_MS, gang=False)


def commit_one(store: Store, job: Job, node: str, index: int) -> bool:
    plan = [TaskPlacement("main", index, node, "127.0.0.1", (0,), 1, 128,
                          {"default": [20000 + index]})]
    return commit_placement(store, job.id, version=job.version, attempt=job.attempt,
                            placements=plan, launch_deadline_ms=DEADLINE_MS, gang=False)


def test_concurrent_partial_commits_give_the_one_gpu_once(
        store: Store, redis_server: str, redis_client: redis.Redis) -> None:
    for round_no in range(ROUNDS):
        node = f"one-gpu-{round_no}"
        store.register_node(Node(node, "127.0.0.1", cpus=16, memory_mb=32000, gpus=[Gpu(0)],
                                 port_range=(20000, 20100)))
        job = submit_job(store, "alice", config(f"race-{round_no}"))
        # Two schedulers saw the same snapshot: one places task 0, the
        # other task 1, both on the node's GPU 0.
        results = race(redis_server, partial(commit_one, job=job, node=node, index=0),
                       partial(commit_one, job=job, node=node, index=1))
        assert sorted(results) == [False, True]
        assert len(store.get_allocations(redis_client, node)) == 1
        assert sorted(states(store, job.id)) == [TaskState.LAUNCHING, TaskState.WAITING]
