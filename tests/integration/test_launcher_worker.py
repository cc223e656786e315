"""The launcher's two inputs: Celery tasks registered by name, fed from
`launcher.<node>`, and the feed of starts from the node's stream."""

from __future__ import annotations

import os
import queue
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import pytest
import redis

from services.launcher.run import worker_argv
from services.launcher.starts import StartFeed
from services.launcher.worker import create_launcher_app
from shared.domain.models import TaskPlacement
from shared.infra import messaging
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.node.containers import LABEL_NODE, TaskRef
from shared.state import starts
from shared.state.lifecycle import submit_job
from shared.state.placing import commit_placement
from shared.state.starts import StartReader, StartRef
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
    assert messaging.STOP_TASK in set(app.tasks)
    assert not any("start" in name for name in app.tasks if name.startswith("pai."))
    store = Store(redis_client)
    store.register_node(launcher.node)
    job_id = placed_job(store, settings, test_image)
    ref = TaskRef(job_id, 0, "main", 0)
    launcher.start_task(job_id, 0, "main", 0)
    container = launcher.runtime.find(ref)
    assert container is not None and container.status == "running"

    app.tasks[messaging.STOP_TASK].apply(args=[job_id, 0, "main", 0]).get()
    container.reload()
    assert container.status == "exited"


def test_starts_sent_to_the_nodes_stream_start_every_task_once(
        settings: Settings, redis_client: redis.Redis, test_image: str,
        test_labels: dict[str, str]) -> None:
    """A pass sends one entry per node naming all the tasks it placed there;
    the feed starts each, and the same entry sent again starts nothing twice."""
    _, launcher = create_launcher_app(settings, extra_labels=test_labels)
    store = Store(redis_client)
    store.register_node(launcher.node)
    jobs = [placed_job(store, settings, test_image, port) for port in (21000, 21001)]
    returned: queue.Queue[StartRef] = queue.Queue()

    def start(*task: Any) -> None:
        launcher.start_task(*task)
        returned.put(task)

    feed = StartFeed(StartReader(redis_client, settings.node_name), start, block_ms=100)
    stop = threading.Event()
    thread = threading.Thread(target=feed.run, args=(stop,), daemon=True)
    thread.start()
    try:
        for _ in range(2):
            starts.send(redis_client, {settings.node_name: [(j, 0, "main", 0) for j in jobs]})
        assert sorted(returned.get(timeout=WAIT_SECONDS) for _ in range(4)) == \
            sorted([(j, 0, "main", 0) for j in jobs] * 2)
    finally:
        stop.set()
        thread.join(WAIT_SECONDS)
    containers = [launcher.runtime.find(TaskRef(j, 0, "main", 0)) for j in jobs]
    assert all(c is not None and c.status == "running" for c in containers)
    assert len({c.id for c in containers if c is not None}) == 2
    assert len(launcher.runtime.client.containers.list(
        all=True, filters={"label": f"{LABEL_NODE}={settings.node_name}"})) == 2
