"""Graceful shutdown: SIGTERM to each service's own process (as `make down`,
Compose and Kubernetes send it) stops it cleanly, with no worker left
behind, and the platform started again finishes every job."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from bench.live_platform import wait_for
from tests.chaos.harness import NODE_SERVICES, USER, ChaosCluster

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.chaos]


def session_members(sid: int) -> list[int]:
    """Live processes of a session (a service and whatever it started)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    members.append(int(entry))
            except (ProcessLookupError, PermissionError):
                continue
    return members


@pytest.fixture
def cluster(docker_client: docker.DockerClient, tmp_path: Path) -> Iterator[ChaosCluster]:
    cluster = ChaosCluster(tmp_path, gpus_per_node=4, lost_seconds=30,
                           docker_client=docker_client)
    try:
        cluster.start_all({"n0": 27000})
        yield cluster
    finally:
        cluster.shutdown()


def test_sigterm_stops_every_service_cleanly_and_a_restart_finishes_every_job(
        cluster: ChaosCluster, test_image: str) -> None:
    _admin, api = cluster.sign_in()
    names = [f"job-{i}" for i in range(12)]
    for name in names:
        api.until("POST", f"/api/v1/user/{USER[0]}/jobs", (202,), json={
            "jobName": name, "image": test_image,
            "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 100,
                           "gpuNumber": 1, "command": "sleep 1; echo done"}]})

    node = next(iter(cluster.nodes))
    services = ["api", "scheduler"] + [f"{s}@{node}" for s in NODE_SERVICES]
    for service in services:  # in `make down`'s order, each to its own pid only
        proc = cluster.processes.procs.pop(service)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, f"{service} did not exit cleanly on SIGTERM"
        wait_for(lambda pid=proc.pid: not session_members(pid), 30,
                 f"the processes {service} started to end with it")
        cluster.down.add(service)

    cluster.restart_down()
    for name in names:
        resp = wait_for(lambda name=name: (r := api.until(
            "GET", f"/api/v1/user/{USER[0]}/jobs/{name}", (200,))).json()["jobStatus"][
            "state"] in ("SUCCEEDED", "FAILED", "STOPPED") and r, 180, f"{name} to end")
        assert resp.json()["jobStatus"]["state"] == "SUCCEEDED"
