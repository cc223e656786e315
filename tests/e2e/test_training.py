"""Real training on the running platform: examples/pytorch-digits.json trains
to its stated accuracy, examples/pytorch-ddp.json trains one model with two
tasks that find each other from the PAI_* environment (gloo), and the
environment OpenPAI's own DDP example reads is there.

The DDP test takes its cluster from the `ddp_cluster` fixture, by name: here
"one-host" (both workers on the session's one node). The same example with
its ranks on two hosts is tests/cluster/test_training.py, in the multi-host
tier.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.live_platform import Platform, wait_for

pytestmark = pytest.mark.docker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TRAINING_SECONDS = 600  # the platform's own waits are bounded; this bounds a stuck job
TRAINED = re.compile(r"trained steps (\d+)\.\.(\d+) \(([\d.]+) ms/step\); "
                     r"test accuracy ([\d.]+); parameter sum (-?[\d.]+)")


def example(name: str, job_name: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((EXAMPLES / name).read_text())
    config["jobName"] = job_name
    return config


def output_dir(pai: Platform, name: str) -> Path:
    """The job's default output folder (no outputDir given)."""
    return pai.storage / "alice" / name / "output"


def trained_line(log: str) -> re.Match[str]:
    found = TRAINED.search(log)
    assert found, f"no 'trained steps' line in the log:\n{log[-2000:]}"
    return found


def test_one_task_trains_the_digits_to_its_stated_accuracy(
        platform: Platform, pytorch_image: str, unique: Callable[[str], str]) -> None:
    name = unique("digits")
    config = example("pytorch-digits.json", name)
    platform.submit_accepted(config)

    detail = platform.wait_state(name, timeout=TRAINING_SECONDS)

    log = platform.log(name, "main")
    assert detail["jobStatus"]["state"] == "SUCCEEDED", log[-2000:]
    metrics = json.loads((output_dir(platform, name) / "metrics.json").read_text())
    assert metrics["steps"] == 1500 and metrics["worldSize"] == 1
    assert metrics["accuracy"] >= 0.95  # the example's stated accuracy
    assert (output_dir(platform, name) / "model.pt").stat().st_size > 0
    line = trained_line(log)
    assert (int(line[1]), int(line[2])) == (0, 1500)
    assert float(line[4]) == pytest.approx(metrics["accuracy"], abs=1e-4)
    # every 100 steps a checkpoint was reported; the last before the end was 1400
    assert detail["attempts"][0]["checkpointStep"] == 1400


@pytest.fixture(params=["one-host"])
def ddp_cluster(request: pytest.FixtureRequest, platform: Platform) -> Platform:
    """The platform the DDP job runs on, by name; "one-host": the session's
    single node, so both workers share it (127.0.0.1)."""
    assert request.param == "one-host"
    return platform


def test_two_tasks_train_one_model_with_ddp_from_the_pai_environment(
        ddp_cluster: Platform, pytorch_image: str, unique: Callable[[str], str]) -> None:
    pai, name = ddp_cluster, unique("ddp")
    pai.submit_accepted(example("pytorch-ddp.json", name))

    detail = pai.wait_state(name, timeout=TRAINING_SECONDS)

    logs = [pai.log(name, "worker", index) for index in (0, 1)]
    assert detail["jobStatus"]["state"] == "SUCCEEDED", "\n---\n".join(logs)
    tasks = detail["taskRoles"]["worker"]["taskStatuses"]
    master = f"{tasks[0]['containerIp']}:{tasks[0]['containerPorts']['SynPort']}"
    lines = []
    for index, log in enumerate(logs):
        assert f"rank {index} of 2: master {master}" in log
        lines.append(trained_line(log))
    # Each rank trained on its own half of every batch: only gradients
    # averaged across them give both the same parameters.
    assert lines[0][5] == lines[1][5]
    metrics = json.loads((output_dir(pai, name) / "metrics.json").read_text())
    assert (metrics["worldSize"], metrics["steps"]) == (2, 1000)
    assert metrics["accuracy"] >= 0.95


def test_openpai_ddp_examples_find_their_rank_and_master(
        platform: Platform, unique: Callable[[str], str]) -> None:
    """OpenPAI's cifar10 DDP example reads PAI_TASK_INDEX, PAI_HOST_IP_worker_0
    and PAI_worker_0_SynPort_PORT and nothing else of the platform's."""
    name = unique("openpai-ddp")
    config = platform.config(name, 'echo "rank=$PAI_TASK_INDEX '
                             'master=$PAI_HOST_IP_worker_0:$PAI_worker_0_SynPort_PORT"',
                             tasks=2)
    role = config["taskRoles"][0]
    role["name"] = "worker"
    role["portList"] = [{"label": "SynPort", "beginAt": 0, "portNumber": 1}]
    platform.submit_accepted(config)

    detail = platform.wait_state(name)

    assert detail["jobStatus"]["state"] == "SUCCEEDED"
    worker0 = detail["taskRoles"]["worker"]["taskStatuses"][0]
    master = f"{worker0['containerIp']}:{worker0['containerPorts']['SynPort']}"
    for index in (0, 1):
        assert f"rank={index} master={master}" in platform.log(name, "worker", index)


def test_a_stopped_training_saves_a_checkpoint_in_its_grace(
        platform: Platform, pytorch_image: str, unique: Callable[[str], str]) -> None:
    """A stop sends SIGTERM (then SIGKILL 10 s later): the example saves where
    it is and says so, and the detail shows that step."""
    name = unique("stopped")
    config = example("pytorch-digits.json", name)
    config["taskRoles"][0]["command"] = config["taskRoles"][0]["command"].replace(
        "--steps 1500", "--steps 1000000")
    platform.submit_accepted(config)
    wait_for(lambda: platform.detail(name)["attempts"][0]["checkpointStep"],
             TRAINING_SECONDS, "a first checkpoint")

    assert platform.stop(name).status_code == 202
    detail = platform.wait_state(name, timeout=TRAINING_SECONDS)

    log = platform.log(name, "main")
    stopped = re.search(r"stopping at step (\d+) \(SIGTERM\)", log)
    assert detail["jobStatus"]["state"] == "STOPPED" and stopped, log[-2000:]
    assert detail["attempts"][0]["checkpointStep"] == int(stopped[1])
    saved = sorted((output_dir(platform, name) / "checkpoints").glob("step-*.pt"))
    assert saved[-1].name == f"step-{int(stopped[1]):09d}.pt"
