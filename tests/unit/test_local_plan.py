"""`pai run --local`'s plan (services/localrun/plan.py): the platform's own
validation and environment, every task at 127.0.0.1 on ports of its own."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from services.launcher.environment import task_environment
from services.localrun.plan import describe, plan_run
from services.localrun.runner import container_name, exit_status
from shared.domain.jobspec import InvalidJobConfig
from shared.domain.states import JobState

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ROOT = "/srv/local"


def counting_ports() -> Any:
    return itertools.count(30000).__next__


def distributed() -> dict[str, Any]:
    config: dict[str, Any] = json.loads((EXAMPLES / "distributed.json").read_text())
    return config


def test_every_task_is_at_127_0_0_1_with_ports_of_its_own() -> None:
    plan = plan_run(distributed(), username="alice", storage_root=ROOT, ports=counting_ports())

    ports = [p for t in plan.tasks for ps in t.task.ports.values() for p in ps]
    assert len(ports) == len(set(ports)) == 4
    hosts = {t.environment["PAI_TASK_ROLE_0_HOST_LIST"] for t in plan.tasks}
    assert hosts == {"127.0.0.1:30000,127.0.0.1:30001"}
    assert {t.environment["PAI_CURRENT_CONTAINER_IP"] for t in plan.tasks} == {"127.0.0.1"}


def test_the_environment_is_the_launchers() -> None:
    plan = plan_run(distributed(), username="alice", storage_root=ROOT, ports=counting_ports())
    tasks = [t.task for t in plan.tasks]
    for planned in plan.tasks:
        launcher = task_environment(plan.spec, "alice", tasks, planned.task.role,
                                    planned.task.index, default_fs_uri=ROOT)
        launcher.pop("PAI_PROXY_PATH")  # no proxy serves a local run
        assert planned.environment == launcher


@pytest.mark.parametrize(("change", "field"), [
    pytest.param({"memoryMB": 10}, "taskRoles.0.memoryMB", id="a field the API refuses"),
    pytest.param({"outputDir": "/srv/local/bob/out"}, "outputDir",
                 id="another user's folder, as the API refuses it"),
    pytest.param({"dataDir": "/srv/local/alice/../bob"}, "dataDir", id="a path with .."),
])
def test_the_cluster_refuses_it_so_does_a_local_run(change: dict[str, Any], field: str) -> None:
    config = distributed()
    if "memoryMB" in change:
        config["taskRoles"][0].update(change)
    else:
        config.update(change)
    with pytest.raises(InvalidJobConfig) as refused:
        plan_run(config, username="alice", storage_root=ROOT, ports=counting_ports())
    assert set(refused.value.fields) == {field}


def test_folders_under_the_local_root_and_a_default_output() -> None:
    config = {**distributed(), "dataDir": "$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/data"}
    plan = plan_run(config, username="alice", storage_root=ROOT, ports=counting_ports())
    env = plan.tasks[0].environment
    assert env["PAI_DATA_DIR"] == "/srv/local/alice/data"
    assert env["PAI_OUTPUT_DIR"] == "/srv/local/alice/distributed-ps-worker/output"
    assert env["PAI_DEFAULT_FS_URI"] == ROOT
    mounts = describe(plan, lambda t: "c")["containers"][0]["mounts"]
    assert mounts == [
        {"source": "/srv/local/alice/data", "target": "/srv/local/alice/data", "readOnly": True},
        {"source": "/srv/local/alice/distributed-ps-worker/output",
         "target": "/srv/local/alice/distributed-ps-worker/output", "readOnly": False}]


def test_a_v2_config_is_converted_as_the_api_converts_it() -> None:
    config = {"protocolVersion": 2, "name": "v2-local", "type": "job",
              "prerequisites": [{"type": "dockerimage", "name": "img",
                                 "uri": "pai-test/busybox:latest"}],
              "taskRoles": {"worker": {"instances": 2, "dockerImage": "img",
                                       "resourcePerInstance": {"cpu": 1, "memoryMB": 256,
                                                               "gpu": 0, "ports": {"SynPort": 1}},
                                       "commands": ["echo $PAI_worker_0_SynPort_PORT"]}}}
    plan = plan_run(config, username="alice", storage_root=ROOT, ports=counting_ports())
    assert plan.spec.name == "v2-local" and len(plan.tasks) == 2
    assert plan.tasks[1].environment["PAI_worker_0_SynPort_PORT"] == "30001"


def test_what_a_local_run_does_not_do_is_said() -> None:
    config = {**distributed(), "retryCount": 2}
    config["taskRoles"][1]["gpuNumber"] = 1
    plan = plan_run(config, username="alice", storage_root=ROOT, ports=counting_ports())
    assert any("2 GPU(s)" in note for note in plan.notes)
    assert any("does not retry" in note for note in plan.notes)
    assert {t.environment["NVIDIA_VISIBLE_DEVICES"] for t in plan.tasks} == {"none"}


def test_container_names_are_unique_and_never_a_cluster_tasks() -> None:
    first = plan_run(distributed(), username="alice", storage_root=ROOT, ports=counting_ports())
    again = plan_run(distributed(), username="alice", storage_root=ROOT, ports=counting_ports())
    names = [container_name(p, t) for p in (first, again) for t in p.tasks]
    assert len(set(names)) == 8
    assert all("-local-" in name for name in names)


@pytest.mark.parametrize(("state", "code", "status"), [
    pytest.param(JobState.SUCCEEDED, 0, 0, id="success is 0"),
    pytest.param(JobState.FAILED, 3, 3, id="the task's code"),
    pytest.param(JobState.FAILED, 143, 143, id="killed by SIGTERM"),
    pytest.param(JobState.FAILED, -1, 1, id="no code of its own is 1"),
    pytest.param(JobState.FAILED, 300, 1, id="beyond 255 is 1"),
])
def test_exit_status(state: JobState, code: int, status: int) -> None:
    assert exit_status(state, code) == status
