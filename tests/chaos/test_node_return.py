"""A node that goes silent is lost: its task fails as the platform's fault,
the job runs again elsewhere uncharged, and when the node comes back the
container of the attempt that moved on is removed (no job runs twice)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from bench.live_platform import wait_for
from shared.node.containers import LABEL_ATTEMPT, LABEL_JOB
from tests.chaos.harness import NODE_SERVICES, USER, Api, ChaosCluster

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.chaos]

LOST_SECONDS = 4.0


@pytest.fixture
def cluster(docker_client: docker.DockerClient, tmp_path: Path) -> Iterator[ChaosCluster]:
    cluster = ChaosCluster(tmp_path, gpus_per_node=2, lost_seconds=LOST_SECONDS,
                           docker_client=docker_client)
    try:
        cluster.start_all({"n0": 26000, "n1": 26500})
        yield cluster
    finally:
        cluster.shutdown()


def test_a_lost_nodes_job_moves_on_and_its_old_container_goes_when_the_node_returns(
        cluster: ChaosCluster, test_image: str) -> None:
    _admin, api = cluster.sign_in()
    job = f"/api/v1/user/{USER[0]}/jobs/long"
    api.until("POST", f"/api/v1/user/{USER[0]}/jobs", (202,), json={
        "jobName": "long", "image": test_image, "retryCount": 0,
        "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 100,
                       "gpuNumber": 1, "command": "sleep 100000"}]})

    def running(attempt: int) -> dict[str, Any] | None:
        detail = api.until("GET", job, (200,)).json()
        task = detail["taskRoles"]["main"]["taskStatuses"][0]
        return task if detail["jobStatus"]["attemptIndex"] == attempt \
            and task["taskState"] == "RUNNING" else None

    first = wait_for(lambda: running(0), 60, "the first attempt to run")
    silent = first["containerNodeName"]
    for service in NODE_SERVICES:  # the node's agents die; its container keeps running
        cluster.kill(f"{service}@{silent}")
    old = [c for c in cluster.containers(silent) if c.labels[LABEL_ATTEMPT] == "0"]
    assert len(old) == 1 and old[0].status == "running"

    second = wait_for(lambda: running(1), 60, "the job to run again on the other node")
    assert second["containerNodeName"] != silent
    detail = api.until("GET", job, (200,)).json()
    assert detail["jobStatus"]["retries"] == 0  # the platform's fault: not charged
    assert detail["jobStatus"]["platformRetries"] == 1
    assert detail["attempts"][0]["platformFailure"] is True
    assert "lost" in detail["attempts"][0]["reason"]

    cluster.restart_down()  # the node comes back
    wait_for(lambda: not [c for c in cluster.containers(silent)
                          if c.labels[LABEL_JOB].endswith("~long")],
             60, "the returned node to remove the container of the attempt that moved on")
    assert running(1) is not None  # the attempt that moved on is untouched

    api.until("PUT", f"{job}/executionType", (200, 202), json={"value": "STOP"})
    assert wait_for(lambda: api.until("GET", job, (200,)).json()["jobStatus"]["state"]
                    == "STOPPED", 60, "the job to stop")


def test_api_until_gives_the_last_answer_when_it_times_out(cluster: ChaosCluster) -> None:
    api = Api(cluster.url, cluster.calls)
    with pytest.raises(Exception, match="the last answer"):
        api.until("GET", "/api/v1/no-such-route", (200,), deadline_s=2)
