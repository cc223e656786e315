"""A task retry (taskRetryCount) as the monitor sees it (real Redis, real
Docker): each container of the task carries its retry in its name and
labels, the first one's exit relaunches the task once (one start message to
the launcher, however often that exit is seen again), and only the current
container's start and exit move the task."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
from docker.models.containers import Container

from services.monitor.observations import ExitObservation
from shared.domain.models import TaskPlacement
from shared.domain.states import JobState, TaskState
from shared.infra.clock import now_ms
from shared.infra.messaging import SCHEDULER_QUEUE, TASK_RELAUNCHED
from shared.node.containers import LABEL_TASK_RETRY, TaskRef, task_labels
from shared.state.lifecycle import submit_job
from shared.state.placing import commit_placement
from tests.support.monitor_rig import USER, Rig, rig

pytestmark = [pytest.mark.docker, pytest.mark.redis]
__all__ = ["rig"]  # the fixture, used by name


def place_retrying(rig: Rig, task_retries: int) -> str:
    """A one-task job whose role has `task_retries`, placed on the rig's node."""
    config: dict[str, Any] = {
        "jobName": f"retry-{uuid.uuid4().hex[:8]}", "image": rig.image,
        "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128,
                       "command": "true", "taskRetryCount": task_retries}]}
    job = submit_job(rig.store, USER, config)
    placement = TaskPlacement(role="main", index=0, node=rig.node, ip="127.0.0.1", gpus=(),
                              cpus=1, memory_mb=128, ports={"default": [15000]})
    assert commit_placement(rig.store, job.id, version=job.version, attempt=0,
                            placements=[placement], launch_deadline_ms=now_ms() + 600_000)
    return job.id


def run(rig: Rig, job_id: str, retry: int, script: str) -> Container:
    """Start the task's container for `retry`, named and labelled as the launcher does."""
    ref = TaskRef(job_id, 0, "main", 0, retry)
    labels = {**task_labels(ref, node=rig.node, username=USER, vc="default"),
              **rig.test_labels}
    container: Container = rig.docker.containers.run(
        rig.image, ["/bin/sh", "-c", script], name=ref.container_name, labels=labels,
        network_mode="host", detach=True)
    rig._containers.append(container)
    return rig.exited(container)


def starts_sent(rig: Rig) -> list[list[Any]]:
    """The args of every relaunch the monitor asked the scheduler for (the
    scheduler, the one sender of starts, sends the node its start)."""
    sent = []
    for raw in rig.redis.lrange(SCHEDULER_QUEUE, 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] == TASK_RELAUNCHED:
            sent.append(json.loads(base64.b64decode(message["body"]))[0])
    return sent


def test_each_retry_has_its_own_container_and_only_the_current_one_counts(rig: Rig) -> None:
    monitor = rig.monitor()
    job_id = place_retrying(rig, 2)
    first = run(rig, job_id, 0, "echo first; exit 3")
    assert LABEL_TASK_RETRY not in first.labels  # a first container is named as before

    report = monitor.handle_exit(first)

    assert report is not None and report.relaunched
    task = rig.task(job_id)
    assert (task.state, task.retries, task.node) == (TaskState.LAUNCHING, 1, rig.node)
    assert starts_sent(rig) == [[job_id, 0, "main", 0]]
    assert rig.gone(first)
    # The first container's exit seen again (a removed-exit event, a
    # reconcile): stale, and no second start.
    assert monitor.handle_removed_exit(TaskRef(job_id, 0, "main", 0), str(first.id),
                                       ExitObservation(3, "exit code 3")) is None
    assert monitor.reconcile().vanished == 0
    assert (rig.task(job_id).state, rig.task(job_id).retries) == (TaskState.LAUNCHING, 1)
    assert len(starts_sent(rig)) == 1

    second = run(rig, job_id, 1, "echo second")
    assert second.name != first.name and second.labels[LABEL_TASK_RETRY] == "1"
    assert monitor.handle_exit(second) is not None

    job = rig.job(job_id)
    assert (job.state, job.retries) == (JobState.SUCCEEDED, 0)
    task = rig.task(job_id)
    assert (task.state, task.retries, task.exit_code) == (TaskState.SUCCEEDED, 1, 0)
    assert rig.log(job_id) == ["first", "second"]  # both containers' output, in order
