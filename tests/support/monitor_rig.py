"""A node for the monitor's tests: Redis, Docker, jobs placed there, the
monitors the test starts and the containers it runs, gated until released."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import pytest
import redis
from docker.errors import NotFound
from docker.models.containers import Container

from services.monitor.service import Monitor
from shared.domain.models import Job, Node, Task, TaskPlacement
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.node import execs
from shared.node.containers import TaskRef, container_name, task_labels
from shared.state import passwake
from shared.state.lifecycle import submit_job
from shared.state.placing import commit_placement
from shared.state.store import Store
from tests.support.polling import WAIT_SECONDS

USER = "alice"


# Until the task exits, the container waits for this file (made by `release`).
GATE = "while [ ! -f /tmp/go ]; do sleep 0.05; done"


class Rig:
    """One test's node: Redis, Docker, a job placed there, monitors and containers."""

    def __init__(self, redis_url: str, client: redis.Redis, docker_client: docker.DockerClient,
                 image: str, test_labels: dict[str, str]) -> None:
        self.redis, self.docker, self.image, self.test_labels = client, docker_client, image, \
            test_labels
        self.node = f"node-mon-{uuid.uuid4().hex[:8]}"
        self.settings = Settings(redis_url=redis_url, node_name=self.node, log_max_lines=10_000)
        self.store = Store(client)
        self.store.register_node(Node(name=self.node, ip="127.0.0.1", cpus=64, memory_mb=1 << 20))
        self.celery = make_celery(self.settings, name="pai-monitor-test")
        self.messenger = Messenger(self.celery)
        self._monitors: list[Monitor] = []
        self._watchers: list[tuple[threading.Event, threading.Thread]] = []
        self._containers: list[Container] = []

    # --------------------------------------------------------------- set-up

    def monitor(self, docker_client: docker.DockerClient | None = None) -> Monitor:
        monitor = Monitor(self.settings, self.store, self.messenger,
                          docker_client or self.docker, self.node)
        self._monitors.append(monitor)
        return monitor

    def watch(self, monitor: Monitor) -> None:
        """Run the monitor's event watcher in the background until teardown."""
        stop = threading.Event()
        thread = threading.Thread(target=monitor.watch_events, args=(stop, time.time() - 1),
                                  name="test-monitor-events", daemon=True)
        thread.start()
        self._watchers.append((stop, thread))

    def place(self, *, tasks: int = 1, retry_count: int = 0, memory_mb: int = 128) -> str:
        """Submit a one-role job and place all its tasks on this node: they are LAUNCHING."""
        config = {
            "jobName": f"job-{uuid.uuid4().hex[:8]}", "image": self.image,
            "retryCount": retry_count,
            "taskRoles": [{"name": "main", "taskNumber": tasks, "cpuNumber": 1,
                           "memoryMB": memory_mb, "gpuNumber": 0, "command": "true"}],
        }
        job = submit_job(self.store, USER, config)
        placements = [
            TaskPlacement(role="main", index=i, node=self.node, ip="127.0.0.1", gpus=(),
                          cpus=1, memory_mb=memory_mb, ports={"default": [15000 + i]})
            for i in range(tasks)
        ]
        assert commit_placement(self.store, job.id, version=job.version, attempt=0,
                                placements=placements, launch_deadline_ms=now_ms() + 600_000)
        return job.id

    def run(self, job_id: str, script: str, *, index: int = 0, attempt: int = 0,
            **options: Any) -> Container:
        """Start the task's container as the launcher would (name, labels, host network)."""
        ref = TaskRef(job_id, attempt, "main", index)
        labels = {**task_labels(ref, node=self.node, username=USER, vc="default"),
                  **self.test_labels}
        container: Container = self.docker.containers.run(
            self.image, ["/bin/sh", "-c", script], name=container_name(*_parts(ref)),
            labels=labels, network_mode="host", detach=True, **options)
        self._containers.append(container)
        return container

    def create(self, job_id: str, *, index: int = 0, attempt: int = 0) -> Container:
        """Create the task's container and leave it unstarted (a launcher
        killed between the two)."""
        ref = TaskRef(job_id, attempt, "main", index)
        labels = {**task_labels(ref, node=self.node, username=USER, vc="default"),
                  **self.test_labels}
        container: Container = self.docker.containers.create(
            self.image, ["/bin/sh", "-c", "true"], name=container_name(*_parts(ref)),
            labels=labels, network_mode="host")
        self._containers.append(container)
        return container

    def close(self) -> None:
        for stop, _thread in self._watchers:
            stop.set()
        for _stop, thread in self._watchers:
            thread.join(WAIT_SECONDS)
        for monitor in self._monitors:
            monitor.close()
        self.celery.close()
        for container in self._containers:
            with contextlib.suppress(NotFound):
                container.remove(force=True)

    # ------------------------------------------------------------- reading

    def job(self, job_id: str) -> Job:
        job = self.store.get_job(job_id)
        assert job is not None
        return job

    def task(self, job_id: str, index: int = 0, attempt: int = 0) -> Task:
        tasks = {t.index: t for t in self.store.get_tasks(job_id, attempt)}
        return tasks[index]

    def log(self, job_id: str, index: int = 0, attempt: int = 0) -> list[str]:
        return [line for _id, line in self.store.read_log(job_id, attempt, "main", index)]

    def rang(self) -> bool:
        """Whether the schedulers' doorbell was rung (shared/state/passwake.py)
        since the last look: a pass was asked for. The ring is taken."""
        return self.redis.lpop(passwake.KEY) is not None

    def messages(self) -> list[tuple[str, list[Any]]]:
        """(task name, args) of every message sent to the scheduler, oldest first."""
        sent = []
        for raw in reversed(self.redis.lrange("scheduler", 0, -1)):
            message = json.loads(raw)
            body = json.loads(base64.b64decode(message["body"]))
            sent.append((message["headers"]["task"], body[0]))
        return sent

    def gone(self, container: Container) -> bool:
        try:
            self.docker.containers.get(str(container.id))
        except NotFound:
            return True
        return False

    def exited(self, container: Container) -> Container:
        container.wait(timeout=WAIT_SECONDS)
        container.reload()
        return container


def _parts(ref: TaskRef) -> tuple[str, int, str, int]:
    return ref.job_id, ref.attempt, ref.role, ref.index


def release(container: Container) -> None:
    """Let a container waiting on GATE go on."""
    api = container.client.api
    exec_id = api.exec_create(container.id, ["touch", "/tmp/go"])["Id"]
    output = api.exec_start(exec_id)
    assert execs.exit_code(api, exec_id) == 0, output


@pytest.fixture
def rig(redis_server: str, redis_client: redis.Redis, docker_client: docker.DockerClient,
        test_image: str, test_labels: dict[str, str]) -> Iterator[Rig]:
    rig = Rig(redis_server, redis_client, docker_client, test_image, test_labels)
    try:
        yield rig
    finally:
        rig.close()


class NoNvml:
    """pynvml as on a machine without the NVIDIA driver."""

    class NVMLError(Exception):
        pass

    def nvmlInit(self) -> None:  # pynvml's name
        raise self.NVMLError("NVML Shared Library Not Found")
