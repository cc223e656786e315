"""Checkpoint-aware preemption with real training: examples/pytorch-preemptible.json,
an `oppo` job borrowing GPUs, is preempted twice by the GPUs' owner, saves a
checkpoint in each grace period, resumes from it, and ends having trained
exactly the steps asked, losing at most one checkpoint interval each time.

Its own platform (8 virtual GPUs): `research` is guaranteed 4, so the
trainer's 8-GPU job in `default` borrows 4 of them and is the victim when a
research job wants them.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest

from bench.live_platform import Platform, wait_for
from tests.support.platform import one_node_platform

pytestmark = pytest.mark.docker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS, INTERVAL = 6000, 200  # what the example asks
TRAINING_SECONDS = 600
STARTED = re.compile(r"attempt (\d+): (?:resuming from|starting at) step (\d+)")
STOPPED = re.compile(r"stopping at step (\d+) \(preempted by ([^)]+)\)")
FINISHED = re.compile(r"trained steps (\d+)\.\.(\d+) .*test accuracy ([\d.]+)")


@pytest.fixture(scope="module")
def cluster(redis_server: str, docker_client: docker.DockerClient, test_image: str,
            pytorch_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    with one_node_platform(redis_server, docker_client, test_image,
                           tmp_path_factory.mktemp("checkpoints"), db=6, name="ckpt",
                           port_range="26000-26999") as pai:
        assert pai.admin.put(f"{pai.url}/api/v1/virtual-clusters/research",
                             json={"gpuQuota": 4}, timeout=30).status_code in (200, 201)
        assert pai.admin.put(f"{pai.url}/api/v1/user/alice/virtualClusters",
                             json={"virtualClusters": ["default", "research"]},
                             timeout=30).status_code == 200
        yield pai


@dataclass(frozen=True)
class AttemptLog:
    """What one attempt's log says it did."""

    resumed_from: int
    stopped_at: int | None  # None: it ran to the end
    preempted_by: str | None


def read_attempt(pai: Platform, name: str, attempt: int) -> AttemptLog:
    log = pai.log(name, "main", attempt=attempt)
    started = STARTED.search(log)
    assert started and int(started[1]) == attempt, log[-2000:]
    stopped = STOPPED.search(log)
    return AttemptLog(int(started[2]), int(stopped[1]) if stopped else None,
                      stopped[2] if stopped else None)


def checkpoint_after(pai: Platform, name: str, attempt: int, step: int) -> bool:
    """Whether attempt `attempt` runs and reported a checkpoint past `step`
    (the job detail's checkpointStep, from its PAI_CHECKPOINT_STEP lines)."""
    detail = pai.detail(name)
    if detail["jobStatus"]["state"] != "RUNNING" or detail["jobStatus"]["attemptIndex"] != attempt:
        assert detail["jobStatus"]["state"] in ("WAITING", "RUNNING"), \
            f"{name} is {detail['jobStatus']['state']} before its preemption"
        return False
    reported = detail["attempts"][attempt]["checkpointStep"]
    return reported is not None and reported > step


def preempt(pai: Platform, owner: str) -> None:
    """The GPUs' owner takes them back for a moment."""
    pai.submit_accepted(pai.config(owner, "sleep 1", gpus=4, virtualCluster="research"))
    assert pai.wait_state(owner)["jobStatus"]["state"] == "SUCCEEDED"


def test_training_preempted_twice_resumes_from_its_checkpoints_and_loses_little(
        cluster: Platform, unique: Callable[[str], str]) -> None:
    name, owners = unique("trainer"), [unique("owner"), unique("owner")]
    config: dict[str, Any] = json.loads((EXAMPLES / "pytorch-preemptible.json").read_text())
    config["jobName"] = name
    config["taskRoles"][0]["gpuNumber"] = 8
    cluster.submit_accepted(config)

    resumed = 0
    for attempt, owner in enumerate(owners):
        wait_for(lambda a=attempt, r=resumed: checkpoint_after(cluster, name, a, r),
                 TRAINING_SECONDS, f"attempt {attempt} to report a checkpoint")
        preempt(cluster, owner)
        resumed = cluster.wait_state(name, "RUNNING", timeout=TRAINING_SECONDS)[
            "attempts"][attempt]["checkpointStep"]
    detail = cluster.wait_state(name, timeout=TRAINING_SECONDS)

    status = detail["jobStatus"]
    assert (status["state"], status["retries"], status["preemptions"]) == ("SUCCEEDED", 0, 2)
    runs = [read_attempt(cluster, name, a) for a in range(3)]
    assert runs[0].resumed_from == 0
    lost = [(r.stopped_at or 0) - n.resumed_from for r, n in itertools.pairwise(runs)]
    print(f"runs {runs}; steps lost per preemption {lost}")  # shown with -s, and on a failure
    for attempt, owner in enumerate(owners):
        run = runs[attempt]
        assert run.preempted_by == f"alice~{owner}"
        assert run.stopped_at is not None
        # it saved in its grace: the detail shows that step, the next run resumed there
        assert detail["attempts"][attempt]["checkpointStep"] == run.stopped_at, \
            cluster.log(name, "main", attempt=attempt)[-3000:]
        assert detail["attempts"][attempt]["preemptedBy"] == f"alice~{owner}"
        assert 0 <= lost[attempt] <= INTERVAL, f"attempt {attempt} lost {lost[attempt]} steps"
    final = FINISHED.search(cluster.log(name, "main", attempt=2))
    assert final, "the last attempt did not finish its training"
    assert (int(final[1]), int(final[2])) == (runs[2].resumed_from, STEPS)
    # Each run went on from where the one before saved: the spans each run
    # kept, [resumed_from, next resumed_from), tile 0..STEPS with no gap
    # and no step trained twice into the model.
    starts = [r.resumed_from for r in runs] + [STEPS]
    assert starts == sorted(set(starts)), f"runs resumed at {starts}"
    metrics = json.loads((cluster.storage / "alice" / name / "output" / "metrics.json")
                         .read_text())
    assert metrics["steps"] == STEPS and metrics["accuracy"] >= 0.95
