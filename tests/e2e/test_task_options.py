"""OpenPAI's per-job and per-role task options on the running platform (real
processes, Redis and Docker), on a node of one GPU:
`extras.gangAllocation: false` runs two one-GPU tasks one after the other;
`taskRetryCount` starts a failed task again by itself, in a new container
on the same GPU, before its failure counts for the job."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from bench.live_platform import Platform, platform_env, run_id, wait_for
from tests.support.platform import running_platform


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


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "v2-task-retry.yaml"


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



def test_a_task_that_fails_once_is_retried_by_itself_and_the_job_succeeds(
        one_gpu: Platform, test_image: str, unique: Callable[[str], str]) -> None:
    name = unique("retry")
    # The marker lives in the job's output folder (a mounted dir): the
    # retried container finds what the first one left.
    command = ('if [ -f "$PAI_OUTPUT_DIR/tried" ]; then echo "run 2 on GPU $CUDA_VISIBLE_DEVICES"; '
               'exit 0; fi; touch "$PAI_OUTPUT_DIR/tried"; echo "run 1 fails"; exit 3')
    config = one_role(name, test_image, command, gpus=1)
    config["taskRoles"][0]["taskRetryCount"] = 2
    assert one_gpu.submit(config).status_code == 202

    detail = one_gpu.wait_state(name, timeout=180)

    assert detail["jobStatus"]["state"] == "SUCCEEDED", detail["jobStatus"]
    assert (detail["jobStatus"]["retries"], detail["jobStatus"]["attemptIndex"]) == (0, 0)
    [task] = tasks_of(detail)
    assert (task["taskState"], task["retries"], task["containerExitCode"]) == ("SUCCEEDED", 1, 0)
    assert task["containerGpus"] == [0]
    assert [a["state"] for a in detail["attempts"]] == ["SUCCEEDED"]
    log = one_gpu.log(name, "main")
    assert "run 1 fails" in log and "run 2 on GPU 0" in log, log
    wait_for(lambda: not one_gpu.job_containers(name), what="both containers to be removed")


def test_the_v2_example_retries_each_task_once_as_resources_allow(
        one_gpu: Platform, unique: Callable[[str], str]) -> None:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["name"] = name = unique("v2-retry")
    resp = one_gpu.http.post(f"{one_gpu.url}/api/v2/jobs", data=yaml.safe_dump(job),
                             headers={"Content-Type": "text/yaml"}, timeout=30)
    assert resp.status_code == 202, resp.text
    assert not {"taskRoles.shard.taskRetryCount", "extras.gangAllocation"} & set(
        resp.json().get("ignoredFields") or []), resp.json()

    detail = one_gpu.wait_state(name, timeout=240)

    assert detail["jobStatus"]["state"] == "SUCCEEDED", detail["jobStatus"]
    assert detail["jobStatus"]["retries"] == 0
    shards = detail["taskRoles"]["shard"]["taskStatuses"]
    assert [(t["taskState"], t["retries"]) for t in shards] == [("SUCCEEDED", 1)] * 4
