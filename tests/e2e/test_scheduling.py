"""The scheduling policy on the running platform: guarantees, borrowing,
graceful preemption and no starvation, with real processes, Redis and Docker.

Its own platform (8 virtual GPUs): the `research` VC is guaranteed 4, so
`default` is guaranteed the other 4 and borrows beyond them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from bench.live_platform import Platform, wait_for
from tests.support.platform import gate, one_node_platform, open_gate

pytestmark = pytest.mark.docker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def preemptible(name: str, gpus: int) -> dict[str, Any]:
    """examples/preemptible.json: an `oppo` job that saves its step in its
    output folder, keeps the preemption notice, and resumes where it was."""
    config: dict[str, Any] = json.loads((EXAMPLES / "preemptible.json").read_text())
    config["jobName"] = name
    config["taskRoles"][0]["gpuNumber"] = gpus
    return config


def saved_a_step(cluster: Platform, name: str) -> bool:
    return (cluster.storage / "alice" / name / "output" / "step").exists()


@pytest.fixture(scope="module")
def cluster(redis_server: str, docker_client: docker.DockerClient, test_image: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    with one_node_platform(redis_server, docker_client, test_image,
                           tmp_path_factory.mktemp("scheduling"), db=2, name="sched",
                           port_range="23000-23999") as pai:
        admin = pai.admin
        assert admin.put(f"{pai.url}/api/v1/virtual-clusters/research",
                         json={"gpuQuota": 4}, timeout=30).status_code in (200, 201)
        assert admin.put(f"{pai.url}/api/v1/user/alice/virtualClusters",
                         json={"virtualClusters": ["default", "research"]},
                         timeout=30).status_code == 200
        yield pai


def passed_over(pai: Platform, name: str) -> bool:
    """Whether a pass has given job `name` its waiting reason ("Queued" until then)."""
    status = pai.detail(name)["jobStatus"]
    return bool(status["waiting"]) and status["waiting"]["reason"] != "Queued"


def job(pai: Platform, name: str, command: str, gpus: int, **extra: Any) -> dict[str, Any]:
    return pai.config(name, command, gpus=gpus, **extra)


def test_a_borrowing_job_is_preempted_for_the_owner_and_runs_again_uncharged(
        cluster: Platform, unique: Callable[[str], str]) -> None:
    lender, owner = unique("lender"), unique("owner")
    cluster.submit_accepted(preemptible(lender, 8))
    running = cluster.wait_state(lender, "RUNNING")
    assert running["jobStatus"]["mode"] == "borrowed"  # oppo, and beyond default's 4
    wait_for(lambda: saved_a_step(cluster, lender), what="the first run to save a step")

    cluster.submit_accepted(job(cluster, owner, "sleep 1", 4, virtualCluster="research"))

    done = cluster.wait_state(owner)
    assert done["jobStatus"]["state"] == "SUCCEEDED"
    assert done["jobStatus"]["mode"] == "guaranteed"
    # the victim saved its state on the notice, then ran again and succeeded
    notice = (cluster.storage / "alice" / lender / "output" / "notice").read_text()
    assert "PAI_PREEMPTED=1" in notice and f"PAI_PREEMPTED_BY=alice~{owner}" in notice
    finished = cluster.wait_state(lender)
    status = finished["jobStatus"]
    assert (status["state"], status["retries"], status["preemptions"]) == ("SUCCEEDED", 0, 1)
    first = finished["attempts"][0]
    assert (first["reason"], first["preemptedBy"]) == (f"Preempted by alice~{owner}",
                                                       f"alice~{owner}")
    log = cluster.log(lender, "main")
    assert "resuming at step" in log and "finished at step 10" in log
    # the owner started only once the victim had stopped: no GPU held twice
    owner_task = done["taskRoles"]["main"]["taskStatuses"][0]
    assert owner_task["startedTime"] >= first["completedTime"]


def test_a_big_job_is_not_starved_by_small_jobs_submitted_after_it(
        cluster: Platform, unique: Callable[[str], str]) -> None:
    early = [unique("early") for _ in range(4)]
    for name in early:  # they hold 4 of the 8 GPUs until the test opens their gates
        cluster.submit_accepted(job(cluster, name, gate(), 1))
    for name in early:
        cluster.wait_state(name, "RUNNING")
    big = unique("big")
    cluster.submit_accepted(job(cluster, big, "sleep 1", 8))
    late = []
    for _ in range(6):  # a stream behind it, each of which would fit now
        late.append(unique("late"))
        cluster.submit_accepted(job(cluster, late[-1], "sleep 1", 1))

    for name in (big, *late):  # a pass has looked at every one of them
        wait_for(lambda name=name: passed_over(cluster, name), what=f"a pass's reason for {name}")
    waiting = cluster.detail(big)["jobStatus"]
    assert waiting["state"] == "WAITING" and waiting["waiting"]["position"] == 1
    assert all(cluster.detail(name)["jobStatus"]["state"] == "WAITING" for name in late)
    for name in early:
        open_gate(cluster, name)

    started = cluster.wait_state(big)["taskRoles"]["main"]["taskStatuses"][0]["startedTime"]
    for name in late:
        detail = cluster.wait_state(name)
        assert detail["jobStatus"]["state"] == "SUCCEEDED"
        assert detail["taskRoles"]["main"]["taskStatuses"][0]["startedTime"] > started, \
            f"{name}, submitted after the big job, started before it"


def test_a_drained_node_gets_nothing_new_and_its_jobs_come_back_uncharged(
        cluster: Platform, unique: Callable[[str], str]) -> None:
    node_url = f"{cluster.url}/api/v1/nodes/{cluster.node}"
    running, later = unique("drained"), unique("after-drain")
    cluster.submit_accepted(preemptible(running, 1))
    cluster.wait_state(running, "RUNNING")
    wait_for(lambda: saved_a_step(cluster, running), what="the first run to save a step")
    try:
        assert cluster.admin.put(node_url, json={"drain": True, "reason": "maintenance"},
                                 timeout=30).status_code == 200
        requeued = wait_for(lambda: (d := cluster.detail(running))["attempts"][0]["reason"]
                            and d, what="the drained job's attempt to end")
        assert requeued["attempts"][0]["reason"] == f"Preempted by drain of node {cluster.node}"
        wait_for(lambda: cluster.admin.get(node_url, timeout=30).json()["state"] == "DRAINED",
                 what="the node to be empty")
        cluster.submit_accepted(job(cluster, later, "true", 1))
        # "Queued" until a pass has looked at it: wait for the pass's reason
        waiting = wait_for(lambda: (status := cluster.detail(later)["jobStatus"])["waiting"]
                           and status["waiting"]["reason"] != "Queued" and status,
                           what="the new job's waiting reason from a pass")
        assert waiting["state"] == "WAITING"
        assert waiting["waiting"]["reason"] == "NoNodes"
        assert not cluster.job_containers(later)
    finally:
        cluster.admin.put(node_url, json={"schedulable": True}, timeout=30)
    for name in (running, later):
        done = cluster.wait_state(name)["jobStatus"]
        assert (done["state"], done["retries"]) == ("SUCCEEDED", 0)
