"""Per-task samples and idle-GPU flags on real Redis and Docker, with virtual
GPUs whose utilisation the test hook sets (no NVML on this machine)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import docker
import pytest
import redis
from docker.models.containers import Container
from flask.testing import FlaskClient

from services.api.app import create_app
from services.monitor.run import idle_stopper
from services.monitor.sampling import NodeSampler, NvmlReader
from shared.domain.models import Gpu, Node, TaskPlacement, attempt_task_key
from shared.domain.states import JobState
from shared.infra.clock import now_ms
from shared.infra.messaging import STOP_JOB
from shared.node.nvml import Nvml
from shared.state import keys, retention, tasksamples, telemetry
from shared.state.accounts import Accounts, VirtualCluster
from shared.state.lifecycle import submit_job
from shared.state.placing import commit_placement
from shared.state.taskexits import record_task_exit
from tests.support.api import AuthedClient, error_of, new_user, signed_in
from tests.support.monitor_rig import GATE, USER, NoNvml, Rig, release
from tests.support.polling import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.redis]

GPUS = (0, 1)


@pytest.fixture
def rig(redis_server: str, redis_client: redis.Redis, docker_client: docker.DockerClient,
        test_image: str, test_labels: dict[str, str]) -> Iterator[Rig]:
    rig = Rig(redis_server, redis_client, docker_client, test_image, test_labels)
    # virtual GPUs; a sample every round; idle after a millisecond; stop at once after
    rig.settings = dataclasses.replace(
        rig.settings, node_virtual_gpus=len(GPUS), task_sample_seconds=0.001,
        idle_gpu_seconds=0.001, idle_gpu_grace_seconds=0.001)
    rig.store.register_node(Node(name=rig.node, ip="127.0.0.1", cpus=64, memory_mb=1 << 20,
                                 gpus=[Gpu(index=i) for i in GPUS]))
    try:
        yield rig
    finally:
        rig.close()


def place_gpu_job(rig: Rig) -> str:
    config = {"jobName": f"job-{uuid.uuid4().hex[:8]}", "image": rig.image,
              "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128,
                             "gpuNumber": len(GPUS), "command": "true"}]}
    job = submit_job(rig.store, USER, config)
    placement = TaskPlacement(role="main", index=0, node=rig.node, ip="127.0.0.1", gpus=GPUS,
                              cpus=1, memory_mb=128, ports={"default": [15000]})
    assert commit_placement(rig.store, job.id, version=job.version, attempt=0,
                            placements=[placement], launch_deadline_ms=now_ms() + 600_000)
    return job.id


def running(rig: Rig) -> tuple[str, Container]:
    job_id = place_gpu_job(rig)
    container = rig.run(job_id, GATE)
    wait_for(lambda: container.reload() or container.status == "running", "the container to run")
    rig.monitor().reconcile()
    assert rig.task(job_id).state.value == "RUNNING"
    return job_id, container


def sampler(rig: Rig, *, stop: bool = False) -> NodeSampler:
    return NodeSampler(rig.settings, rig.store, rig.docker, NvmlReader(Nvml(NoNvml())),
                       stop_idle=idle_stopper(rig.store, rig.messenger) if stop else None)


def api(rig: Rig) -> tuple[FlaskClient, AuthedClient]:
    client = create_app(rig.settings).test_client()
    return client, signed_in(client, rig.settings.admin_user)


def samples_url(job_id: str, **query: str) -> str:
    user, name = job_id.split("~")
    return f"/api/v1/user/{user}/jobs/{name}/tasks/main/0/samples"


def test_a_running_tasks_samples_are_kept_and_served_to_who_may_read_its_log(rig: Rig) -> None:
    tasksamples.set_virtual_utilization(rig.redis, rig.node, {0: 40.0, 1: 75.5})
    job_id, container = running(rig)
    node = sampler(rig)
    try:
        for _ in range(2):
            node.sample()
    finally:
        node.close()
        release(container)
    client, admin = api(rig)

    resp = admin.get(samples_url(job_id))

    assert resp.status_code == 200, resp.json
    body = resp.json
    assert body["attempt"] == 0 and len(body["samples"]) == 2
    first = body["samples"][0]
    assert first["gpuPercent"] == [40.0, 75.5]
    assert first["memoryBytes"] > 0 and first["cpuPercent"] is not None
    assert first["time"] <= body["samples"][1]["time"]
    assert admin.get(samples_url(job_id), query_string={"limit": 1}).json["samples"] == \
        body["samples"][1:]
    # the same authorization as the log: another user may not read them
    bob = new_user(client, admin, "bob")
    assert error_of(bob.get(samples_url(job_id)), 403) == "ForbiddenUserError"
    assert error_of(admin.get(samples_url(job_id), query_string={"attempt": "x"}), 400)
    assert error_of(admin.get(samples_url(job_id), query_string={"attempt": 5}), 400)
    user, name = job_id.split("~")
    assert error_of(admin.get(f"/api/v1/user/{user}/jobs/{name}/tasks/main/7/samples"),
                    404) == "NoTaskError"


def test_an_idle_task_is_flagged_and_a_busy_one_is_not(rig: Rig) -> None:
    tasksamples.set_virtual_utilization(rig.redis, rig.node, {0: 1.0, 1: 2.0})
    job_id, container = running(rig)
    _, admin = api(rig)
    user, name = job_id.split("~")
    node = sampler(rig)

    def flagged() -> int | None:
        series = node.sample()
        detail = admin.get(f"/api/v1/user/{user}/jobs/{name}").json
        since: int | None = detail["taskRoles"]["main"]["taskStatuses"][0]["idleSince"]
        return since if since and any(s.spec.name == "pai_task_gpu_idle_seconds"
                                      for s in series) else None

    try:
        since = wait_for(flagged, "the idle task to be flagged")
        assert since <= now_ms()
        listed = admin.get("/api/v1/idle-gpu-tasks").json
        assert {"username": user, "jobName": name, "attempt": 0, "taskRole": "main",
                "taskIndex": 0, "node": rig.node, "gpus": list(GPUS),
                "idleSince": since} in listed
        key = attempt_task_key(job_id, 0, "main", 0)
        # a round whose docker stats failed for the running container keeps its run
        node.record([], None, frozenset({key}))
        assert rig.redis.hget(keys.idle_tasks(rig.node), key) == str(since)
        tasksamples.set_virtual_utilization(rig.redis, rig.node, {0: 1.0, 1: 60.0})
        series = node.sample()  # one GPU in use: not idle any more
        assert not any(s.spec.name == "pai_task_gpu_idle_seconds" for s in series)
        detail = admin.get(f"/api/v1/user/{user}/jobs/{name}").json
        assert detail["taskRoles"]["main"]["taskStatuses"][0]["idleSince"] is None
        assert rig.store.get_job(job_id).state == JobState.RUNNING  # notify: never stopped
    finally:
        node.close()
        release(container)


def test_an_idle_task_in_a_vc_that_stops_is_stopped_with_the_reason(rig: Rig) -> None:
    accounts = Accounts(rig.store)
    vc = accounts.get_vc("default") or VirtualCluster("default")
    accounts.put_vc(dataclasses.replace(vc, idle_gpu_action="stop"))
    tasksamples.set_virtual_utilization(rig.redis, rig.node, {0: 0.0, 1: 0.0})
    job_id, container = running(rig)
    node = sampler(rig, stop=True)
    try:
        def stopping() -> bool:
            node.sample()
            return rig.store.get_job(job_id).state == JobState.STOPPING
        wait_for(stopping, "the idle job to be stopped")
    finally:
        node.close()
        release(container)

    job = rig.store.get_job(job_id)
    assert "GPUs stayed below 5%" in job.exit_diagnostics
    events = rig.store.get_events(job_id)
    assert any(e["kind"] == "stop-requested" and "idle" in str(e) for e in events)
    assert (STOP_JOB, [job_id]) in rig.messages()
    stops = telemetry.IDLE_GPU_STOPS
    assert rig.redis.hget(stops.key, telemetry.counter_field(stops, {"vc": "default"})) == "1"
    # the task's exit then ends the job STOPPED, the reason kept
    record_task_exit(rig.store, job_id, 0, "main", 0, exit_code=137)
    stopped = rig.store.get_job(job_id)
    assert stopped.state == JobState.STOPPED and "GPUs stayed below" in stopped.exit_diagnostics
    assert "GPUs stayed below" in (rig.store.get_attempts(job_id)[0].reason or "")


def test_a_compacted_job_keeps_no_sample_stream(rig: Rig) -> None:
    """Redis memory per finished job stays what it was: the streams go with compaction."""
    tasksamples.set_virtual_utilization(rig.redis, rig.node, {0: 10.0, 1: 10.0})
    job_id, container = running(rig)
    node = sampler(rig)
    try:
        node.sample()
    finally:
        node.close()
        release(container)
    stream = keys.task_samples(job_id, 0, "main", 0)
    assert rig.redis.xlen(stream) == 1
    record_task_exit(rig.store, job_id, 0, "main", 0, exit_code=0)
    assert rig.store.get_job(job_id).state.is_final

    retention.sweep(rig.store, rig.settings, now=now_ms() + 10**9)

    assert not rig.redis.exists(stream)
    left = sorted(k for k in rig.redis.scan_iter(match="pai:*", count=1000) if job_id in k)
    assert left == [keys.job_archive(job_id)]  # the record is inside the archive
