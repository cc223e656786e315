"""OpenPAI's per-job and per-role task options on the running platform (real
processes, Redis and Docker), on a node of one GPU:
`extras.gangAllocation: false` runs two one-GPU tasks one after the other."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import docker
import pytest

from bench.live_platform import Platform, platform_env, run_id
from tests.e2e.conftest import running_platform


@pytest.fixture(scope="module")
def one_gpu(redis_server: str, docker_client: docker.DockerClient, test_image: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    run_dir = tmp_path_factory.mktemp("one-gpu")
    env = platform_env(redis_server.rsplit("/", 1)[0] + "/5", run_dir,
                       node=f"one-gpu-{run_id()}", gpus=1, port_range="29000-29999",
                       admin=("root", "root-password"),
                       extra_env={"PAI_HEARTBEAT_SECONDS": "1",
                                  "PAI_LAUNCH_TIMEOUT_SECONDS": "20"})
    with running_platform(env, run_dir, docker_client, test_image) as pai:
        yield pai


def one_role(name: str, image: str, command: str, *, tasks: int = 1, gpus: int = 0,
             **extra: Any) -> dict[str, Any]:
    return {"jobName": name, "image": image,
            "taskRoles": [{"name": "main", "taskNumber": tasks, "cpuNumber": 1,
                           "memoryMB": 128, "gpuNumber": gpus, "command": command}], **extra}


def tasks_of(detail: dict[str, Any]) -> list[dict[str, Any]]:
    statuses: list[dict[str, Any]] = detail["taskRoles"]["main"]["taskStatuses"]
    return sorted(statuses, key=lambda t: t["taskIndex"])


def test_a_job_without_gang_allocation_runs_its_tasks_one_after_another(
        one_gpu: Platform, test_image: str, unique: Callable[[str], str]) -> None:
    name = unique("loose")
    config = one_role(name, test_image, "echo task $PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX",
                      tasks=2, gpus=1, extras={"gangAllocation": False})
    # As a gang the same job could never run here: refused at submit.
    gang = one_role(unique("gang"), test_image, "true", tasks=2, gpus=1)
    assert one_gpu.submit(gang).status_code == 400
    assert one_gpu.submit(config).status_code == 202

    detail = one_gpu.wait_state(name, timeout=180)

    assert detail["jobStatus"]["state"] == "SUCCEEDED", detail["jobStatus"]
    assert detail["jobStatus"]["retries"] == 0
    first, second = tasks_of(detail)
    assert first["taskState"] == second["taskState"] == "SUCCEEDED"
    assert first["containerGpus"] == second["containerGpus"] == [0]
    # The one GPU went to the second task only once the first had ended.
    earlier, later = sorted((first, second), key=lambda t: t["launchedTime"])
    assert later["launchedTime"] >= earlier["completedTime"]
    for task in (first, second):
        assert f"task {task['taskIndex']}" in one_gpu.log(name, "main", task["taskIndex"])

