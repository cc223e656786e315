"""`pai run --local` on the real Docker engine: the job's tasks find each
other, its folders are mounted as on a node, its containers are the
launcher's, and the exit status is the job's."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import docker
import pytest
from click.testing import CliRunner

from bench.live_platform import wait_for
from pai_cli.main import cli
from services.localrun.plan import plan_run
from services.localrun.runner import LOCAL_LABEL, LocalRun, container_name

pytestmark = pytest.mark.docker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def local_containers(client: docker.DockerClient) -> set[str]:
    return {c.id for c in client.containers.list(all=True, filters={"label": LOCAL_LABEL})}


def run_local(tmp_path: Path, config: dict[str, Any] | Path) -> tuple[int, str]:
    job = config if isinstance(config, Path) else tmp_path / "job.json"
    if not isinstance(config, Path):
        job.write_text(json.dumps(config))
    result = CliRunner().invoke(cli, ["run", "--local", "--user", "alice", "--storage",
                                      str(tmp_path / "storage"), str(job)])
    return result.exit_code, result.output


def one_role(name: str, command: str, tasks: int = 1, **extra: Any) -> dict[str, Any]:
    return {"jobName": name, "image": "pai-test/busybox:latest", **extra,
            "taskRoles": [{"name": "main", "taskNumber": tasks, "cpuNumber": 1,
                           "memoryMB": 128, "command": command}]}


def test_the_distributed_example_runs_and_its_workers_find_the_servers(
        tmp_path: Path, docker_client: docker.DockerClient, test_image: str) -> None:
    before = local_containers(docker_client)

    code, output = run_local(tmp_path, EXAMPLES / "distributed.json")

    assert code == 0, output
    assert "[worker[0]] worker 0 got: hello from ps" in output
    assert "[worker[1]] worker 1 got: hello from ps" in output
    assert "distributed-ps-worker: SUCCEEDED" in output
    assert local_containers(docker_client) == before  # the servers were stopped, all removed


def test_the_exit_status_is_the_failing_tasks_and_the_rest_is_stopped(
        tmp_path: Path, docker_client: docker.DockerClient, test_image: str) -> None:
    config = one_role("fails", 'if [ "$PAI_TASK_INDEX" = 0 ]; then exit 7; fi; sleep 600',
                      tasks=2)
    before = local_containers(docker_client)

    code, output = run_local(tmp_path, config)

    assert code == 7, output
    assert "fails: FAILED" in output and "main[0]: exit code 7" in output
    assert local_containers(docker_client) == before


def test_folders_are_mounted_as_on_a_node(tmp_path: Path, test_image: str) -> None:
    data = tmp_path / "storage" / "alice" / "data"
    data.mkdir(parents=True)
    (data / "input.txt").write_text("forty-two\n")
    config = one_role(
        "folders", 'cp "$PAI_DATA_DIR/input.txt" "$PAI_OUTPUT_DIR/copy.txt" && '
        'if touch "$PAI_DATA_DIR/x" 2>/dev/null; then echo data-writable; exit 1; fi; '
        'echo "data read-only"', dataDir="$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/data")

    code, output = run_local(tmp_path, config)

    assert code == 0, output
    assert "data read-only" in output
    copy = tmp_path / "storage" / "alice" / "folders" / "output" / "copy.txt"
    assert copy.read_text() == "forty-two\n"


def test_a_missing_data_folder_is_a_clear_error(tmp_path: Path, test_image: str) -> None:
    config = one_role("no-data", "true", dataDir="$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/none")
    code, output = run_local(tmp_path, config)
    assert code == 1 and "dataDir" in output and "does not exist" in output


def test_its_container_is_the_launchers(tmp_path: Path, docker_client: docker.DockerClient,
                                        test_image: str) -> None:
    plan = plan_run(one_role("confined", "sleep 3"), username="alice",
                    storage_root=str(tmp_path))
    lines: list[str] = []
    status: list[int] = []
    runner = threading.Thread(target=lambda: status.append(
        LocalRun(plan, docker_client, lines.append).run()))
    runner.start()
    name = container_name(plan, plan.tasks[0])

    def running() -> Any:
        return next(iter(docker_client.containers.list(
            filters={"name": name, "status": "running"})), None)

    container = wait_for(running, 60, "the local task to run")
    host = container.attrs["HostConfig"]

    assert host["NetworkMode"] == "host" and host["Init"] is True
    assert "no-new-privileges" in host["SecurityOpt"] and "NET_RAW" in host["CapDrop"]
    assert host["Privileged"] is False and host["PidsLimit"] > 0
    assert host["Memory"] == host["MemorySwap"] == 128 * 1024 * 1024
    env = dict(item.split("=", 1) for item in container.attrs["Config"]["Env"])
    assert env["PAI_JOB_NAME"] == "confined" and env["PAI_CURRENT_CONTAINER_IP"] == "127.0.0.1"
    runner.join(60)
    assert status == [0]
