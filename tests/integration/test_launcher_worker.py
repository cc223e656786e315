"""The launcher's Celery side: tasks registered by name, fed from `launcher.<node>`."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import docker
import pytest
import redis
from celery.contrib.testing.worker import start_worker

from services.launcher.run import worker_argv
from services.launcher.worker import create_launcher_app
from shared.domain.models import TaskPlacement
from shared.infra import messaging
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.node.containers import LABEL_NODE, TaskRef
from shared.state.lifecycle import submit_job
from shared.state.placing import commit_placement
from shared.state.store import Store

pytestmark = [pytest.mark.docker, pytest.mark.redis]

WAIT_SECONDS = 30


@pytest.fixture
def settings(redis_server: str, redis_client: redis.Redis, tmp_path: object,
             docker_client: docker.DockerClient, test_image: str) -> Iterator[Settings]:
    node = f"node-{uuid.uuid4().hex[:8]}"
    yield Settings(redis_url=redis_server, node_name=node, node_ip="127.0.0.1",
                   storage_roots=(str(tmp_path),), docker_host=os.environ.get("DOCKER_HOST"))
    for container in docker_client.containers.list(
            all=True, filters={"label": f"{LABEL_NODE}={node}"}):
        container.remove(force=True)


def placed_job(store: Store, settings: Settings, image: str, port: int = 21000) -> str:
    config = {"jobName": f"job-{uuid.uuid4().hex[:8]}", "image": image,
              "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                             "memoryMB": 128, "shmMB": 16, "command": "sleep 300"}]}
    job = submit_job(store, "alice", config)
    assert commit_placement(
        store, job.id, version=job.version, attempt=0,
        placements=[TaskPlacement("main", 0, settings.node_name, "127.0.0.1", (), 1, 128,
                                  {"default": [port]})],
        launch_deadline_ms=now_ms() + 60_000)
    return job.id


def test_worker_argv_listens_on_this_nodes_queue_only() -> None:
    argv = worker_argv("gpu-07")
    assert argv[argv.index("-Q") + 1] == "launcher.gpu-07"
    assert argv[argv.index("-n") + 1] == "launcher@gpu-07"
    assert argv[argv.index("--pool") + 1] == "threads"


def test_tasks_are_registered_by_name_and_call_the_launcher(
        settings: Settings, redis_client: redis.Redis, test_image: str,
        test_labels: dict[str, str]) -> None:
    app, launcher = create_launcher_app(settings, extra_labels=test_labels)
    assert {messaging.START_TASK, messaging.STOP_TASK} <= set(app.tasks)
    store = Store(redis_client)
    store.register_node(launcher.node)
    job_id = placed_job(store, settings, test_image)
    ref = TaskRef(job_id, 0, "main", 0)

    app.tasks[messaging.START_TASK].apply(args=[job_id, "0", "main", "0"]).get()
    container = launcher.runtime.find(ref)
    assert container is not None and container.status == "running"

    app.tasks[messaging.STOP_TASK].apply(args=[job_id, 0, "main", 0]).get()
    container.reload()
    assert container.status == "exited"


def test_a_start_message_on_the_nodes_queue_starts_the_container(
        settings: Settings, redis_client: redis.Redis, test_image: str,
        test_labels: dict[str, str]) -> None:
    app, launcher = create_launcher_app(settings, extra_labels=test_labels)
    store = Store(redis_client)
    store.register_node(launcher.node)
    job_id = placed_job(store, settings, test_image)
    sender = Messenger(make_celery(settings))
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False,
                      queues=[messaging.launcher_queue(settings.node_name)]):
        sender.start_task(settings.node_name, job_id, 0, "main", 0)
        deadline = time.monotonic() + WAIT_SECONDS
        while launcher.runtime.find(TaskRef(job_id, 0, "main", 0)) is None:
            assert time.monotonic() < deadline, "the worker never started the container"
            time.sleep(0.05)


def test_one_batched_start_message_starts_every_task_it_names(
        settings: Settings, redis_client: redis.Redis, test_image: str,
        test_labels: dict[str, str]) -> None:
    """A pass sends one message per node naming all the tasks it placed
    there; each is started (a repeat of the message starts nothing twice)."""
    app, launcher = create_launcher_app(settings, extra_labels=test_labels)
    assert messaging.START_TASKS in app.tasks
    store = Store(redis_client)
    store.register_node(launcher.node)
    jobs = [placed_job(store, settings, test_image, port) for port in (21000, 21001)]
    sender = Messenger(make_celery(settings))
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False,
                      queues=[messaging.launcher_queue(settings.node_name)]):
        sender.start_tasks({settings.node_name: [(job_id, 0, "main", 0) for job_id in jobs]})
        deadline = time.monotonic() + WAIT_SECONDS
        while any(launcher.runtime.find(TaskRef(j, 0, "main", 0)) is None for j in jobs):
            assert time.monotonic() < deadline, "the worker never started both containers"
            time.sleep(0.05)
    launcher.start_tasks([(job_id, 0, "main", 0) for job_id in jobs])  # again: no-op
    containers = [launcher.runtime.find(TaskRef(j, 0, "main", 0)) for j in jobs]
    assert all(c is not None for c in containers)
    assert len({c.id for c in containers if c is not None}) == 2
