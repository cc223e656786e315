"""retryCount -1 / -2 (OpenPAI's serving jobs) on a real Redis: each failed
attempt is queued again without limit, behind a back-off the scheduler
honours, and stop ends it."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from services.scheduler import service as scheduler_service
from services.scheduler.service import Scheduler
from shared.domain.completion import RETRY_BACKOFF_BASE_SECONDS
from shared.domain.models import Gpu, Job, Node
from shared.domain.states import JobState
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.state import keys
from shared.state.lifecycle import mark_task_running, request_stop, submit_job
from shared.state.store import Store
from shared.state.taskexits import record_task_exit

pytestmark = pytest.mark.redis

JOB = "alice~serving"


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    store = Store(redis_client)
    store.register_node(Node("n1", "127.0.0.1", cpus=16, memory_mb=32000,
                             gpus=[Gpu(i) for i in range(2)], port_range=(20000, 20100)))
    return store


@pytest.fixture
def scheduler(redis_server: str, store: Store) -> Scheduler:
    settings = Settings(redis_url=redis_server, node_lost_seconds=30)
    return Scheduler(settings, store, Messenger(make_celery(settings)))


def serving(retry: int) -> dict[str, Any]:
    return {"jobName": "serving", "image": "busybox", "retryCount": retry,
            "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                           "memoryMB": 128, "command": "serve"}]}


def job_of(store: Store) -> Job:
    job = store.get_job(JOB)
    assert job is not None
    return job


def run_and_crash(store: Store, scheduler: Scheduler) -> Job:
    """Place the current attempt, start its task, and let it exit 1."""
    assert scheduler.run_pass().placed == 1
    job = job_of(store)
    assert mark_task_running(store, JOB, job.attempt, "main", 0, "c1")
    assert record_task_exit(store, JOB, job.attempt, "main", 0, exit_code=1) is not None
    return job_of(store)


def back_off_elapses(monkeypatch: pytest.MonkeyPatch, job: Job) -> None:
    """What the clock would do: the scheduler's clock is past the back-off's end
    (the job's record is not rewritten: time passing writes nothing)."""
    assert job.retry_after_ms is not None
    shift = job.retry_after_ms - now_ms() + 1
    monkeypatch.setattr(scheduler_service, "now_ms", lambda: now_ms() + shift)


@pytest.mark.parametrize("retry", [-1, -2])
def test_unlimited_retry_requeues_behind_a_growing_back_off_until_stopped(
        store: Store, scheduler: Scheduler, redis_client: redis.Redis, retry: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    submit_job(store, "alice", serving(retry))
    waits = []
    for attempt in range(1, 4):
        before = now_ms()
        job = run_and_crash(store, scheduler)
        monkeypatch.undo()  # the clock back to now, for the next back-off
        assert (job.state, job.attempt, job.retries) == (JobState.WAITING, attempt, attempt)
        assert job.retry_after_ms is not None
        waits.append(job.retry_after_ms - before)
        assert scheduler.run_pass().placed == 0, "placed while backing off"
        assert "back-off" in job.waiting_reason
        back_off_elapses(monkeypatch, job)
    assert waits[0] >= RETRY_BACKOFF_BASE_SECONDS * 1000
    assert waits[0] < waits[1] < waits[2]

    stopped = request_stop(store, JOB)

    assert stopped.state == JobState.STOPPED
    assert redis_client.zscore(keys.QUEUE, JOB) is None
    assert scheduler.run_pass().placed == 0


def test_a_limited_retry_is_queued_without_waiting(store: Store, scheduler: Scheduler) -> None:
    submit_job(store, "alice", serving(2))
    job = run_and_crash(store, scheduler)
    assert (job.state, job.retry_after_ms) == (JobState.WAITING, None)
    assert scheduler.run_pass().placed == 1
