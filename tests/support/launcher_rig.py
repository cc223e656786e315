"""A node for the launcher's tests: its settings, store, launcher, storage
roots and the containers it starts, removed at the end."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import docker
import pytest
import redis
from docker.models.containers import Container

from services.launcher.calls import launcher_calls
from services.launcher.inventory import discover_node
from services.launcher.runtime import DockerRuntime
from services.launcher.service import Launcher
from shared.domain.jobspec import validate_job_config
from shared.domain.models import Job, Node, Task, TaskPlacement
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.node.containers import LABEL_JOB, LABEL_NODE, TaskRef
from shared.state.accounts import Accounts
from shared.state.lifecycle import mark_task_running, submit_job
from shared.state.placing import commit_placement
from shared.state.store import Store
from tests.support.threads import looping

WAIT_SECONDS = 30
USER = "alice"


@dataclass
class Rig:
    settings: Settings
    store: Store
    launcher: Launcher
    node: Node
    docker: docker.DockerClient
    image: str
    storage: Path

    def config(self, command: str = "sleep 300", **overrides: Any) -> dict[str, Any]:
        role = {"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256,
                "shmMB": 32, "command": command, **overrides.pop("role", {})}
        name = overrides.pop("jobName", f"job-{uuid.uuid4().hex[:8]}")
        return {"jobName": name, "image": self.image, "taskRoles": [role], **overrides}

    def submit(self, config: dict[str, Any], *, validate: bool = True,
               gpus: dict[tuple[str, int], tuple[int, ...]] | None = None,
               node: str | None = None) -> Job:
        """Store the job and place every task on this node (as the scheduler does)."""
        if validate:
            config = validate_job_config(config, username=USER,
                                         storage_roots=self.settings.storage_roots).config
        job = submit_job(self.store, USER, config)
        if node is not None:
            self.store.register_node(replace(self.node, name=node))
        port = 20000
        placements = []
        for role in config["taskRoles"]:
            for index in range(role["taskNumber"]):
                ports = {"default": [port]}
                for extra in role.get("portList") or []:
                    ports[extra["label"]] = list(
                        range(port + 1, port + 1 + extra["portNumber"]))
                port += 10
                placements.append(TaskPlacement(
                    role=role["name"], index=index, node=node or self.node.name,
                    ip=self.node.ip, gpus=(gpus or {}).get((role["name"], index), ()),
                    cpus=role["cpuNumber"], memory_mb=role["memoryMB"], ports=ports))
        assert commit_placement(self.store, job.id, version=job.version, attempt=0,
                                placements=placements, launch_deadline_ms=now_ms() + 60_000)
        return job

    def container(self, job: Job, role: str = "main", index: int = 0,
                  attempt: int = 0) -> Container | None:
        return self.launcher.runtime.find(TaskRef(job.id, attempt, role, index))

    def containers_of(self, job: Job) -> list[Container]:
        return self.docker.containers.list(all=True, filters={"label": f"{LABEL_JOB}={job.id}"})

    def task(self, job: Job, role: str = "main", index: int = 0, attempt: int = 0) -> Task:
        tasks = {t.key: t for t in self.store.get_tasks(job.id, attempt)}
        return tasks[f"{role}:{index}"]

    def job(self, job: Job) -> Job:
        fresh = self.store.get_job(job.id)
        assert fresh is not None
        return fresh


@pytest.fixture
def rig(redis_server: str, redis_client: redis.Redis, docker_client: docker.DockerClient,
        test_image: str, test_labels: dict[str, str], tmp_path: Path) -> Iterator[Rig]:
    storage = tmp_path / "storage"
    storage.mkdir()
    node_name = f"node-{uuid.uuid4().hex[:8]}"
    settings = Settings(redis_url=redis_server, node_name=node_name, node_ip="127.0.0.1",
                        node_virtual_gpus=2, node_cpus=64, node_memory_mb=65536,
                        storage_roots=(str(storage),),
                        heartbeat_seconds=0.05)
    store = Store(redis_client)
    node = discover_node(settings, docker_client)
    store.register_node(node)  # the scheduler places only on registered nodes
    runtime = DockerRuntime(docker_client, settings, extra_labels=test_labels)
    messenger = Messenger(make_celery(settings))
    launcher = Launcher(settings, store, messenger, runtime, node)
    try:
        yield Rig(settings, store, launcher, node, docker_client, test_image, storage)
    finally:
        for container in docker_client.containers.list(
                all=True, filters={"label": f"{LABEL_NODE}={node_name}"}):
            container.remove(force=True)


JOB = "debugme"


def run_task(store: Store, launcher: Launcher, image: str, *, owner: str = "alice",
             name: str = JOB) -> str:
    """A job of one task placed on the launcher's node, its container started
    and the task RUNNING; the job's id."""
    user = Accounts(store).get_user(owner)
    assert user is not None
    config = {"jobName": name, "image": image,
              "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128,
                             "shmMB": 16, "command": "sleep 300"}]}
    job = submit_job(store, owner, config, user_id=user.uid)
    node = launcher.node.name
    assert commit_placement(
        store, job.id, version=job.version, attempt=0,
        placements=[TaskPlacement("main", 0, node, "127.0.0.1", (), 1, 128,
                                  {"default": [21000]})],
        launch_deadline_ms=now_ms() + 60_000)
    launcher.start_task(job.id, 0, "main", 0)
    container = launcher.runtime.find(TaskRef(job.id, 0, "main", 0))
    assert container is not None and container.status == "running"
    assert mark_task_running(store, job.id, 0, "main", 0, str(container.id))
    return job.id


@contextmanager
def serving_calls(launcher: Launcher) -> Iterator[Launcher]:
    """The launcher's feed of calls (execs, terminal sessions) on a thread of
    its own, as pai-launcher runs it."""
    with looping(launcher_calls(launcher, block_ms=100).run):
        yield launcher
