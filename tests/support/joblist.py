"""Jobs written straight into Redis for the list's tests (any state, any
creation time), and the names a list answers."""

from __future__ import annotations

import pytest
import redis

from shared.domain.jobspec import validate_job_config
from shared.domain.models import Attempt, Job, JobSpec, job_id_of
from shared.domain.states import JobState
from shared.infra.clock import now_ms
from shared.state import keys
from shared.state.accounts import Accounts, VirtualCluster
from shared.state.lifecycle import initial_tasks
from shared.state.store import Store
from tests.support.api import AuthedClient


class Jobs:
    """Stores jobs with chosen creation times and states, as the services would.

    `Store.create_job` writes the job and its indexes; a state other than
    WAITING is reached with `Store.bump` (the legal-move table) and
    `Store.write_job` (record and per-state index), as lifecycle does.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.clock = now_ms() - 10_000_000

    def add(self, username: str, name: str, *, vc: str = "default",
            state: JobState = JobState.WAITING, created_ms: int | None = None) -> Job:
        raw = {"jobName": name, "image": "busybox", "virtualCluster": vc,
               "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                              "memoryMB": 128, "command": "true"}]}
        cfg = validate_job_config(raw, username=username, storage_roots=()).config
        self.clock += 1000
        created = self.clock if created_ms is None else created_ms
        job = self.store.create_job(
            Job(id=job_id_of(username, name), username=username, name=name,
                virtual_cluster=vc, created_ms=created, version=1),
            cfg, initial_tasks(JobSpec.from_config(cfg)), Attempt(index=0, created_ms=created))
        if state != JobState.WAITING:
            previous = self.store.bump(job, state)
            with self.store.r.pipeline() as pipe:
                pipe.zrem(keys.QUEUE, job.id)
                self.store.write_job(pipe, job, previous)
                pipe.execute()
        return job


@pytest.fixture
def jobs(redis_client: redis.Redis) -> Jobs:
    return Jobs(Store(redis_client))


@pytest.fixture
def mixed(jobs: Jobs) -> Jobs:
    """Eight jobs, oldest first: two users, two VCs, four states."""
    Accounts(jobs.store).put_vc(VirtualCluster("vision"))
    for username, name, vc, state in [
        ("alice", "mnist-1", "default", JobState.SUCCEEDED),
        ("bob", "resnet-1", "vision", JobState.FAILED),
        ("alice", "MNIST-2", "vision", JobState.RUNNING),
        ("bob", "bert-1", "default", JobState.WAITING),
        ("alice", "resnet-2", "vision", JobState.WAITING),
        ("bob", "mnist-3", "vision", JobState.STOPPED),
        ("alice", "bert-2", "default", JobState.RUNNING),
        ("bob", "gpt-1", "default", JobState.SUCCEEDED),
    ]:
        jobs.add(username, name, vc=vc, state=state)
    return jobs


def names(client: AuthedClient, query: str = "") -> list[str]:
    resp = client.get(f"/api/v1/jobs{query}")
    assert resp.status_code == 200, resp.json
    assert isinstance(resp.json, list)
    return [row["name"] for row in resp.json]
