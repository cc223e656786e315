"""GPU health on a real Redis: an injected fault marks a GPU unhealthy, the
scheduler places nothing on it, its task fails as the platform's fault and
is retried uncharged, GET /nodes shows why, and only an admin clears it."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from flask import Flask

from services.monitor.gpuhealth import GpuHealthWatch
from services.scheduler.service import Scheduler
from shared.domain import gpuhealth
from shared.domain.models import TaskPlacement
from shared.domain.states import JobState, TaskState
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.node.containers import TaskRef
from shared.node.nvml import Nvml
from shared.state import gpufaults, keys, passwake
from shared.state.lifecycle import mark_task_running, submit_job
from shared.state.placing import commit_placement
from shared.state.store import Store
from tests.support.api import AuthedClient
from tests.support.cli import api, pai_as, run  # noqa: F401 (api: a fixture)
from tests.support.scheduling import add_node, config

pytestmark = pytest.mark.redis

DEADLINE_MS = 2**41


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    return Store(redis_client)


@pytest.fixture
def scheduler(redis_server: str, store: Store) -> Scheduler:
    settings = Settings(redis_url=redis_server)
    return Scheduler(settings, store, Messenger(make_celery(settings)))


class Recorder:
    """What the watch asked of Docker and the scheduler (the seams it is given)."""

    def __init__(self) -> None:
        self.stopped: list[TaskRef] = []
        self.told: list[tuple[TaskRef, bool]] = []

    def watch(self, store: Store, node: str = "n1") -> GpuHealthWatch:
        return GpuHealthWatch(store, node, self.stopped.append,
                              lambda ref, ended: self.told.append((ref, ended)), Nvml())


def test_the_scheduler_places_nothing_on_an_unhealthy_gpu(
        store: Store, scheduler: Scheduler) -> None:
    add_node(store, gpus=2)
    gpufaults.inject(store.r, "n1", 0, xid=79)
    assert [f.index for f in Recorder().watch(store).check()] == [0]
    submit_job(store, "alice", config("one", gpus=1))
    submit_job(store, "alice", config("two", gpus=1))
    scheduler.run_pass()
    first, second = (store.get_tasks(f"alice~{n}", 0)[0] for n in ("one", "two"))
    assert (first.state, first.gpus) == (TaskState.LAUNCHING, [1])
    assert second.state == TaskState.WAITING  # GPU 0 is free but failed


def test_a_commit_planned_before_the_mark_is_refused(store: Store) -> None:
    add_node(store, gpus=2)
    job = submit_job(store, "alice", config("late", gpus=1))
    gpufaults.mark_fault(store.r, gpuhealth.GpuFault("n1", 0, "XID 48", 1))
    assert not commit_placement(store, job.id, version=job.version, attempt=0, placements=[
        TaskPlacement("main", 0, "n1", "127.0.0.1", (0,), 1, 128, {})],
        launch_deadline_ms=DEADLINE_MS)
    assert commit_placement(store, job.id, version=job.version, attempt=0, placements=[
        TaskPlacement("main", 0, "n1", "127.0.0.1", (1,), 1, 128, {})],
        launch_deadline_ms=DEADLINE_MS)


def test_a_task_on_a_failed_gpu_fails_as_the_platforms_fault_and_is_retried_uncharged(
        store: Store, scheduler: Scheduler) -> None:
    add_node(store, gpus=4)
    job = submit_job(store, "alice", config("train", gpus=2, retry=0))
    scheduler.run_pass()
    task = store.get_tasks(job.id, 0)[0]
    assert mark_task_running(store, job.id, 0, "main", 0, "container")
    failed_gpu = task.gpus[1]

    recorder = Recorder()
    gpufaults.inject(store.r, "n1", failed_gpu, xid=79)
    [fault] = recorder.watch(store).check()
    assert (fault.index, fault.reason, fault.source) == (failed_gpu, "XID 79 (injected)",
                                                         "injected")
    ref = TaskRef(job.id, 0, "main", 0)
    assert recorder.stopped == [ref] and recorder.told == [(ref, True)]
    ended = store.get_tasks(job.id, 0)[0]
    assert (ended.state, ended.platform_failure) == (TaskState.FAILED, True)
    assert f"GPU {failed_gpu} of node n1 failed: XID 79" in ended.diagnostics
    retried = store.get_job(job.id)
    assert retried is not None and (retried.state, retried.attempt, retried.retries,
                                    retried.platform_retries) == (JobState.WAITING, 1, 0, 1)

    # the allocation is released once the container is gone; the retry avoids the GPU
    scheduler.task_ended(job.id, 0, "main", 0)
    again = store.get_tasks(job.id, 1)[0]
    assert again.state == TaskState.LAUNCHING and failed_gpu not in again.gpus
    # a second round, and a repeated injection, change nothing
    gpufaults.inject(store.r, "n1", failed_gpu, xid=79)
    assert recorder.watch(store).check() == [] and len(recorder.told) == 1


def test_a_task_left_on_a_marked_gpu_is_failed_on_the_next_round(
        store: Store, scheduler: Scheduler) -> None:
    """A monitor that died between marking a GPU and failing its tasks."""
    add_node(store, gpus=1)
    job = submit_job(store, "alice", config("left", gpus=1))
    scheduler.run_pass()
    assert mark_task_running(store, job.id, 0, "main", 0, "container")
    gpufaults.mark_fault(store.r, gpuhealth.GpuFault("n1", 0, "XID 79", 1))
    recorder = Recorder()
    assert recorder.watch(store).check() == []  # nothing new to mark...
    assert recorder.told == [(TaskRef(job.id, 0, "main", 0), True)]  # ...but its task failed
    assert store.get_tasks(job.id, 0)[0].platform_failure


def test_a_malformed_injection_is_skipped(store: Store) -> None:
    store.r.rpush(keys.gpu_fault_injections("n1"), "not json", '{"gpu": "x"}')
    gpufaults.inject(store.r, "n1", 3, reason="fell off the bus")
    assert [(f.index, f.reason) for f in Recorder().watch(store).check()] == [
        (3, "fell off the bus (injected)")]
    assert not store.r.exists(keys.gpu_fault_injections("n1"))


# ------------------------------------------------------------------ the API


def test_nodes_show_the_fault_and_an_admin_clears_it(
        redis_client: redis.Redis, admin: AuthedClient, alice: AuthedClient) -> None:
    add_node(Store(redis_client), gpus=2)
    gpufaults.mark_fault(redis_client, gpuhealth.GpuFault("n1", 1, "XID 79", 1234))
    [node] = alice.get("/api/v1/nodes").json
    assert (node["gpuUnhealthy"], node["gpuFree"]) == (1, 1)
    assert [(g["healthy"], g["unhealthyReason"], g["unhealthySince"]) for g in node["gpus"]] == [
        (True, "", None), (False, "XID 79", 1234)]

    refused = alice.delete("/api/v1/nodes/n1/gpus/1/fault")
    assert refused.status_code == 403
    assert admin.delete("/api/v1/nodes/n1/gpus/7/fault").json["code"] == "NoGpuError"
    assert admin.delete("/api/v1/nodes/ghost/gpus/0/fault").json["code"] == "NoNodeError"
    cleared = admin.delete("/api/v1/nodes/n1/gpus/1/fault")
    assert cleared.status_code == 200, cleared.json
    assert (cleared.json["gpuUnhealthy"], cleared.json["gpus"][1]["healthy"]) == (0, True)
    assert redis_client.lrange(passwake.KEY, 0, -1) == ["1"]  # waiting jobs may fit now
    again = admin.delete("/api/v1/nodes/n1/gpus/1/fault")
    assert (again.status_code, again.json["code"]) == (404, "NoGpuFaultError")


def test_pai_nodes_shows_the_fault_and_clear_gpu_clears_it(
        api: tuple[str, Flask], tmp_path: Path,  # noqa: F811
        redis_client: redis.Redis) -> None:
    gpufaults.mark_fault(redis_client, gpuhealth.GpuFault("n1", 1, "XID 79", 1234))
    root = pai_as(api, tmp_path, "root")
    assert "GPU 1 unhealthy: XID 79" in run(root, "nodes").stdout
    refused = run(pai_as(api, tmp_path, "alice"), "nodes", "clear-gpu", "n1", "1")
    assert refused.exit_code == 1 and refused.stderr.startswith("error: ForbiddenUserError:")
    done = run(root, "nodes", "clear-gpu", "n1", "1")
    assert (done.exit_code, done.stdout) == (0, "GPU 1 of node n1 is schedulable again\n")
    assert "unhealthy" not in run(root, "nodes").stdout
